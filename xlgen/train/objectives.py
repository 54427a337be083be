"""Training objectives, looked up by name (`config.objective`, default per `config.model.family`).

An `Objective` says how to build the model for a config, what a global batch looks like, whether a recurrent
memory is carried, and how to turn (model, batch, memory) into a loss. Finetuning tasks register their own with
`register_objective` and reuse the loop, sharding and checkpointing.

Built in:
  txl_lm          Transformer-XL LM: mean next-token NLL over all positions, or the later half
                  (`objective_options.loss_positions="later_half"`, the ablation of Dai et al. §1.8).
  xlnet_plm       XLNet two-stream permutation LM: sum(nll * target_mask) / sum(target_mask) over target_mapping.
  funnel_mlm      Funnel MLM: sum(nll * label_mask) / sum(label_mask).
  funnel_electra  Funnel ELECTRA: generator MLM loss + disc_coeff * discriminator replaced-token BCE.

Layer-wise LR decay is not per objective: the optimizer numbers parameters into layers from their names by
`config.model.family` (`xlgen.optim.layer_ids`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models import registry
from xlgen.models.funnel.heads import electra_loss, mlm_loss, prediction_count, predictions_per_row

Batch = Dict[str, jax.Array]
ShapeDtype = Tuple[Tuple[int, ...], Any]


@dataclasses.dataclass
class Objective:
    name: str
    family: str
    # (config, rngs, train: bool) -> nnx.Module.  Eval modules may differ in static settings (same_length...)
    make_model: Callable[[Any, nnx.Rngs, bool], nnx.Module]
    # config -> {name: (global shape, dtype)} of a training batch (split="train") or eval batch
    batch_shapes: Callable[[Any, str], Dict[str, ShapeDtype]]
    # (model, batch, mems, rng) -> (scalar loss, {metric: scalar}, new_mems or None)
    loss: Callable[..., Tuple[jax.Array, Dict[str, jax.Array], Optional[jax.Array]]]
    # (model, batch, mems) -> (sum of per-token losses, token count, new_mems)  -- for eval
    eval_loss: Callable[..., Tuple[jax.Array, jax.Array, Optional[jax.Array]]]
    # config, split -> memory shape [n_layer, batch, mem_len, d] (or None: no memory)
    mems_shape: Callable[[Any, str], Optional[Tuple[int, ...]]] = lambda config, split: None
    mems_dtype: Callable[[Any], Any] = lambda config: jnp.float32
    # tokens processed per training step (for tokens/s)
    tokens_per_step: Callable[[Any], int] = lambda config: 0
    # final eval metrics from the mean eval loss
    eval_metrics: Callable[[float, Any], Dict[str, float]] = lambda loss, config: {"loss": loss}
    # (batch, config) -> the loss's normaliser for that batch (e.g. its number of target tokens), so that gradient
    # accumulation weights micro-batches like one global batch: sum_i w_i * loss_i / sum_i w_i. None = equal weights
    # (exact when every micro-batch has the same normaliser, e.g. a per-example mean).
    loss_weight: Optional[Callable[[Batch, Any], jax.Array]] = None


OBJECTIVES: Dict[str, Objective] = {}


def register_objective(obj: Objective) -> Objective:
    OBJECTIVES[obj.name] = obj
    return obj


def get_objective(config) -> Objective:
    name = config.get("objective") or registry.get(config.model.family).default_objective
    if name not in OBJECTIVES:
        raise ValueError(f"objective={name!r}: unknown; registered: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def model_config(config, **overrides):
    """The family's frozen config dataclass from `config.model` (minus `family`), with clear errors."""
    return registry.get(config.model.family).model_config(config.model.to_dict(), **overrides)


def _reset_rows(mems: jax.Array, stream_reset: jax.Array) -> jax.Array:
    """Zero the memory rows whose stream (re)starts: mems [L, b, M, d], stream_reset [b] bool."""
    keep = 1.0 - stream_reset.astype(mems.dtype)
    return mems * keep[None, :, None, None]


# ----------------------------------------------------------------------------------------------------------------
# Transformer-XL language modelling
# ----------------------------------------------------------------------------------------------------------------


def _txl_cfg(config, train: bool):
    if train:
        return model_config(config)
    ev = config.eval
    over = {}
    for key in ("same_length", "clamp_len"):
        if key in ev and ev[key] is not None:
            over[key] = ev[key]
    return model_config(config, **over)


def _txl_model(config, rngs, train):
    return registry.get("transformer_xl").models["lm"](_txl_cfg(config, train), rngs=rngs)


def _batch_size(config, split):
    return int(config.data.batch_size) if split == "train" else int(config.data.eval_batch_size)


