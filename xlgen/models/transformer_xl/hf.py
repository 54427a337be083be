"""Transformer-XL and Hugging Face (transformers 4.34.1): loading TransfoXLLMHeadModel / TransfoXLModel checkpoints
(`from_hf`, the `xlgen.from_pretrained` loader). HF weights map onto xlgen's parameter paths (`hf_to_xlgen_params`)
and go into the module through `xlgen.models.params.materialize` (`model.from_params`); the result is called with
HF's convention through `pretrained.TransfoXLPretrained`.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from xlgen.models.transformer_xl.model import TransformerXLConfig, from_params
from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained


def hf_to_xlgen_params(
    config: TransformerXLConfig, weights: Dict[str, np.ndarray], *, prefix: str, head: bool
) -> Dict[str, np.ndarray]:
    """Map HF state-dict arrays onto xlgen parameter paths ("layers/3/attn/q/kernel", unscanned layout).

    HF keeps q/k/v in one `qkv_net` [3·n·d_head, d_model] (torch Linear: out x in) and projections as
    [d_proj, d_emb]; we store kernels input-first with heads split ([d_model, n, d_head]) and projections as
    [d_emb, d_proj]. Tied output tables / projections are not stored by us; if the HF file kept only the
    output copy of a tied tensor (safetensors de-duplication), it is used for the input side.
    """
    c = config
    n, dh, d = c.n_head, c.d_head, c.d_model

    def get(*keys):
        for k in keys:
            if k in weights:
                return np.asarray(weights[k], np.float32)
        raise KeyError(f"HF Transformer-XL weights: missing {keys[0]!r} (have e.g. {sorted(weights)[:6]})")

    out: Dict[str, np.ndarray] = {}
    t = prefix + "word_emb."
    n_tables = 1 if c.div_val == 1 else len(c.cutoffs) + 1
    tie_projs = c.resolved_tie_projs
    for i in range(n_tables):
        alt = [f"crit.out_layers.{i}.weight"] if head and c.tie_word_embeddings else []
        out[f"embedding/tables/{i}"] = get(f"{t}emb_layers.{i}.weight", *alt)
        needs_proj = c.div_val != 1 or c.embed_dim != d
        if needs_proj:
            alt = [
                f"crit.out_projs.{k}"
                for k in range(len(tie_projs))
                if head and tie_projs[k] and (k == i or c.div_val == 1)
            ]
            out[f"embedding/projs/{i}"] = get(f"{t}emb_projs.{i}", *alt).T
    if not c.untie_r:
        out["r_w_bias"] = get(prefix + "r_w_bias")
        out["r_r_bias"] = get(prefix + "r_r_bias")
    for layer in range(c.n_layer):
        p, q = f"{prefix}layers.{layer}.", f"layers/{layer}/"
        qkv = get(p + "dec_attn.qkv_net.weight")  # [3·n·dh, d]
        if qkv.shape != (3 * n * dh, d):
            raise ValueError(f"{p}dec_attn.qkv_net.weight has shape {qkv.shape}; config implies {(3 * n * dh, d)}")
        for j, name in enumerate("qkv"):
            out[q + f"attn/{name}/kernel"] = qkv[j * n * dh : (j + 1) * n * dh].T.reshape(d, n, dh)
        out[q + "attn/r/kernel"] = get(p + "dec_attn.r_net.weight").T.reshape(d, n, dh)
        out[q + "attn/o/kernel"] = get(p + "dec_attn.o_net.weight").T.reshape(n, dh, d)
        out[q + "attn/layer_norm/scale"] = get(p + "dec_attn.layer_norm.weight")
        out[q + "attn/layer_norm/bias"] = get(p + "dec_attn.layer_norm.bias")
        if c.untie_r:
            out[q + "attn/r_w_bias"] = get(p + "dec_attn.r_w_bias")
            out[q + "attn/r_r_bias"] = get(p + "dec_attn.r_r_bias")
        out[q + "ff/layer_1/kernel"] = get(p + "pos_ff.CoreNet.0.weight").T
        out[q + "ff/layer_1/bias"] = get(p + "pos_ff.CoreNet.0.bias")
        out[q + "ff/layer_2/kernel"] = get(p + "pos_ff.CoreNet.3.weight").T
        out[q + "ff/layer_2/bias"] = get(p + "pos_ff.CoreNet.3.bias")
        out[q + "ff/layer_norm/scale"] = get(p + "pos_ff.layer_norm.weight")
        out[q + "ff/layer_norm/bias"] = get(p + "pos_ff.layer_norm.bias")
    if head:
        for i in range(n_tables):
            out[f"softmax/biases/{i}"] = get(f"crit.out_layers.{i}.bias")
            if not c.tie_word_embeddings:
                out[f"softmax/tables/{i}"] = get(f"crit.out_layers.{i}.weight")
        for k in range(len(c.cutoffs) + 1):
            needs_proj = c.div_val != 1 or c.embed_dim != d
            if needs_proj and not tie_projs[k]:
                out[f"softmax/projs/{k}"] = get(f"crit.out_projs.{k}").T
        if c.cutoffs:
            out["softmax/cluster_weight"] = get("crit.cluster_weight")
            out["softmax/cluster_bias"] = get("crit.cluster_bias")
    return out


def from_hf(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray], kwargs: Dict[str, Any]) -> TransfoXLPretrained:
    """`xlgen.from_pretrained` hook for HF `transfo-xl` directories (TransfoXLLMHeadModel or TransfoXLModel).

    `kwargs` override config fields, e.g. `mem_len=1600, same_length=True, clamp_len=1000` (evaluation
    settings) or `scan_layers=True, dtype="bfloat16"`.
    """
    config = TransformerXLConfig.from_hf(hf_config, **dict(kwargs))
    if any(k.startswith("transformer.") for k in weights):
        prefix, head = "transformer.", True
    else:
        prefix, head = "", any(k.startswith("crit.") for k in weights)
    archs = hf_config.get("architectures") or []
    if any(a not in ("TransfoXLLMHeadModel", "TransfoXLModel") for a in archs):
        raise ValueError(f"config.json: architectures={archs}: xlgen loads TransfoXLLMHeadModel and TransfoXLModel")
    params = hf_to_xlgen_params(config, weights, prefix=prefix, head=head)
    module = from_params(config, params, strict=head)
    return TransfoXLPretrained(module, has_head=head)
