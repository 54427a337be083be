"""XLNet two-stream permutation language modelling (`config.objective="xlnet_plm"`, the family default):
sum(nll * target_mask) / sum(target_mask) over target_mapping, on the `xlnet` stream (`data_pipelines.xlnet`), with
the memory of the reused prefix carried across steps."""

from __future__ import annotations

import jax.numpy as jnp

from xlgen.models.family import Objective, batch_size, compute_dtype, log_vocab_size, model_config, reset_rows
from xlgen.models.xlnet.model import XLNetConfig, XLNetLMHeadModel


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
    return XLNetLMHeadModel(model_config(XLNetConfig, config.model), rngs=rngs)


def _xlnet_batch_spec(config, split):
    b = batch_size(config, split)
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
    return (int(config.model.n_layer), batch_size(config, split), int(m), int(config.model.d_model))


def _xlnet_forward(model, batch, mems):
    if mems is not None:
        mems = reset_rows(mems, batch["stream_reset"])
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


XLNET_PLM = Objective(
    name="xlnet_plm",
    pipeline="xlnet",
    make_model=_xlnet_model,
    batch_shapes=_xlnet_batch_spec,
    loss=_xlnet_loss,
    eval_loss=lambda model, batch, mems, config: _xlnet_forward(model, batch, mems),
    mems_shape=_xlnet_mems_shape,
    mems_dtype=compute_dtype,
    tokens_per_step=lambda config: int(config.data.batch_size) * int(config.data.seq_len),
    loss_weight=lambda batch, config: batch["target_mask"].astype(jnp.float32).sum(),
    uniform_loss=log_vocab_size,
)
