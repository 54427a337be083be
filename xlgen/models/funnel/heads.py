"""Funnel-Transformer heads and the MLM / ELECTRA objectives (Hugging Face loading: `xlgen.models.funnel.hf`).

Heads (all HF-compatible, same parameter roles as transformers 4.34.1):

    FunnelForPreTraining              ELECTRA discriminator: logit "token was replaced" per position `[b, T]`
    FunnelForSequenceClassification   encoder only (decoder dropped): tanh(W h_<cls>) -> `[b, num_labels]`
                                      (num_labels = 1: regression)
    FunnelForTokenClassification      encoder + decoder: dropout, linear per position -> `[b, T, num_labels]` (NER)
    FunnelForMultipleChoice           encoder only: input `[b, choices, T]` -> `[b, choices]` (RACE)
    FunnelForQuestionAnswering        decoder output -> start/end logits `[b, T]`; optional answerability logit
                                      `cls_logits` `[b]` (original `answer_class`, SQuAD 2.0)
    FunnelElectra                     generator (width x `width_shrink`, MLM) + discriminator, `electra_loss`

Objectives for the trainer (batch keys of interfaces.md: input_ids, token_type_ids, attention_mask, labels,
label_mask): `mlm_loss(model, batch)` and `electra_loss(model, batch, rng)`, each returning (loss, parts).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from xlgen.models.funnel.model import (
    FunnelBaseModel,
    FunnelConfig,
    FunnelDecoder,
    FunnelEncoder,
    FunnelForMaskedLM,
    FunnelModel,
    FunnelOutput,
    MLMHead,
    _default_inputs,
    take_rows,
)
from xlgen.models.layers import Dense, activation

# ----------------------------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------------------------


class DiscriminatorHead(nnx.Module):
    """logit = w · act(W h + c) + b per position (HF FunnelDiscriminatorPredictions / original `binary_logits`)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.dense = Dense((cfg.d_model,), (cfg.d_model,), ("embed",), ("embed",), init_std=cfg.init_std, rngs=rngs)
        self.dense_prediction = Dense((cfg.d_model,), (), ("embed",), (), init_std=cfg.init_std, rngs=rngs)
        self.act = cfg.hidden_act

    def __call__(self, h: jax.Array) -> jax.Array:
        return self.dense_prediction(activation(self.act)(self.dense(h))).astype(jnp.float32)


class ClassificationHead(nnx.Module):
    """logits = W_out Dropout(tanh(W h_<cls> + c)) + b (HF FunnelClassificationHead / original summary + logit)."""

    def __init__(self, cfg: FunnelConfig, n_labels: int, *, rngs: nnx.Rngs):
        self.linear_hidden = Dense(
            (cfg.d_model,), (cfg.d_model,), ("embed",), ("embed",), init_std=cfg.init_std, rngs=rngs
        )
        self.linear_out = Dense((cfg.d_model,), (n_labels,), ("embed",), (None,), init_std=cfg.init_std, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, h_cls: jax.Array) -> jax.Array:
        return self.linear_out(self.drop(jnp.tanh(self.linear_hidden(h_cls)))).astype(jnp.float32)


