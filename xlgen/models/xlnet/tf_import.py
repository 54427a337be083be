"""XLNet's original TensorFlow checkpoints (zihangdai/xlnet, e.g. `xlnet_cased_L-24_H-1024_A-16/xlnet_model.ckpt`)
-> xlgen modules (`xlgen convert --from-tf --family=xlnet`, `Interop.from_tf`).

Original variable (modeling.py, under `model/transformer/`)          xlgen parameter (`[transformer.]...`)
    word_embedding/lookup_table          [V, d]                      word_embedding
    mask_emb/mask_emb                    [1, 1, d]                   mask_emb [d]
    r_w_bias, r_r_bias, r_s_bias         [L, n, dh] (untie_r) or     layers.i.rel_attn.<name> [n, dh] (a shared
                                         [n, dh] (shared)            bias is copied into every layer)
    seg_embed                            [L, 2, n, dh]               layers.i.rel_attn.seg_embed
    layer_i/rel_attn/{q,k,v,r}/kernel    [d, n, dh]                  layers.i.rel_attn.{q,k,v,r}.kernel
    layer_i/rel_attn/o/kernel            [d, n, dh]                  layers.i.rel_attn.o.kernel [n, dh, d]
    layer_i/{rel_attn,ff}/LayerNorm/{gamma,beta}                     layers.i.{rel_attn,ff}.layer_norm.{scale,bias}
    layer_i/ff/layer_{1,2}/{kernel,bias} [in, out]                   layers.i.ff.layer_{1,2}.{kernel,bias}
    model/lm_loss/bias                   [V]                         lm_bias (XLNetLMHeadModel; the softmax weight
                                                                     is the tied word embedding)

A checkpoint with `model/lm_loss/bias` becomes an `XLNetLMHeadModel`, one without an `XLNetModel`. Optimizer slots
(`*/Adam*`) and `global_step` are not read; a `model/lm_loss/weight` that differs from the embedding is an error
(xlgen's LM head is tied, as in every released XLNet).
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np
from flax import nnx

from xlgen.models.params import materialize
from xlgen.models.xlnet.model import XLNetConfig, XLNetLMHeadModel, XLNetModel

T = "model/transformer/"


def tf_to_xlgen(ckpt, config: XLNetConfig, prefix: str) -> Dict[str, np.ndarray]:
    """{xlgen dotted parameter path: array} of the body (`prefix` "transformer." under the LM head)."""
    out = {prefix + "word_embedding": ckpt[T + "word_embedding/lookup_table"]}
    out[prefix + "mask_emb"] = ckpt[T + "mask_emb/mask_emb"].reshape(-1)
    shared = {n: ckpt[T + n] for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed") if T + n in ckpt}
    for i in range(config.n_layer):
        src, dst = f"{T}layer_{i}/", f"{prefix}layers.{i}."
        for n in ("q", "k", "v", "r"):
            out[dst + f"rel_attn.{n}.kernel"] = ckpt[src + f"rel_attn/{n}/kernel"]
        out[dst + "rel_attn.o.kernel"] = np.transpose(ckpt[src + "rel_attn/o/kernel"], (1, 2, 0))
        for n, value in shared.items():
            per_layer = value.ndim == (4 if n == "seg_embed" else 3)
            out[dst + f"rel_attn.{n}"] = value[i] if per_layer else value
        for block in ("rel_attn", "ff"):
            out[dst + f"{block}.layer_norm.scale"] = ckpt[src + f"{block}/LayerNorm/gamma"]
            out[dst + f"{block}.layer_norm.bias"] = ckpt[src + f"{block}/LayerNorm/beta"]
        for n in ("layer_1", "layer_2"):
            out[dst + f"ff.{n}.kernel"] = ckpt[src + f"ff/{n}/kernel"]
            out[dst + f"ff.{n}.bias"] = ckpt[src + f"ff/{n}/bias"]
    return out


def load(ckpt, config: XLNetConfig):
    """An `XLNetLMHeadModel` (or `XLNetModel` for a checkpoint without `model/lm_loss`) holding the checkpoint;
    biases are kept per layer (`untie_r=True`, the same model as a shared bias) and layers unscanned."""
    if config.n_layer and f"{T}layer_{config.n_layer}/ff/layer_1/kernel" in ckpt:
        raise ValueError(f"{ckpt.prefix}: has more than n_layer={config.n_layer} layers (check --config)")
    config = dataclasses.replace(config, untie_r=True, scan_layers=False)
    lm = "model/lm_loss/bias" in ckpt
    values = tf_to_xlgen(ckpt, config, "transformer." if lm else "")
    if lm:
        values["lm_bias"] = ckpt["model/lm_loss/bias"]
        if "model/lm_loss/weight" in ckpt and not np.array_equal(
            ckpt["model/lm_loss/weight"], values["transformer.word_embedding"]
        ):
            raise ValueError(f"{ckpt.prefix}: model/lm_loss/weight differs from the word embedding (xlgen ties them)")
    cls = XLNetLMHeadModel if lm else XLNetModel
    abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    return materialize(abstract, values)


def original_config(release: dict) -> XLNetConfig:
    """`xlnet_config.json` of a release ({d_head, d_inner, d_model, ff_activation, n_head, n_layer, n_token,
    untie_r}) -> XLNetConfig (HF's reading of it: n_token is the vocabulary size)."""
    return XLNetConfig.from_hf(dict(release))
