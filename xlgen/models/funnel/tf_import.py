"""Funnel-Transformer's original TensorFlow checkpoints (laiguokun/Funnel-Transformer `tensorflow/`, the released
`B4-4-4H768-ELEC-TF` ... models) -> xlgen modules (`xlgen convert --from-tf --family=funnel`, `Interop.from_tf`).

Original variable (under `model/`)                             xlgen parameter
    input/word_embedding/lookup_table   [V, d]                 embeddings.word_embeddings
    input/layer_norm/{gamma,beta}                              embeddings.layer_norm.{scale,bias}
    encoder/layer_g/rel_attn/{q,k,v,r}/kernel  [d, n, dh]      encoder.blocks.m.l.attention.{q,k,v,r}.kernel
      (g counts parameter layers over the blocks: block m, layer l)
    encoder/layer_g/rel_attn/{k,v}/bias        [n, dh]         ....attention.{k,v}.bias
    encoder/layer_g/rel_attn/o/{kernel,bias}   [n, dh, d]      ....attention.o.{kernel,bias}
    encoder/layer_g/rel_attn/{r_w,r_r,r_s}_bias, seg_embed     ....attention.<same name>
    encoder/layer_g/{rel_attn,ff}/layer_norm/{gamma,beta}      ....{attention,ffn}.layer_norm.{scale,bias}
    encoder/layer_g/ff/layer_{1,2}/{kernel,bias}               ....ffn.layer_{1,2}.{kernel,bias}
    decoder/layer_{G+j}/...  (G = encoder parameter layers)    decoder.layers.j....
    binary_proj/dense/{kernel,bias}, binary_loss/{weight,bias} discriminator_predictions.dense /
                                                               .dense_prediction (ELECTRA discriminator head)

The kernels keep the original's einsum layouts, which are xlgen's. A checkpoint with the ELECTRA head becomes a
`FunnelForPreTraining` (the discriminator, the model that gets finetuned), one with decoder layers a
`FunnelModel`, else a `FunnelBaseModel`. The generator (`generator/...`), the MLM projection (`lm_proj`, used
only in pretraining) and optimizer slots are not read.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
from flax import nnx

from xlgen.models.funnel.heads import FunnelForPreTraining
from xlgen.models.funnel.model import FunnelBaseModel, FunnelConfig, FunnelModel
from xlgen.models.params import materialize

M = "model/"


def _layer(ckpt, src: str, dst: str, out: Dict[str, np.ndarray]) -> None:
    a, f = src + "rel_attn/", src + "ff/"
    for n in ("q", "k", "v", "r", "o"):
        out[dst + f"attention.{n}.kernel"] = ckpt[a + f"{n}/kernel"]
    for n in ("k", "v", "o"):
        out[dst + f"attention.{n}.bias"] = ckpt[a + f"{n}/bias"]
    for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        out[dst + f"attention.{n}"] = ckpt[a + n]
    for n in ("layer_1", "layer_2"):
        out[dst + f"ffn.{n}.kernel"], out[dst + f"ffn.{n}.bias"] = ckpt[f + f"{n}/kernel"], ckpt[f + f"{n}/bias"]
    for block, ours in ((a, "attention"), (f, "ffn")):
        out[dst + f"{ours}.layer_norm.scale"] = ckpt[block + "layer_norm/gamma"]
        out[dst + f"{ours}.layer_norm.bias"] = ckpt[block + "layer_norm/beta"]


def tf_to_xlgen(ckpt, cfg: FunnelConfig, prefix: str, decoder: bool) -> Dict[str, np.ndarray]:
    """{xlgen dotted parameter path: array} of the Funnel body (`prefix` "funnel." under a head)."""
    if M + "encoder/input_projection/kernel" in ckpt:
        raise ValueError(f"{ckpt.prefix}: d_embed != d_model (an input projection): not supported")
    p = prefix
    out = {
        p + "embeddings.word_embeddings": ckpt[M + "input/word_embedding/lookup_table"],
        p + "embeddings.layer_norm.scale": ckpt[M + "input/layer_norm/gamma"],
        p + "embeddings.layer_norm.bias": ckpt[M + "input/layer_norm/beta"],
    }
    g = 0
    for m, size in enumerate(cfg.block_sizes):
        for layer in range(size):
            _layer(ckpt, f"{M}encoder/layer_{g}/", f"{p}encoder.blocks.{m}.{layer}.", out)
            g += 1
    if f"{M}encoder/layer_{g}/ff/layer_1/kernel" in ckpt:
        raise ValueError(f"{ckpt.prefix}: more encoder layers than block_sizes={cfg.block_sizes} (check --config)")
    if decoder:
        for j in range(cfg.num_decoder_layers):
            _layer(ckpt, f"{M}decoder/layer_{g + j}/", f"{p}decoder.layers.{j}.", out)
    return out


def load(ckpt, cfg: FunnelConfig):
    """`FunnelForPreTraining` (ELECTRA head present), `FunnelModel` (decoder layers present) or `FunnelBaseModel`
    holding the checkpoint."""
    n_enc = sum(cfg.block_sizes)
    has_decoder = cfg.num_decoder_layers > 0 and f"{M}decoder/layer_{n_enc}/ff/layer_1/kernel" in ckpt
    electra = M + "binary_loss/weight" in ckpt
    if electra:
        if not has_decoder:
            raise ValueError(f"{ckpt.prefix}: an ELECTRA head without decoder layers")
        values = tf_to_xlgen(ckpt, cfg, "funnel.", decoder=True)
        head = "discriminator_predictions."
        values[head + "dense.kernel"] = ckpt[M + "binary_proj/dense/kernel"]
        values[head + "dense.bias"] = ckpt[M + "binary_proj/dense/bias"]
        values[head + "dense_prediction.kernel"] = ckpt[M + "binary_loss/weight"]
        values[head + "dense_prediction.bias"] = ckpt[M + "binary_loss/bias"].reshape(())
        cls = FunnelForPreTraining
    else:
        values = tf_to_xlgen(ckpt, cfg, "", decoder=has_decoder)
        cls = FunnelModel if has_decoder else FunnelBaseModel
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    return materialize(abstract, values)


def _depth(text: str, key: str):
    parts = str(text).split("x")
    if len(parts) > 2 or not all(s.strip().isdigit() for s in parts):
        raise ValueError(f"net_config.json: {key}={text!r}: expected N or NxR")
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else 1


def original_config(release: dict) -> FunnelConfig:
    """A release's `net_config.json` (block_size "6_3x2_3x2", decoder_size "2", d_model, n_head, d_head, d_inner,
    vocab_size, d_embed, ff_activation, pooling_type, separate_cls, pool_q_only, rel_attn_type, dropout, dropatt,
    dropact) -> FunnelConfig. The original's `gelu` is the tanh approximation (`gelu_new`)."""
    blocks = [_depth(b, "block_size") for b in str(release["block_size"]).split("_")]
    dec_layers, dec_repeats = _depth(release.get("decoder_size", "0"), "decoder_size")
    if dec_repeats != 1:
        raise ValueError(
            f"net_config.json: decoder_size={release['decoder_size']!r}: shared decoder layers are not supported"
        )
    d_model = int(release["d_model"])
    if int(release.get("d_embed", d_model)) != d_model:
        raise ValueError(f"net_config.json: d_embed={release['d_embed']} != d_model={d_model}: not supported")
    act = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh"}.get(release.get("ff_activation", "gelu"))
    if act is None:
        raise ValueError(f"net_config.json: ff_activation={release['ff_activation']!r}: expected gelu, relu or tanh")
    return FunnelConfig(
        vocab_size=int(release["vocab_size"]),
        block_sizes=tuple(s for s, _ in blocks),
        block_repeats=tuple(r for _, r in blocks),
        num_decoder_layers=dec_layers,
        d_model=d_model,
        n_head=int(release["n_head"]),
        d_head=int(release["d_head"]),
        d_inner=int(release["d_inner"]),
        hidden_act=act,
        dropout=float(release.get("dropout", 0.1)),
        dropatt=float(release.get("dropatt", 0.1)),
        dropact=float(release.get("dropact", 0.0)),
        pooling_type=release.get("pooling_type", "mean"),
        separate_cls=bool(release.get("separate_cls", True)),
        pool_q_only=bool(release.get("pool_q_only", True)),
        attention_type="factorized" if release.get("rel_attn_type") == "factorized" else "relative_shift",
    )
