"""Funnel-Transformer heads, the MLM / ELECTRA objectives and Hugging Face weight loading.

Heads (all HF-compatible, same parameter roles as transformers 4.34.1):

    FunnelForPreTraining              ELECTRA discriminator: logit "token was replaced" per position `[b, T]`
    FunnelForSequenceClassification   encoder only (decoder dropped): tanh(W h_<cls>) -> `[b, num_labels]`
                                      (num_labels = 1: regression)
    FunnelForMultipleChoice           encoder only: input `[b, choices, T]` -> `[b, choices]` (RACE)
    FunnelForQuestionAnswering        decoder output -> start/end logits `[b, T]`; optional answerability logit
                                      `cls_logits` `[b]` (original `answer_class`, SQuAD 2.0)
    FunnelElectra                     generator (width x `width_shrink`, MLM) + discriminator, `electra_loss`

Objectives for the trainer (batch keys of interfaces.md: input_ids, token_type_ids, attention_mask, labels,
label_mask): `mlm_loss(model, batch)` and `electra_loss(model, batch, rng)`, each returning (loss, parts).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
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

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> FunnelOutput:
        out = self.funnel(input_ids, token_type_ids, attention_mask)
        return out.replace(logits=self.classifier(out.last_hidden_state[:, 0]))


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


def _select_predictions(h: jax.Array, label_mask: jax.Array, max_predictions: Optional[int]):
    """Gather the (at most `max_predictions`) positions with label_mask = 1 -> (h `[b, k, d]`, idx `[b, k]`,
    weight `[b, k]`); identity when max_predictions is None. Keeps the [b, k, vocab] logits small."""
    if max_predictions is None or max_predictions >= h.shape[1]:
        idx = jnp.broadcast_to(jnp.arange(h.shape[1]), label_mask.shape)
        return h, idx, label_mask.astype(jnp.float32)
    weight, idx = jax.lax.top_k(label_mask.astype(jnp.float32), max_predictions)  # masked positions first
    return jnp.take_along_axis(h, idx[..., None], axis=1), idx, weight


def _masked_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return (x * w).sum() / jnp.maximum(w.sum(), 1.0)


def mlm_loss(model: FunnelForMaskedLM, batch: dict, *, max_predictions: Optional[int] = None):
    """Mean cross-entropy over positions with `label_mask` = 1 (thesis J_MLM). Returns (loss, parts)."""
    h = model.hidden(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"))
    h, idx, w = _select_predictions(h, jnp.asarray(batch["label_mask"]), max_predictions)
    labels = jnp.take_along_axis(jnp.asarray(batch["labels"]), idx, axis=1)
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

    def hidden(self, embedded, token_type_ids, attention_mask) -> jax.Array:
        enc, block1 = self.encoder(embedded, token_type_ids, attention_mask)
        return self.decoder(enc, block1, token_type_ids, attention_mask)


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

    gen_h = model.generator.hidden(embed(input_ids), token_type_ids, attention_mask)
    gen_h, idx, w = _select_predictions(gen_h, label_mask, max_predictions)
    tgt = jnp.take_along_axis(labels, idx, axis=1)
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


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face loading
# ----------------------------------------------------------------------------------------------------------------

_HF_CLASSES = (
    "FunnelModel",
    "FunnelBaseModel",
    "FunnelForPreTraining",
    "FunnelForMaskedLM",
    "FunnelForSequenceClassification",
    "FunnelForQuestionAnswering",
    "FunnelForMultipleChoice",
)


def _linear(weights: dict, name: str, in_shape, out_shape, bias: bool = True) -> dict:
    """HF nn.Linear `name` (weight [out, in]) -> our Dense {kernel: in_shape + out_shape, bias: out_shape}."""
    w = weights[name + ".weight"].T
    out = {"kernel": w.reshape(tuple(in_shape) + tuple(out_shape))}
    if bias:
        out["bias"] = weights[name + ".bias"].reshape(tuple(out_shape))
    return out


def _layer_state(weights: dict, prefix: str, cfg: FunnelConfig) -> dict:
    d, n, dh = cfg.d_model, cfg.n_head, cfg.d_head
    a = prefix + "attention."
    f = prefix + "ffn."
    ln = lambda p: {"scale": weights[p + ".weight"], "bias": weights[p + ".bias"]}
    return {
        "attention": {
            "q": _linear(weights, a + "q_head", (d,), (n, dh), bias=False),
            "k": _linear(weights, a + "k_head", (d,), (n, dh)),
            "v": _linear(weights, a + "v_head", (d,), (n, dh)),
            "r": {"kernel": weights[a + "r_kernel"]},
            "o": _linear(weights, a + "post_proj", (n, dh), (d,)),
            "r_w_bias": weights[a + "r_w_bias"],
            "r_r_bias": weights[a + "r_r_bias"],
            "r_s_bias": weights[a + "r_s_bias"],
            "seg_embed": weights[a + "seg_embed"],
            "layer_norm": ln(a + "layer_norm"),
        },
        "ffn": {
            "layer_1": _linear(weights, f + "linear_1", (d,), (cfg.d_inner,)),
            "layer_2": _linear(weights, f + "linear_2", (cfg.d_inner,), (d,)),
            "layer_norm": ln(f + "layer_norm"),
        },
    }


def _funnel_state(weights: dict, prefix: str, cfg: FunnelConfig, decoder: bool) -> dict:
    p = prefix
    state = {
        "embeddings": {
            "word_embeddings": weights[p + "embeddings.word_embeddings.weight"],
            "layer_norm": {
                "scale": weights[p + "embeddings.layer_norm.weight"],
                "bias": weights[p + "embeddings.layer_norm.bias"],
            },
        },
        "encoder": {
            "blocks": {
                m: {l: _layer_state(weights, f"{p}encoder.blocks.{m}.{l}.", cfg) for l in range(n)}
                for m, n in enumerate(cfg.block_sizes)
            }
        },
    }
    if decoder:
        state["decoder"] = {
            "layers": {i: _layer_state(weights, f"{p}decoder.layers.{i}.", cfg) for i in range(cfg.num_decoder_layers)}
        }
    return state


def _assign(module: nnx.Module, tree: dict, where: str):
    """Copy a nested dict of arrays onto the module's Params, checking every shape; every Param must be covered."""
    flat = {}

    def walk(t, path):
        for k, v in t.items():
            if isinstance(v, dict):
                walk(v, path + (k,))
            else:
                flat[path + (k,)] = np.asarray(v, np.float32)

    walk(tree, ())
    state = nnx.state(module, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        key = tuple(path)
        if key not in flat:
            raise ValueError(f"{where}: no HF weight for parameter {'.'.join(map(str, key))}")
        if tuple(var.shape) != flat[key].shape:
            raise ValueError(
                f"{where}: shape mismatch for {'.'.join(map(str, key))}: "
                f"ours {tuple(var.shape)} vs HF {flat[key].shape}"
            )
        var.value = jnp.asarray(flat[key])
    nnx.update(module, state)


class HFFunnel:
    """Callable wrapper around a loaded model: `model(input_ids, token_type_ids=None, attention_mask=None)`
    (NumPy or JAX inputs) -> FunnelOutput with the HF class's fields (`.last_hidden_state`, `.logits`,
    `.start_logits`/`.end_logits`). `.module` is the NNX module, `.config` the FunnelConfig."""

    def __init__(self, module: nnx.Module, architecture: str, compiler_options: Optional[dict] = None):
        self.module, self.architecture, self.config = module, architecture, module.config
        module.eval()
        graphdef, state = nnx.split(module)

        @functools.partial(jax.jit, compiler_options=compiler_options)
        def forward(state, input_ids, token_type_ids, attention_mask):
            return nnx.merge(graphdef, state)(input_ids, token_type_ids, attention_mask)

        self._state, self._forward = state, forward

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, return_dict: bool = True) -> FunnelOutput:
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        return self._forward(self._state, input_ids, token_type_ids, attention_mask)

    def __repr__(self):
        return f"HFFunnel({self.architecture}, {self.config.layout}H{self.config.d_model})"


