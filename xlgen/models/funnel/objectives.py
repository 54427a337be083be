"""Funnel-Transformer pretraining objectives: MLM (`funnel_mlm`, the family default: sum(nll * label_mask) /
sum(label_mask)) on the `mlm` stream and ELECTRA (`funnel_electra`: generator MLM loss + disc_coeff * discriminator
replaced-token BCE) on the `electra` stream (`data_pipelines.mlm`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xlgen.models.family import Objective, batch_size, log_vocab_size, model_config
from xlgen.models.funnel.heads import FunnelElectra, electra_loss, mlm_loss, prediction_count, predictions_per_row
from xlgen.models.funnel.model import FunnelConfig, FunnelForMaskedLM


def _funnel_cfg(config):
    return model_config(FunnelConfig, config.model)


def _funnel_mlm_model(config, rngs, train):
    return FunnelForMaskedLM(_funnel_cfg(config), rngs=rngs)


def _funnel_electra_model(config, rngs, train):
    o = config.objective_options
    return FunnelElectra(
        _funnel_cfg(config), width_shrink=float(o.generator_width), disc_coeff=float(o.disc_coeff), rngs=rngs
    )


def _mlm_batch_spec(config, split):
    b, l = batch_size(config, split), int(config.data.seq_len)
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
        disc_target=config.objective_options.disc_target,
    )
    return loss, parts, None


def _funnel_electra_eval(model, batch, mems, config):
    """ELECTRA eval: the batch-mean objective (fixed sampling key), averaged over batches."""
    loss, _ = electra_loss(model, batch, jax.random.key(0), disc_target=config.objective_options.disc_target)
    return loss, jnp.ones((), jnp.float32), None


def _funnel_tokens(config):
    return int(config.data.batch_size) * int(config.data.seq_len)


FUNNEL_MLM = Objective(
    name="funnel_mlm",
    pipeline="mlm",
    make_model=_funnel_mlm_model,
    batch_shapes=_mlm_batch_spec,
    loss=_funnel_mlm_loss,
    eval_loss=_funnel_mlm_eval,
    tokens_per_step=_funnel_tokens,
    loss_weight=_funnel_mlm_weight,
    uniform_loss=log_vocab_size,
)
# ELECTRA: generator loss (per masked token) + disc_coeff * discriminator loss (per real token) has two normalisers;
# gradient accumulation averages its micro-batches with equal weights.
FUNNEL_ELECTRA = Objective(
    name="funnel_electra",
    pipeline="electra",
    make_model=_funnel_electra_model,
    batch_shapes=_mlm_batch_spec,
    loss=_funnel_electra_loss,
    eval_loss=_funnel_electra_eval,
    tokens_per_step=_funnel_tokens,
)