def _lm_batch_spec(config, split):
    b = _batch_size(config, split)
    t = int(config.data.tgt_len) if split == "train" else int(config.data.eval_tgt_len)
    return {
        "input_ids": ((b, t), jnp.int32),
        "labels": ((b, t), jnp.int32),
        "label_mask": ((b, t), jnp.float32),
        "stream_reset": ((b,), jnp.bool_),
    }


def _txl_mem_len(config, split):
    if split != "train" and config.eval.get("mem_len") is not None:
        return int(config.eval.mem_len)
    return int(config.model.mem_len)


def _txl_mems_shape(config, split):
    b = _batch_size(config, split)
    m = _txl_mem_len(config, split)
    if m <= 0:
        return None
    return (int(config.model.n_layer), b, m, int(config.model.d_model))


def _txl_loss(model, batch, mems, rng, config):
    del rng
    if mems is not None:
        mems = _reset_rows(mems, batch["stream_reset"])
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
        mems = _reset_rows(mems, batch["stream_reset"])
    nll, new_mems = model(batch["input_ids"], mems, labels=batch["labels"], mem_len=_txl_mem_len(config, "eval"))
    valid = batch["label_mask"].astype(jnp.float32)
    return (nll.astype(jnp.float32) * valid).sum(), valid.sum(), new_mems


def _lm_eval_metrics(loss, config):
    out = {"loss": loss, "ppl": math.exp(min(loss, 700.0))}
    if config.eval.get("metric", "ppl") == "bpc":
        out["bpc"] = loss / math.log(2.0)
    return out


register_objective(
    Objective(
        name="txl_lm",
        family="transformer_xl",
        make_model=_txl_model,
        batch_shapes=_lm_batch_spec,
        loss=_txl_loss,
        eval_loss=_txl_eval_loss,
        mems_shape=_txl_mems_shape,
        mems_dtype=lambda config: jnp.bfloat16 if config.model.get("dtype", "float32") == "bfloat16" else jnp.float32,
        tokens_per_step=lambda config: int(config.data.batch_size) * int(config.data.tgt_len),
        eval_metrics=_lm_eval_metrics,
        loss_weight=_txl_loss_weight,
    )
)


# ----------------------------------------------------------------------------------------------------------------
# XLNet permutation language modelling
# ----------------------------------------------------------------------------------------------------------------


def check_xlnet_memory(config) -> None:
    """Cross-check XLNet pretraining memory settings; a clear error instead of a silently wrong memory.

    The pipeline's row at step t+1 continues the first `data.reuse_len` tokens of the row at step t (the rest, A/B
    and the separators, does not continue), so the memory must cache exactly those: model.reuse_len ==
    data.reuse_len whenever model.mem_len > 0 (`XLNetConfig.reuse_len=None` would cache the whole segment, the
    original `_cache_mem` behaviour for inference, wrong here)."""
    m, d = config.model, config.data
    mem_len = int(m.get("mem_len") or 0)
    data_reuse = int(d.get("reuse_len") or 0)
    model_reuse = m.get("reuse_len")
    if mem_len > 0 and (not model_reuse or int(model_reuse) != data_reuse):
        hint = (
            "model.reuse_len is unset, which would cache the whole segment (A, B and separators) into the memory"
            if not model_reuse
            else f"model.reuse_len={model_reuse} caches a different prefix than the pipeline continues"
        )
        raise ValueError(
            f"XLNet memory: model.mem_len={mem_len} with data.reuse_len={data_reuse}: {hint}; "
            f"set model.reuse_len={data_reuse} (or model.mem_len=0 for no memory)"
        )


def _xlnet_model(config, rngs, train):
    check_xlnet_memory(config)
    return registry.get("xlnet").models["lm"](model_config(config), rngs=rngs)


def _xlnet_batch_spec(config, split):
    b = _batch_size(config, split)
    l, m = int(config.data.seq_len), int(config.data.num_predict)
    return {
        "input_ids": ((b, l), jnp.int32),
        "token_type_ids": ((b, l), jnp.int32),
        "perm_mask": ((b, l, l), jnp.float32),
        "target_mapping": ((b, m, l), jnp.float32),
        "target_ids": ((b, m), jnp.int32),
        "target_mask": ((b, m), jnp.float32),
        "is_forward": ((b,), jnp.bool_),
        "stream_reset": ((b,), jnp.bool_),
    }


def _xlnet_mems_shape(config, split):
    m = config.model.get("mem_len") or 0
    if m <= 0:
        return None
    return (int(config.model.n_layer), _batch_size(config, split), int(m), int(config.model.d_model))


def _xlnet_forward(model, batch, mems):
    if mems is not None:
        mems = _reset_rows(mems, batch["stream_reset"])
    nll, new_mems = model(
        batch["input_ids"],
        batch["token_type_ids"],
        target_ids=batch["target_ids"],
        mems=mems,
        perm_mask=batch["perm_mask"],
        target_mapping=batch["target_mapping"],
        is_forward=batch["is_forward"],
    )
    w = batch["target_mask"].astype(jnp.float32)
    return (nll.astype(jnp.float32) * w).sum(), w.sum(), new_mems


