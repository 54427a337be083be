"""Transformer-XL language modelling (`config.objective="txl_lm"`, the family default): mean next-token NLL over
all positions, or the later half (`objective_options.loss_positions="later_half"`, the ablation of Dai et al. §1.8),
on the `lm` stream (`data_pipelines.lm`), with the recurrent memory carried across steps."""

from __future__ import annotations

import math

import jax.numpy as jnp

from xlgen.models.family import Objective, batch_size, compute_dtype, log_vocab_size, model_config, reset_rows
from xlgen.models.transformer_xl.model import TransformerXLConfig, TransformerXLLM


def _txl_cfg(config, train: bool):
    if train:
        return model_config(TransformerXLConfig, config.model)
    ev = config.eval
    over = {}
    for key in ("same_length", "clamp_len"):
        if key in ev and ev[key] is not None:
            over[key] = ev[key]
    return model_config(TransformerXLConfig, config.model, **over)


def _txl_model(config, rngs, train):
    return TransformerXLLM(_txl_cfg(config, train), rngs=rngs)


def _lm_batch_spec(config, split):
    b = batch_size(config, split)
    t = int(config.data.tgt_len) if split == "train" else int(config.data.eval_tgt_len)
    return {
        "input_ids": ((b, t), jnp.int32),
        "labels": ((b, t), jnp.int32),
        "label_mask": ((b, t), jnp.float32),
        "stream_reset": ((b,), jnp.bool_),
    }


def _txl_mem_len(config, split):
    if split != "train" and config.eval.mem_len is not None:
        return int(config.eval.mem_len)
    return int(config.model.mem_len)


def _txl_mems_shape(config, split):
    b = batch_size(config, split)
    m = _txl_mem_len(config, split)
    if m <= 0:
        return None
    return (int(config.model.n_layer), b, m, int(config.model.d_model))


def _txl_loss(model, batch, mems, rng, config):
    del rng
    if mems is not None:
        mems = reset_rows(mems, batch["stream_reset"])
    nll, new_mems = model(batch["input_ids"], mems, labels=batch["labels"], mem_len=_txl_mem_len(config, "train"))
    w = batch["label_mask"].astype(jnp.float32)
    if config.objective_options.loss_positions == "later_half":
        nll, w = nll[:, nll.shape[1] // 2 :], w[:, w.shape[1] // 2 :]
    elif config.objective_options.loss_positions != "all":
        raise ValueError(
            f"objective_options.loss_positions={config.objective_options.loss_positions!r}: "
            "expected 'all' or 'later_half'"
        )
    loss = (nll.astype(jnp.float32) * w).sum() / jnp.maximum(w.sum(), 1.0)
    penalty, terms = model.regularization()  # output-embedding regularisers (CosReg, spectrum control)
    if not terms:
        return loss, {}, new_mems
    return loss + penalty, {"nll": loss, **terms}, new_mems


def _txl_loss_weight(batch, config):
    w = batch["label_mask"].astype(jnp.float32)
    if config.objective_options.loss_positions == "later_half":
        w = w[:, w.shape[1] // 2 :]
    return w.sum()


def _txl_eval_loss(model, batch, mems, config):
    if mems is not None:
        mems = reset_rows(mems, batch["stream_reset"])
    nll, new_mems = model(batch["input_ids"], mems, labels=batch["labels"], mem_len=_txl_mem_len(config, "eval"))
    valid = batch["label_mask"].astype(jnp.float32)
    return (nll.astype(jnp.float32) * valid).sum(), valid.sum(), new_mems


def _txl_uniform_loss(config):
    """log V, unless the training loss is more than the NLL (AdvSoft's margin, output-embedding regularisers)."""
    out = config.model.output
    if float(out.adv_eps) > 0 or float(out.cosreg) > 0 or out.spectrum_control:
        return None
    return log_vocab_size(config)


def _lm_eval_metrics(loss, config):
    out = {"loss": loss, "ppl": math.exp(min(loss, 700.0))}
    if config.eval.metric == "bpc":
        out["bpc"] = loss / math.log(2.0)
    return out


TXL_LM = Objective(
    name="txl_lm",
    pipeline="lm",
    make_model=_txl_model,
    batch_shapes=_lm_batch_spec,
    loss=_txl_loss,
    eval_loss=_txl_eval_loss,
    mems_shape=_txl_mems_shape,
    mems_dtype=compute_dtype,
    tokens_per_step=lambda config: int(config.data.batch_size) * int(config.data.tgt_len),
    eval_metrics=_lm_eval_metrics,
    loss_weight=_txl_loss_weight,
    uniform_loss=_txl_uniform_loss,
)