def load_hf(hf_config: dict, weights: dict, kwargs: dict) -> HFFunnel:
    """HF Funnel config + state dict -> HFFunnel. kwargs override FunnelConfig fields (e.g. dtype="bfloat16",
    attention_type="factorized"); `compiler_options` is passed to `jax.jit` (e.g. {"xla_backend_optimization_level":
    0} compiles small models ~3x faster on CPU)."""
    compiler_options = kwargs.pop("compiler_options", None)
    archs = hf_config.get("architectures") or ["FunnelModel"]
    arch = archs[0]
    if arch not in _HF_CLASSES:
        raise ValueError(f"config.json: architectures={archs!r} not supported; supported: {list(_HF_CLASSES)}")
    try:
        return _load_hf(hf_config, weights, kwargs, arch, compiler_options)
    except KeyError as e:
        raise KeyError(
            f"HF {arch} weights: missing {e.args[0]} (does config.json 'architectures' match the saved model?)"
        ) from None


def _load_hf(hf_config: dict, weights: dict, kwargs: dict, arch: str, compiler_options) -> HFFunnel:
    cfg = FunnelConfig.from_hf(hf_config, **kwargs)
    build = lambda cls, *a, **k: nnx.eval_shape(lambda: cls(cfg, *a, rngs=nnx.Rngs(0), **k))  # no random init
    prefixed = any(k.startswith("funnel.") for k in weights)
    p = "funnel." if prefixed else ""
    if arch == "FunnelModel":
        module = build(FunnelModel)
        tree = _funnel_state(weights, p, cfg, decoder=True)
    elif arch == "FunnelBaseModel":
        module = build(FunnelBaseModel)
        tree = _funnel_state(weights, p, cfg, decoder=False)
    elif arch == "FunnelForMaskedLM":
        module = build(FunnelForMaskedLM)
        emb = weights[p + "embeddings.word_embeddings.weight"]
        if (
            "lm_head.weight" in weights
            and not np.array_equal(weights["lm_head.weight"], emb)
            and hf_config.get("tie_word_embeddings", True) is False
        ):
            raise ValueError(
                "config.json: tie_word_embeddings=false is not supported (xlgen ties the MLM softmax "
                "to the input embeddings)"
            )
        tree = {"funnel": _funnel_state(weights, p, cfg, decoder=True), "lm_head": {"bias": weights["lm_head.bias"]}}
    elif arch == "FunnelForPreTraining":
        module = build(FunnelForPreTraining)
        d = cfg.d_model
        tree = {
            "funnel": _funnel_state(weights, p, cfg, decoder=True),
            "discriminator_predictions": {
                "dense": _linear(weights, "discriminator_predictions.dense", (d,), (d,)),
                "dense_prediction": _linear(weights, "discriminator_predictions.dense_prediction", (d,), ()),
            },
        }
    elif arch in ("FunnelForSequenceClassification", "FunnelForMultipleChoice"):
        d = cfg.d_model
        if arch == "FunnelForSequenceClassification":
            n_labels = weights["classifier.linear_out.weight"].shape[0]
            module = build(FunnelForSequenceClassification, n_labels)
        else:
            n_labels = 1
            module = build(FunnelForMultipleChoice)
        tree = {
            "funnel": _funnel_state(weights, p, cfg, decoder=False),
            "classifier": {
                "linear_hidden": _linear(weights, "classifier.linear_hidden", (d,), (d,)),
                "linear_out": _linear(weights, "classifier.linear_out", (d,), (n_labels,)),
            },
        }
    else:  # FunnelForQuestionAnswering
        module = build(FunnelForQuestionAnswering)
        if weights["qa_outputs.weight"].shape[0] != 2:
            raise ValueError("config.json: FunnelForQuestionAnswering with num_labels != 2 is not supported")
        tree = {
            "funnel": _funnel_state(weights, p, cfg, decoder=True),
            "qa_outputs": _linear(weights, "qa_outputs", (cfg.d_model,), (2,)),
        }
    _assign(module, tree, f"HF {arch}")
    return HFFunnel(module, arch, compiler_options)
