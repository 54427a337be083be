"""XLNet finetuning heads (Dai thesis §4.3; original `modeling.py`/`function_builder.py`; HF 4.34.1 names).

* `SequenceSummary`: the `<cls>` state (XLNet puts `<cls>` LAST: summary_type="last"), tanh projection, dropout.
* `XLNetForSequenceClassification`: summary -> `logits_proj` `[b, num_labels]` (num_labels=1: regression).
* `XLNetForTokenClassification` (NER): a linear classifier on every position -> `[b, l, num_labels]`.
* `XLNetForMultipleChoice` (RACE): options flattened to `[b*c, l]`, one logit each -> `[b, c]`.
* Long inputs (`max_segments`): the sequence and multiple-choice heads also take `[b, N, l]` / `[b, c, N, l]`, N
  consecutive segments encoded with the memory carried across them (`recurrence.encode_segments`); the summary
  reads the last segment (or, `segment_pool="mean"`, the mean state of the whole document).
* `XLNetForQuestionAnswering` (SQuAD 2.0 beam head, original `function_builder.get_qa_outputs`): start logits
  masked by `p_mask`; end logits conditioned on the gold start (training) or on each of the top `start_n_top`
  starts (inference, `end_n_top` ends each); an answerability logit from the `<cls>` state and the
  start-probability-weighted state, in training and inference alike, with dropout after its tanh
  (`answer_class_start="gold"`: HF's training path, the gold start's state, no dropout).

Every head returns `(output, new_mems)` like `XLNetModel`; token inputs are passed through to the transformer.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from xlgen.models.layers import Dense, LayerNorm
from xlgen.models.xlnet.model import XLNetConfig, XLNetModel
from xlgen.models.xlnet.recurrence import encode_segments

P_MASK_VALUE = 1e30  # logits * (1 - p_mask) - 1e30 * p_mask, as the original and HF


def _dense(cfg: XLNetConfig, d_in: int, d_out: int, rngs, use_bias: bool = True, out_axis="embed") -> Dense:
    return Dense(
        (d_in,), (d_out,), ("embed",), (out_axis,), use_bias=use_bias, init_std=cfg.initializer_range, rngs=rngs
    )


def _gather_positions(h: jax.Array, index: jax.Array) -> jax.Array:
    """h `[b, l, d]`, index `[b]` -> `[b, d]`."""
    return jnp.take_along_axis(h, jnp.asarray(index, jnp.int32)[:, None, None], axis=1)[:, 0]


def packed_perm_mask(pack_ids: jax.Array) -> jax.Array:
    """`[b, l, l]` float: 1 where position i may not attend to j because they belong to different packed examples.
    Relative attention sees only distances, so an example attends exactly as in a row of its own."""
    pack_ids = jnp.asarray(pack_ids)
    return (pack_ids[:, :, None] != pack_ids[:, None, :]).astype(jnp.float32)


class SequenceSummary(nnx.Module):
    """Pool a sequence `[b, l, d]` to `[b, d']`: "last" (XLNet's `<cls>`), "first", "mean" or "cls_index", then
    optional Dense (to d_model, or num_labels with `summary_proj_to_labels`), activation (tanh) and dropout."""

    def __init__(self, cfg: XLNetConfig, *, rngs: nnx.Rngs):
        self.summary_type = cfg.summary_type
        if cfg.summary_type not in ("last", "first", "mean", "cls_index"):
            raise ValueError(f"summary_type={cfg.summary_type!r}: expected last, first, mean or cls_index")
        n_out = cfg.num_labels if cfg.summary_proj_to_labels and cfg.num_labels > 0 else cfg.d_model
        self.summary = _dense(cfg, cfg.d_model, n_out, rngs) if cfg.summary_use_proj else None
        self.activation = cfg.summary_activation
        self.drop = nnx.Dropout(cfg.summary_last_dropout, rngs=rngs)

    def __call__(self, h: jax.Array, cls_index: Optional[jax.Array] = None) -> jax.Array:
        if self.summary_type == "last":
            x = h[:, -1]
        elif self.summary_type == "first":
            x = h[:, 0]
        elif self.summary_type == "mean":
            x = h.mean(axis=1)
        else:
            x = h[:, -1] if cls_index is None else _gather_positions(h, cls_index)
        return self.project(x)

    def project(self, x: jax.Array) -> jax.Array:
        """The summary of selected states `[..., d]`: Dense, activation, dropout."""
        if self.summary is not None:
            x = self.summary(x)
        if self.activation == "tanh":
            x = jnp.tanh(x)
        elif self.activation:
            raise ValueError(f"summary_activation={self.activation!r}: only 'tanh' or None are supported")
        return self.drop(x)


class XLNetForSequenceClassification(nnx.Module):
    """Classification / regression: logits `[b, num_labels]` from the `<cls>` summary (num_labels=1: regression)."""

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.sequence_summary = SequenceSummary(config, rngs=rngs)
        d_sum = self.sequence_summary.summary.kernel.shape[-1] if config.summary_use_proj else config.d_model
        self.logits_proj = _dense(config, d_sum, config.num_labels, rngs, out_axis=None)

    def __call__(self, input_ids, token_type_ids=None, *, cls_index=None, segment_pool="last", pack_ids=None, **kwargs):
        """input_ids `[b, l]`, or `[b, N, l]`: N segments with memory (`mem_len`, `attention_mask` required).
        Packed rows (`xlgen.finetune.packing`): pack_ids `[b, l]` (attention kept inside each example) and cls_index
        `[b, E]` (each example's `<cls>`) -> logits `[b, E, num_labels]`."""
        if pack_ids is not None:
            h, new_mems = self.transformer(input_ids, token_type_ids, perm_mask=packed_perm_mask(pack_ids), **kwargs)
            x = jnp.take_along_axis(h, jnp.asarray(cls_index, jnp.int32)[..., None], axis=1)  # [b, E, d]
            return self.logits_proj(self.sequence_summary.project(x)).astype(jnp.float32), new_mems
        if jnp.ndim(input_ids) == 3:
            h, new_mems = encode_segments(
                self.transformer,
                input_ids,
                token_type_ids,
                kwargs.pop("attention_mask"),
                mem_len=kwargs.pop("mem_len", None),
                pool=segment_pool,
            )
        else:
            h, new_mems = self.transformer(input_ids, token_type_ids, **kwargs)
        logits = self.logits_proj(self.sequence_summary(h, cls_index)).astype(jnp.float32)
        return logits, new_mems


class XLNetForTokenClassification(nnx.Module):
    """Token classification (NER, HF `XLNetForTokenClassification`): logits `[b, l, num_labels]` = h W + c at every
    position of the last layer's states h (no dropout before the classifier, as HF)."""

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.classifier = _dense(config, config.d_model, config.num_labels, rngs, out_axis=None)

    def __call__(self, input_ids, token_type_ids=None, *, pack_ids=None, **kwargs):
        """pack_ids `[b, l]`: packed rows, attention kept inside each example (`xlgen.finetune.packing`)."""
        if pack_ids is not None:
            kwargs["perm_mask"] = packed_perm_mask(pack_ids)
        h, new_mems = self.transformer(input_ids, token_type_ids, **kwargs)
        return self.classifier(h).astype(jnp.float32), new_mems


class XLNetForMultipleChoice(nnx.Module):
    """RACE head: input_ids `[b, c, l]` (also token_type_ids / masks `[b, c, l]`) -> logits `[b, c]`."""

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.sequence_summary = SequenceSummary(config, rngs=rngs)
        d_sum = self.sequence_summary.summary.kernel.shape[-1] if config.summary_use_proj else config.d_model
        self.logits_proj = _dense(config, d_sum, 1, rngs, out_axis=None)

    def __call__(
        self, input_ids, token_type_ids=None, *, input_mask=None, attention_mask=None, segment_pool="last", **kwargs
    ):
        """input_ids `[b, c, l]`, or `[b, c, N, l]`: N segments per option with memory (`mem_len`)."""
        input_ids = jnp.asarray(input_ids)
        b, c = input_ids.shape[:2]

        def flat(x):
            return None if x is None else jnp.asarray(x).reshape((b * c,) + input_ids.shape[2:])

        if input_ids.ndim == 4:
            h, new_mems = encode_segments(
                self.transformer,
                flat(input_ids),
                flat(token_type_ids),
                flat(attention_mask),
                mem_len=kwargs.pop("mem_len", None),
                pool=segment_pool,
            )
        else:
            h, new_mems = self.transformer(
                flat(input_ids),
                flat(token_type_ids),
                input_mask=flat(input_mask),
                attention_mask=flat(attention_mask),
                **kwargs,
            )
        logits = self.logits_proj(self.sequence_summary(h)).astype(jnp.float32)
        return logits.reshape(b, c), new_mems


class PoolerStartLogits(nnx.Module):
    def __init__(self, cfg: XLNetConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(cfg, cfg.d_model, 1, rngs, out_axis=None)

    def __call__(self, h, p_mask=None):
        x = self.dense(h)[..., 0].astype(jnp.float32)
        return x if p_mask is None else _apply_p_mask(x, p_mask)


def _apply_p_mask(x, p_mask):
    p_mask = jnp.asarray(p_mask, jnp.float32)
    return x * (1 - p_mask) - P_MASK_VALUE * p_mask


class PoolerEndLogits(nnx.Module):
    """end logit of position i given start state s: dense_1(LN(tanh(dense_0([h_i; s]))))."""

    def __init__(self, cfg: XLNetConfig, *, rngs: nnx.Rngs):
        self.dense_0 = Dense(
            (2, cfg.d_model), (cfg.d_model,), (None, "embed"), ("embed",), init_std=cfg.initializer_range, rngs=rngs
        )
        self.layer_norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, rngs=rngs)
        self.dense_1 = _dense(cfg, cfg.d_model, 1, rngs, out_axis=None)

    def __call__(self, h, start_states, p_mask=None):
        """h `[..., l, d]`, start_states broadcastable to h -> logits `[..., l]`."""
        x = self.dense_0(jnp.stack(jnp.broadcast_arrays(h, start_states), axis=-2))
        x = self.dense_1(self.layer_norm(jnp.tanh(x)))[..., 0].astype(jnp.float32)
        return x if p_mask is None else _apply_p_mask(x, p_mask)


class PoolerAnswerClass(nnx.Module):
    """Answerability logit: dense_1(Dropout(tanh(dense_0([start_state; cls_state])))), dense_1 without bias
    (original `answer_class`; dropout rate `cfg.dropout`, none in the HF "gold" mode as HF has none)."""

    def __init__(self, cfg: XLNetConfig, *, rngs: nnx.Rngs):
        self.dense_0 = Dense(
            (2, cfg.d_model), (cfg.d_model,), (None, "embed"), ("embed",), init_std=cfg.initializer_range, rngs=rngs
        )
        self.dense_1 = _dense(cfg, cfg.d_model, 1, rngs, use_bias=False, out_axis=None)
        self.drop = nnx.Dropout(cfg.dropout if cfg.answer_class_start == "weighted" else 0.0, rngs=rngs)

    def __call__(self, h, start_states, cls_index=None):
        cls_state = h[:, -1] if cls_index is None else _gather_positions(h, cls_index)
        x = self.drop(jnp.tanh(self.dense_0(jnp.stack([start_states, cls_state], axis=-2))))
        return self.dense_1(x)[..., 0].astype(jnp.float32)


def _weighted_start(h, start_logits):
    """sum_i softmax(start_logits)_i h_i `[b, d]` (start_logits already p_mask-ed)."""
    start_probs = jax.nn.softmax(start_logits, axis=-1)
    return jnp.einsum("bld,bl->bd", h.astype(jnp.float32), start_probs).astype(h.dtype)


class XLNetForQuestionAnswering(nnx.Module):
    """SQuAD beam head.

    Training (`start_positions [b]` given): returns ({"start_logits" [b,l], "end_logits" [b,l] (conditioned on the
    gold start), "cls_logits" [b]}, new_mems); see `squad_loss`.
    Inference: returns ({"start_top_log_probs" [b,S], "start_top_index" [b,S], "end_top_log_probs" [b,S,E],
    "end_top_index" [b,S,E] (E best ends for each of the S best starts), "cls_logits" [b], "start_logits",
    }, new_mems) with S = start_n_top, E = end_n_top, log-probabilities from log_softmax as in the original.
    """

    def __init__(self, config: XLNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = XLNetModel(config, rngs=rngs)
        self.start_logits = PoolerStartLogits(config, rngs=rngs)
        self.end_logits = PoolerEndLogits(config, rngs=rngs)
        self.answer_class = PoolerAnswerClass(config, rngs=rngs)

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        *,
        p_mask=None,
        cls_index=None,
        start_positions=None,
        start_n_top=None,
        end_n_top=None,
        **kwargs,
    ):
        h, new_mems = self.transformer(input_ids, token_type_ids, **kwargs)
        start_logits = self.start_logits(h, p_mask)
        if start_positions is not None:
            start_states = _gather_positions(h, start_positions)
            end_logits = self.end_logits(h, start_states[:, None], p_mask)
            gold = self.config.answer_class_start == "gold"
            cls_logits = self.answer_class(h, start_states if gold else _weighted_start(h, start_logits), cls_index)
            return {"start_logits": start_logits, "end_logits": end_logits, "cls_logits": cls_logits}, new_mems

        s_top = start_n_top or self.config.start_n_top
        e_top = end_n_top or self.config.end_n_top
        start_log_probs = jax.nn.log_softmax(start_logits, axis=-1)
        start_top_log_probs, start_top_index = jax.lax.top_k(start_log_probs, s_top)  # [b,S]
        start_states = jnp.take_along_axis(h, start_top_index[:, :, None], axis=1)  # [b,S,d]
        # end logits for every (start k, position i): [b,S,l]
        end_logits = self.end_logits(
            h[:, None], start_states[:, :, None], None if p_mask is None else jnp.asarray(p_mask)[:, None]
        )
        end_log_probs = jax.nn.log_softmax(end_logits, axis=-1)
        end_top_log_probs, end_top_index = jax.lax.top_k(end_log_probs, e_top)  # [b,S,E]
        cls_logits = self.answer_class(h, _weighted_start(h, start_logits), cls_index)
        return {
            "start_top_log_probs": start_top_log_probs,
            "start_top_index": start_top_index,
            "end_top_log_probs": end_top_log_probs,
            "end_top_index": end_top_index,
            "cls_logits": cls_logits,
            "start_logits": start_logits,
        }, new_mems


def squad_loss(outputs: dict, start_positions, end_positions, is_impossible=None) -> jax.Array:
    """Per-example SQuAD loss `[b]`: (CE(start) + CE(end)) / 2 + 0.5 * BCE(cls_logits, is_impossible)."""

    def ce(logits, pos):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, jnp.asarray(pos, jnp.int32)[:, None], axis=-1)[:, 0]

    loss = 0.5 * (ce(outputs["start_logits"], start_positions) + ce(outputs["end_logits"], end_positions))
    if is_impossible is not None:
        z = jnp.asarray(is_impossible, jnp.float32)
        x = outputs["cls_logits"]
        bce = jnp.maximum(x, 0) - x * z + jnp.log1p(jnp.exp(-jnp.abs(x)))
        loss = loss + 0.5 * bce
    return loss
