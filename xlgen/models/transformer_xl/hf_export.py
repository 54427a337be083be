"""Transformer-XL -> Hugging Face `TransfoXLLMHeadModel` (transformers 4.34.1): the inverse of
`transformer_xl.hf.hf_to_xlgen_params` / `TransformerXLConfig.from_hf`.

q/k/v kernels `[d_model, n, d_head]` go back into one `qkv_net.weight` `[3·n·d_head, d_model]` (torch Linear,
out x in); projections `[d_emb, d_proj]` become HF's `[d_proj, d_emb]`. Tied tensors are written out in full at
both places (HF re-ties them on load; nothing depends on it), and `tie_projs` is written as xlgen resolves it.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from xlgen.models.params import flat_params
from xlgen.models.transformer_xl.model import TransformerXLLM, vocab_rows


def hf_config(config) -> Dict[str, Any]:
    """HF `TransfoXLConfig` dict of a `TransformerXLConfig` (architecture fields only)."""
    c = config
    tie = list(c.resolved_tie_projs)
    return {
        "architectures": ["TransfoXLLMHeadModel"],
        "model_type": "transfo-xl",
        "vocab_size": int(c.vocab_size),
        "cutoffs": [int(x) for x in c.cutoffs],
        "d_model": int(c.d_model),
        "d_embed": int(c.embed_dim),
        "n_head": int(c.n_head),
        "d_head": int(c.d_head),
        "d_inner": int(c.d_inner),
        "div_val": int(c.div_val),
        "pre_lnorm": False,
        "n_layer": int(c.n_layer),
        "mem_len": int(c.mem_len),
        "clamp_len": int(c.clamp_len),
        "same_length": bool(c.same_length),
        "proj_share_all_but_first": bool(all(tie[1:])) if len(tie) > 1 else False,
        "tie_projs": tie,  # HF's PretrainedConfig keeps the stored list (overrides the derived one)
        "attn_type": 0,
        "sample_softmax": -1,
        "adaptive": True,
        "dropout": float(c.dropout),
        "dropatt": float(c.dropatt),
        "untie_r": bool(c.untie_r),
        "init": "normal",
        "init_range": 0.01,
        "proj_init_std": float(c.proj_init_std),
        "init_std": float(c.init_std),
        "layer_norm_epsilon": float(c.layer_norm_epsilon),
        "tie_word_embeddings": bool(c.tie_word_embeddings),
        "eos_token_id": 0,
    }


def _inv_freq(d_model: int) -> np.ndarray:
    """HF's `pos_emb.inv_freq` buffer, 1 / 10000^(2i/d): computed by torch when it is installed (bit-identical to
    what HF builds), else in NumPy float32 (within 1 ulp)."""
    try:
        import torch

        return (1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))).numpy()
    except ImportError:  # pragma: no cover - depends on the environment
        steps = np.arange(0.0, d_model, 2.0, dtype=np.float32) / np.float32(d_model)
        return (np.float32(1) / np.float32(10000) ** steps).astype(np.float32)


def to_hf(module: TransformerXLLM) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(HF config, `TransfoXLLMHeadModel` state dict) of a `TransformerXLLM`."""
    c = module.config
    if c.output_layer not in ("adaptive", "softmax"):
        raise ValueError(
            f"model.output_layer={c.output_layer!r}: HF TransfoXLLMHeadModel has the (adaptive) softmax only, so "
            "this model has no HF equivalent"
        )
    p = vocab_rows(c, flat_params(module, sep="/", scanned=("layers",) if c.scan_layers else ()), stored=False)
    if "embedding/u" in p:  # spectrum control: E = U diag(sigma) V^T is an ordinary (tied) table for HF
        from xlgen.models.output_layers import collapse_spectral_params

        p = {k: np.asarray(v, np.float32) for k, v in collapse_spectral_params(p).items()}
    if "embedding/proj" in p:
        p["embedding/projs/0"] = p.pop("embedding/proj")
    if c.output_layer == "softmax":  # output_layers.Softmax: one table (+ projection) and a bias
        p["softmax/biases/0"] = p.pop("softmax/bias")
        if "softmax/table" in p:
            p["softmax/tables/0"] = p.pop("softmax/table")
        if "softmax/proj" in p:
            p["softmax/projs/0"] = p.pop("softmax/proj")
    n, dh, d = c.n_head, c.d_head, c.d_model
    sd: Dict[str, np.ndarray] = {}
    t = "transformer."
    n_tables = 1 if c.div_val == 1 else len(c.cutoffs) + 1
    needs_proj = c.div_val != 1 or c.embed_dim != d
    tie_projs = c.resolved_tie_projs
    if c.output_layer == "softmax":  # one projection, tied together with the table
        tie_projs = (bool(c.tie_word_embeddings),)
    for i in range(n_tables):
        sd[f"{t}word_emb.emb_layers.{i}.weight"] = p[f"embedding/tables/{i}"]
        if needs_proj:
            sd[f"{t}word_emb.emb_projs.{i}"] = p[f"embedding/projs/{i}"].T
    sd[f"{t}pos_emb.inv_freq"] = _inv_freq(d)
    if not c.untie_r:
        sd[f"{t}r_w_bias"], sd[f"{t}r_r_bias"] = p["r_w_bias"], p["r_r_bias"]
    for layer in range(c.n_layer):
        h, q = f"{t}layers.{layer}.", f"layers/{layer}/"
        qkv = [p[q + f"attn/{name}/kernel"].reshape(d, n * dh).T for name in "qkv"]
        sd[h + "dec_attn.qkv_net.weight"] = np.concatenate(qkv, axis=0)
        sd[h + "dec_attn.r_net.weight"] = p[q + "attn/r/kernel"].reshape(d, n * dh).T
        sd[h + "dec_attn.o_net.weight"] = p[q + "attn/o/kernel"].reshape(n * dh, d).T
        sd[h + "dec_attn.layer_norm.weight"] = p[q + "attn/layer_norm/scale"]
        sd[h + "dec_attn.layer_norm.bias"] = p[q + "attn/layer_norm/bias"]
        if c.untie_r:
            sd[h + "dec_attn.r_w_bias"] = p[q + "attn/r_w_bias"]
            sd[h + "dec_attn.r_r_bias"] = p[q + "attn/r_r_bias"]
        sd[h + "pos_ff.CoreNet.0.weight"] = p[q + "ff/layer_1/kernel"].T
        sd[h + "pos_ff.CoreNet.0.bias"] = p[q + "ff/layer_1/bias"]
        sd[h + "pos_ff.CoreNet.3.weight"] = p[q + "ff/layer_2/kernel"].T
        sd[h + "pos_ff.CoreNet.3.bias"] = p[q + "ff/layer_2/bias"]
        sd[h + "pos_ff.layer_norm.weight"] = p[q + "ff/layer_norm/scale"]
        sd[h + "pos_ff.layer_norm.bias"] = p[q + "ff/layer_norm/bias"]
    for i in range(n_tables):
        table = p[f"embedding/tables/{i}"] if c.tie_word_embeddings else p[f"softmax/tables/{i}"]
        sd[f"crit.out_layers.{i}.weight"] = table
        sd[f"crit.out_layers.{i}.bias"] = p[f"softmax/biases/{i}"]
    if needs_proj:
        for k in range(len(c.cutoffs) + 1):
            if tie_projs[k]:  # tied to the input projection of the same cluster (div_val=1: the only one)
                sd[f"crit.out_projs.{k}"] = p[f"embedding/projs/{0 if c.div_val == 1 else k}"].T
            else:
                sd[f"crit.out_projs.{k}"] = p[f"softmax/projs/{k}"].T
    if c.cutoffs:
        sd["crit.cluster_weight"] = p["softmax/cluster_weight"]
        sd["crit.cluster_bias"] = p["softmax/cluster_bias"]
    cfg = hf_config(c)
    if c.output_layer == "softmax":
        cfg["tie_projs"] = [bool(c.tie_word_embeddings)]
    return cfg, sd