class FunnelForPreTraining(nnx.Module):
    """ELECTRA discriminator: FunnelModel + per-token replaced-token logit `logits` `[b, T]`."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.funnel = FunnelModel(cfg, rngs=rngs)
        self.discriminator_predictions = DiscriminatorHead(cfg, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> FunnelOutput:
        out = self.funnel(input_ids, token_type_ids, attention_mask)
        return out.replace(logits=self.discriminator_predictions(out.last_hidden_state))


class FunnelForSequenceClassification(nnx.Module):
    """Encoder only; `logits` `[b, num_labels]` from the <cls> state (num_labels = 1 -> regression score)."""

    def __init__(self, cfg: FunnelConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
        self.config, self.num_labels = cfg, num_labels
        self.funnel = FunnelBaseModel(cfg, rngs=rngs)
        self.classifier = ClassificationHead(cfg, num_labels, rngs=rngs)

    def __call__(
        self, input_ids, token_type_ids=None, attention_mask=None, *, pack_ids=None, cls_index=None
    ) -> FunnelOutput:
        """Packed rows (`xlgen.finetune.packing`): pack_ids `[b, T]`, cls_index `[b, E]` (each example's <cls>, at
        a multiple of the pooling stride) -> logits `[b, E, num_labels]`."""
        out = self.funnel(input_ids, token_type_ids, attention_mask, pack_ids=pack_ids)
        h = out.last_hidden_state
        if pack_ids is None:
            return out.replace(logits=self.classifier(h[:, 0]))
        stride = jnp.shape(input_ids)[1] // h.shape[1]  # the encoder's total pooling
        x = jnp.take_along_axis(h, (jnp.asarray(cls_index, jnp.int32) // stride)[..., None], axis=1)
        return out.replace(logits=self.classifier(x))


class FunnelForTokenClassification(nnx.Module):
    """Encoder and decoder (full length); `logits` `[b, T, num_labels]` = Dropout(h) W + c at every position (HF
    `FunnelForTokenClassification`: dropout `hidden_dropout`)."""

    def __init__(self, cfg: FunnelConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
        self.config, self.num_labels = cfg, num_labels
        self.funnel = FunnelModel(cfg, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.classifier = Dense((cfg.d_model,), (num_labels,), ("embed",), (None,), init_std=cfg.init_std, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, *, pack_ids=None) -> FunnelOutput:
        out = self.funnel(input_ids, token_type_ids, attention_mask, pack_ids=pack_ids)
        logits = self.classifier(self.drop(out.last_hidden_state)).astype(jnp.float32)
        return out.replace(logits=logits)


class FunnelForMultipleChoice(nnx.Module):
    """Encoder only; inputs `[b, num_choices, T]` -> `logits` `[b, num_choices]` (RACE)."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.funnel = FunnelBaseModel(cfg, rngs=rngs)
        self.classifier = ClassificationHead(cfg, 1, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> FunnelOutput:
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        b, c, t = input_ids.shape
        flat = lambda x: x.reshape(b * c, t)
        out = self.funnel(flat(input_ids), flat(token_type_ids), flat(attention_mask))
        logits = self.classifier(out.last_hidden_state[:, 0]).reshape(b, c)
        return out.replace(logits=logits)


class FunnelForQuestionAnswering(nnx.Module):
    """Decoder output -> `start_logits`, `end_logits` `[b, T]` (HF qa_outputs). With `answerability=True` also
    `cls_logits` `[b]`: w · Dropout(tanh(W [Σ_i p_start(i) h_i ; h_cls] + c)) (original SQuAD 2.0 `answer_class`),
    where `p_start` is the softmax of the start logits over positions with `p_mask == 0` (1 = cannot be an answer
    start; default: padding)."""

    def __init__(self, cfg: FunnelConfig, *, answerability: bool = False, rngs: nnx.Rngs):
        self.config = cfg
        self.funnel = FunnelModel(cfg, rngs=rngs)
        self.qa_outputs = Dense((cfg.d_model,), (2,), ("embed",), (None,), init_std=cfg.init_std, rngs=rngs)
        if answerability:
            self.answer_dense = Dense(
                (2, cfg.d_model), (cfg.d_model,), (None, "embed"), ("embed",), init_std=cfg.init_std, rngs=rngs
            )
            self.answer_logit = Dense(
                (cfg.d_model,), (), ("embed",), (), use_bias=False, init_std=cfg.init_std, rngs=rngs
            )
            self.answer_drop = nnx.Dropout(cfg.dropout, rngs=rngs)
        else:
            self.answer_dense = None

    def __call__(
        self, input_ids, token_type_ids=None, attention_mask=None, *, p_mask=None, cls_index=None
    ) -> FunnelOutput:
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        out = self.funnel(input_ids, token_type_ids, attention_mask)
        h = out.last_hidden_state
        logits = self.qa_outputs(h).astype(jnp.float32)
        start, end = logits[..., 0], logits[..., 1]
        cls_logits = None
        if self.answer_dense is not None:
            p_mask = (attention_mask == 0) if p_mask is None else jnp.asarray(p_mask).astype(bool)
            p_start = jax.nn.softmax(jnp.where(p_mask, -1e30, start), axis=-1)
            start_feature = jnp.einsum("bld,bl->bd", h, p_start.astype(h.dtype))
            idx = jnp.zeros(h.shape[0], jnp.int32) if cls_index is None else jnp.asarray(cls_index)
            cls_feature = jnp.take_along_axis(h, idx[:, None, None], axis=1)[:, 0]
            feat = jnp.tanh(self.answer_dense(jnp.stack([start_feature, cls_feature], axis=1)))
            cls_logits = self.answer_logit(self.answer_drop(feat)).astype(jnp.float32)
        return out.replace(start_logits=start, end_logits=end, cls_logits=cls_logits)


# ----------------------------------------------------------------------------------------------------------------
# MLM and ELECTRA objectives
# ----------------------------------------------------------------------------------------------------------------


def _prediction_rows(label_mask: jax.Array, max_predictions: Optional[int]):
    """The (at most `max_predictions`) positions with label_mask = 1 per row -> (rows `[b, k]` int, weight `[b, k]`),
    masked positions first; (None, label_mask) when max_predictions is None or >= T (predict at every position).
    With rows, the model computes its last layer and the MLM softmax at those k positions only."""
    if max_predictions is None or max_predictions >= label_mask.shape[1]:
        return None, label_mask.astype(jnp.float32)
    weight, rows = jax.lax.top_k(label_mask.astype(jnp.float32), max_predictions)
    return rows, weight


def prediction_count(label_mask: jax.Array, max_predictions: Optional[int]) -> jax.Array:
    """The number of positions `mlm_loss` / `electra_loss` score: label_mask = 1, at most `max_predictions` per row."""
    return _prediction_rows(jnp.asarray(label_mask), max_predictions)[1].sum()


def predictions_per_row(config) -> Optional[int]:
    """The `max_predictions` the MLM / ELECTRA objectives of a training config use: `objective_options.
    max_predictions` when > 0; when 0 (default), the number every row of the `mlm` / `electra` pipeline predicts
    (`data_pipelines.mlm_predictions_per_row`), which loses nothing; None (every position) when it is -1 or the
    pipeline's count is unknown."""
    import data_pipelines

    k = int(config.objective_options.max_predictions)
    if k > 0:
        return k
    if k < 0:
        return None
    return data_pipelines.mlm_predictions_per_row(config.data)


def _masked_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return (x * w).sum() / jnp.maximum(w.sum(), 1.0)


def mlm_loss(model: FunnelForMaskedLM, batch: dict, *, max_predictions: Optional[int] = None):
    """Mean cross-entropy over positions with `label_mask` = 1 (thesis J_MLM). Returns (loss, parts)."""
    rows, w = _prediction_rows(jnp.asarray(batch["label_mask"]), max_predictions)
    h = model.hidden(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"), rows)
    labels = jnp.asarray(batch["labels"]) if rows is None else take_rows(jnp.asarray(batch["labels"]), rows)
    logits = model.logits_from_hidden(h)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    loss = _masked_mean(nll, w)
    acc = _masked_mean((logits.argmax(-1) == labels).astype(jnp.float32), w)
    return loss, {"mlm_loss": loss, "mlm_accuracy": acc}


def generator_config(cfg: FunnelConfig, width_shrink: float = 0.25) -> FunnelConfig:
    """The ELECTRA generator: d_model, d_inner and n_head scaled by `width_shrink` (original pretrain.py), the same
    block layout, embeddings shared with the discriminator (so d_embed = the discriminator's width)."""
    shrink = lambda v: max(1, int(v * width_shrink))
    d_model = shrink(cfg.d_model)
    return dataclasses.replace(
        cfg,
        block_sizes=cfg.block_sizes,
        block_repeats=cfg.block_repeats,
        d_model=d_model + d_model % 2,
        d_inner=shrink(cfg.d_inner),
        n_head=shrink(cfg.n_head),
        d_embed=cfg.embed_dim,
        hf_block1_residual=False,
    )


class FunnelGenerator(nnx.Module):
    """Narrow Funnel (encoder + decoder) on the discriminator's embeddings, with an MLM head tied to them."""

    def __init__(self, cfg: FunnelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.encoder = FunnelEncoder(cfg, rngs=rngs)  # includes the d_embed -> d_model input projection
        self.decoder = FunnelDecoder(cfg, rngs=rngs)
        self.lm_head = MLMHead(cfg, rngs=rngs)

    def hidden(self, embedded, token_type_ids, attention_mask, rows=None) -> jax.Array:
        """Decoder output `[b, T, d]`, or `[b, k, d]` at positions `rows` `[b, k]` (see `FunnelDecoder`)."""
        enc, block1 = self.encoder(embedded, token_type_ids, attention_mask)
        return self.decoder(enc, block1, token_type_ids, attention_mask, rows)


class FunnelElectra(nnx.Module):
    """ELECTRA pretraining (thesis T:L1708): generator trained by MLM, discriminator (`FunnelForPreTraining`, the
    model that is finetuned) classifies every token of the sampled sequence as original / replaced."""

    def __init__(self, cfg: FunnelConfig, *, width_shrink: float = 0.25, disc_coeff: float = 50.0, rngs: nnx.Rngs):
        self.config = cfg
        self.width_shrink, self.disc_coeff = width_shrink, disc_coeff
        self.discriminator = FunnelForPreTraining(cfg, rngs=rngs)
        self.generator = FunnelGenerator(generator_config(cfg, width_shrink), rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> FunnelOutput:
        return self.discriminator(input_ids, token_type_ids, attention_mask)


def electra_loss(
    model: FunnelElectra,
    batch: dict,
    rng: jax.Array,
    *,
    max_predictions: Optional[int] = None,
    disc_target: str = "original",
):
    """gen_loss + disc_coeff * disc_loss (original pretrain.py `electra_loss_func`). Returns (loss, parts).

    1. generator MLM on the masked input (`input_ids`), mean over `label_mask`;
    2. replacements x~_i ~ softmax(generator logits) at masked positions (Gumbel-max with `rng`, no gradient);
    3. discriminator on x~ (original ids elsewhere): sigmoid cross-entropy averaged over real tokens
       (`attention_mask`) with target 1 = ORIGINAL token (x~_i == labels_i), as the original
       (`binary_target = equal(origin_input, sample_input)`), so checkpoints of the original code continue with
       the right sign; `disc_target="replaced"` uses HF's documented convention (1 = replaced) instead. A sampled
       token equal to the original counts as original.
    """
    if disc_target not in ("original", "replaced"):
        raise ValueError(f"objective_options.disc_target={disc_target!r}: expected 'original' or 'replaced'")
    input_ids, token_type_ids, attention_mask = _default_inputs(
        batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
    )
    labels = jnp.asarray(batch["labels"])
    label_mask = jnp.asarray(batch["label_mask"])
    disc = model.discriminator
    embed = disc.funnel.embeddings
    table = embed.word_embeddings[...]

    idx, w = _prediction_rows(label_mask, max_predictions)
    gen_h = model.generator.hidden(embed(input_ids), token_type_ids, attention_mask, idx)
    if idx is None:
        idx = jnp.broadcast_to(jnp.arange(labels.shape[1]), labels.shape)
    tgt = take_rows(labels, idx)
    gen_logits = model.generator.lm_head(gen_h, table)
    gen_loss = _masked_mean(optax.softmax_cross_entropy_with_integer_labels(gen_logits, tgt), w)

    samples = jax.random.categorical(rng, jax.lax.stop_gradient(gen_logits), axis=-1).astype(labels.dtype)
    b = jnp.arange(labels.shape[0])[:, None]
    replace = jnp.zeros(labels.shape, bool).at[b, idx].max(w > 0)
    sampled_full = labels.at[b, idx].set(jnp.where(w > 0, samples, tgt))
    sampled = jnp.where(replace, sampled_full, labels)
    replaced = (sampled != labels).astype(jnp.float32)

    target = 1.0 - replaced if disc_target == "original" else replaced
    logits = disc(sampled, token_type_ids, attention_mask).logits
    real = (attention_mask > 0).astype(jnp.float32)
    disc_loss = _masked_mean(optax.sigmoid_binary_cross_entropy(logits, target), real)
    disc_acc = _masked_mean(((logits > 0) == (target > 0)).astype(jnp.float32), real)
    total = gen_loss + model.disc_coeff * disc_loss
    return total, {
        "gen_loss": gen_loss,
        "disc_loss": disc_loss,
        "disc_accuracy": disc_acc,
        "replaced_ratio": _masked_mean(replaced, real),
    }
