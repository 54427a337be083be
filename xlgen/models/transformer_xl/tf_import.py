"""Transformer-XL's original TensorFlow checkpoints (kimiyoung/transformer-xl `tf/model.py`, e.g. the released
WT103 / enwik8 / text8 / LM1B models) -> xlgen `TransformerXLLM` (`xlgen convert --from-tf
--family=transformer_xl`, `Interop.from_tf`).

Original variable (under `transformer/`)                       xlgen parameter ("/"-joined, unscanned)
    r_w_bias, r_r_bias       [L, n, dh] (untie_r) / [n, dh]    layers/i/attn/r_{w,r}_bias / r_{w,r}_bias
    layer_i/rel_attn/qkv/kernel   [d, 3·n·dh] (q | k | v)      layers/i/attn/{q,k,v}/kernel [d, n, dh]
    layer_i/rel_attn/r/kernel     [d, n·dh]                    layers/i/attn/r/kernel [d, n, dh]
    layer_i/rel_attn/o/kernel     [n·dh, d]                    layers/i/attn/o/kernel [n, dh, d]
    layer_i/{rel_attn,ff}/LayerNorm/{gamma,beta}               layers/i/{attn,ff}/layer_norm/{scale,bias}
    layer_i/ff/layer_{1,2}/{kernel,bias}                       layers/i/ff/layer_{1,2}/{kernel,bias}
    adaptive_embed/lookup_table, proj_W   (div_val = 1)        embedding/tables/0, embedding/projs/0
    adaptive_embed/cutoff_k/{lookup_table,proj_W} (div_val > 1) embedding/tables/k, embedding/projs/k
    adaptive_softmax/bias                 (no cutoffs)         softmax/biases/0
    adaptive_softmax/cutoff_k/b           (div_val > 1)        softmax/biases/k  (div_val = 1: concatenated into
                                                               softmax/biases/0)
    adaptive_softmax/cutoff_k/proj        [d_emb_k, d]         softmax/projs/k (an untied cluster projection)
    adaptive_softmax/cutoff_0/cluster_{W,b}                    softmax/cluster_weight, softmax/cluster_bias

The output tables are the input tables (the original code always ties them); a cluster's projection is tied to
the input projection exactly when the checkpoint has no `cutoff_k/proj`, so `tie_projs` and `untie_r` are read
from the checkpoint and the rest of the architecture from the config. `proj_W` kernels keep their orientation
(`[d_emb, d]`, as xlgen stores them); a projection the original left out (`proj_same_dim=False` with equal widths)
is the identity.
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

from xlgen.models.transformer_xl.model import TransformerXLConfig, from_params

T = "transformer/"


def _proj(ckpt, name: str, d_emb: int, d: int) -> np.ndarray:
    if name in ckpt:
        return ckpt[name]
    if d_emb != d:
        raise KeyError(f"{ckpt.prefix}: no variable {name!r} (a [{d_emb}, {d}] projection)")
    return np.eye(d, dtype=np.float32)


def tf_to_xlgen(ckpt, c: TransformerXLConfig) -> Dict[str, np.ndarray]:
    """{xlgen "/"-joined parameter path: array} of a `TransformerXLLM` with config `c` (tie_projs / untie_r as in
    the checkpoint: see `config_for`)."""
    n, dh, d = c.n_head, c.d_head, c.d_model
    out: Dict[str, np.ndarray] = {}
    e, s = T + "adaptive_embed/", T + "adaptive_softmax/"
    n_clusters = len(c.cutoffs) + 1
    if c.div_val == 1:
        out["embedding/tables/0"] = ckpt[e + "lookup_table"]
        if c.embed_dim != d:
            out["embedding/projs/0"] = ckpt[e + "proj_W"]
    else:
        for k in range(n_clusters):
            out[f"embedding/tables/{k}"] = ckpt[e + f"cutoff_{k}/lookup_table"]
            out[f"embedding/projs/{k}"] = _proj(ckpt, e + f"cutoff_{k}/proj_W", c.embed_dim // c.div_val**k, d)
    if not c.untie_r:
        out["r_w_bias"], out["r_r_bias"] = ckpt[T + "r_w_bias"], ckpt[T + "r_r_bias"]
    else:
        r_w, r_r = ckpt[T + "r_w_bias"], ckpt[T + "r_r_bias"]
    for i in range(c.n_layer):
        src, dst = f"{T}layer_{i}/", f"layers/{i}/"
        qkv = ckpt[src + "rel_attn/qkv/kernel"]  # [d, 3·n·dh]: q | k | v
        if qkv.shape != (d, 3 * n * dh):
            raise ValueError(
                f"{ckpt.prefix}: {src}rel_attn/qkv/kernel has shape {qkv.shape}; config implies {(d, 3 * n * dh)}"
            )
        for j, name in enumerate("qkv"):
            out[dst + f"attn/{name}/kernel"] = qkv[:, j * n * dh : (j + 1) * n * dh].reshape(d, n, dh)
        out[dst + "attn/r/kernel"] = ckpt[src + "rel_attn/r/kernel"].reshape(d, n, dh)
        out[dst + "attn/o/kernel"] = ckpt[src + "rel_attn/o/kernel"].reshape(n, dh, d)
        if c.untie_r:
            out[dst + "attn/r_w_bias"], out[dst + "attn/r_r_bias"] = r_w[i], r_r[i]
        for block, ours in (("rel_attn", "attn"), ("ff", "ff")):
            out[dst + f"{ours}/layer_norm/scale"] = ckpt[src + f"{block}/LayerNorm/gamma"]
            out[dst + f"{ours}/layer_norm/bias"] = ckpt[src + f"{block}/LayerNorm/beta"]
        for name in ("layer_1", "layer_2"):
            out[dst + f"ff/{name}/kernel"] = ckpt[src + f"ff/{name}/kernel"]
            out[dst + f"ff/{name}/bias"] = ckpt[src + f"ff/{name}/bias"]
    if not c.cutoffs:
        out["softmax/biases/0"] = ckpt[s + "bias"]
    elif c.div_val == 1:
        out["softmax/biases/0"] = np.concatenate([ckpt[s + f"cutoff_{k}/b"] for k in range(n_clusters)])
    else:
        for k in range(n_clusters):
            out[f"softmax/biases/{k}"] = ckpt[s + f"cutoff_{k}/b"]
    needs_proj = c.div_val != 1 or c.embed_dim != d
    for k, tied in enumerate(c.resolved_tie_projs):
        if needs_proj and not tied:
            d_emb = c.embed_dim if c.div_val == 1 else c.embed_dim // c.div_val**k
            out[f"softmax/projs/{k}"] = _proj(ckpt, s + f"cutoff_{k}/proj", d_emb, d)
    if c.cutoffs:
        out["softmax/cluster_weight"] = ckpt[s + "cutoff_0/cluster_W"]
        out["softmax/cluster_bias"] = ckpt[s + "cutoff_0/cluster_b"]
    return out


def config_for(ckpt, config: TransformerXLConfig) -> TransformerXLConfig:
    """`config` with what the checkpoint decides: per-layer or shared r biases, which cluster projections are tied
    (no `cutoff_k/proj` variable; the plain softmax always uses the input projection), tied output tables, layers
    unscanned, the adaptive output layer."""
    if f"{T}layer_{config.n_layer}/ff/layer_1/kernel" in ckpt:
        raise ValueError(f"{ckpt.prefix}: has more than n_layer={config.n_layer} layers (check --config)")
    untie_r = len(ckpt.shape(T + "r_w_bias")) == 3
    s = T + "adaptive_softmax/"
    tie_projs = tuple(f"{s}cutoff_{k}/proj" not in ckpt for k in range(len(config.cutoffs) + 1))
    return dataclasses.replace(
        config,
        untie_r=untie_r,
        tie_projs=tie_projs,
        tie_word_embeddings=True,
        scan_layers=False,
        output_layer="adaptive",
    )


def load(ckpt, config: TransformerXLConfig):
    """A `TransformerXLLM` holding the checkpoint (architecture from `config`, see `config_for`)."""
    config = config_for(ckpt, config)
    return from_params(config, tf_to_xlgen(ckpt, config), strict=True)