def _xlnet_loss(model, batch, mems, rng, config):
    del rng, config
    total, count, new_mems = _xlnet_forward(model, batch, mems)
    return total / jnp.maximum(count, 1.0), {}, new_mems


register_objective(
    Objective(
        name="xlnet_plm",
        family="xlnet",
        make_model=_xlnet_model,
        batch_shapes=_xlnet_batch_spec,
        loss=_xlnet_loss,
        eval_loss=lambda model, batch, mems, config: _xlnet_forward(model, batch, mems),
        mems_shape=_xlnet_mems_shape,
        mems_dtype=lambda config: jnp.bfloat16 if config.model.get("dtype", "float32") == "bfloat16" else jnp.float32,
        tokens_per_step=lambda config: int(config.data.batch_size) * int(config.data.seq_len),
        loss_weight=lambda batch, config: batch["target_mask"].astype(jnp.float32).sum(),
    )
)


# ----------------------------------------------------------------------------------------------------------------
# Funnel-Transformer MLM and ELECTRA
# ----------------------------------------------------------------------------------------------------------------


def _funnel_cfg(config):
    return model_config(config)


def _funnel_mlm_model(config, rngs, train):
    return registry.get("funnel").models["mlm"](_funnel_cfg(config), rngs=rngs)


def _funnel_electra_model(config, rngs, train):
    o = config.objective_options
    return registry.get("funnel").models["electra"](
        _funnel_cfg(config), width_shrink=float(o.generator_width), disc_coeff=float(o.disc_coeff), rngs=rngs
    )


def _mlm_batch_spec(config, split):
    b, l = _batch_size(config, split), int(config.data.seq_len)
    return {
        "input_ids": ((b, l), jnp.int32),
        "token_type_ids": ((b, l), jnp.int32),
        "attention_mask": ((b, l), jnp.int32),
        "labels": ((b, l), jnp.int32),
        "label_mask": ((b, l), jnp.float32),
    }


def _funnel_mlm_loss(model, batch, mems, rng, config):
    loss, parts = mlm_loss(model, batch, max_predictions=predictions_per_row(config))
    return loss, {k: v for k, v in parts.items() if k != "mlm_loss"}, None


def _funnel_mlm_weight(batch, config):
    return prediction_count(batch["label_mask"], predictions_per_row(config))


def _funnel_mlm_eval(model, batch, mems, config):
    """(summed NLL, count) over every predicted position. The last decoder layer runs at the pipeline's per-row
    count of rows (`data_pipelines.mlm_predictions_per_row`: every `mlm` row predicts exactly that many, so the
    values are those of every position, to float rounding), whatever `max_predictions` training uses; data of
    another pipeline computes every position."""
    import data_pipelines

    k = data_pipelines.mlm_predictions_per_row(config.data)
    loss, _ = mlm_loss(model, batch, max_predictions=k)
    count = prediction_count(batch["label_mask"], k)
    return loss * count, count, None


def _funnel_electra_loss(model, batch, mems, rng, config):
    loss, parts = electra_loss(
        model,
        batch,
        jax.random.fold_in(rng, 0x5A3),
        max_predictions=predictions_per_row(config),
        disc_target=config.objective_options.get("disc_target", "original"),
    )
    return loss, parts, None


def _funnel_electra_eval(model, batch, mems, config):
    """ELECTRA eval: the batch-mean objective (fixed sampling key), averaged over batches."""
    loss, _ = electra_loss(
        model, batch, jax.random.key(0), disc_target=config.objective_options.get("disc_target", "original")
    )
    return loss, jnp.ones((), jnp.float32), None


def _funnel_tokens(config):
    return int(config.data.batch_size) * int(config.data.seq_len)


register_objective(
    Objective(
        name="funnel_mlm",
        family="funnel",
        make_model=_funnel_mlm_model,
        batch_shapes=_mlm_batch_spec,
        loss=_funnel_mlm_loss,
        eval_loss=_funnel_mlm_eval,
        tokens_per_step=_funnel_tokens,
        loss_weight=_funnel_mlm_weight,
    )
)
# ELECTRA: generator loss (per masked token) + disc_coeff * discriminator loss (per real token) has two normalisers;
# gradient accumulation averages its micro-batches with equal weights.
register_objective(
    Objective(
        name="funnel_electra",
        family="funnel",
        make_model=_funnel_electra_model,
        batch_shapes=_mlm_batch_spec,
        loss=_funnel_electra_loss,
        eval_loss=_funnel_electra_eval,
        tokens_per_step=_funnel_tokens,
    )
)
