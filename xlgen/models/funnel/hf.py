"""Funnel-Transformer and Hugging Face (transformers 4.34.1): loading HF checkpoints of every Funnel class into
xlgen modules (`load_hf`, the `xlgen.from_pretrained` loader `from_hf`) and the HF-convention caller `HFFunnel`.

HF weights are arranged as a nested dict mirroring the xlgen module (Linear weights transposed, heads split) and go
into the module through `xlgen.models.params.materialize` (no random initialisation).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from flax import nnx

from xlgen.models.funnel.heads import (
    FunnelForMultipleChoice,
    FunnelForPreTraining,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    FunnelForTokenClassification,
)
from xlgen.models.funnel.model import (
    FunnelBaseModel,
    FunnelConfig,
    FunnelForMaskedLM,
    FunnelModel,
    FunnelOutput,
    _default_inputs,
)
from xlgen.models.params import FrozenCall, materialize

HF_CLASSES = (
    "FunnelModel",
    "FunnelBaseModel",
    "FunnelForPreTraining",
    "FunnelForMaskedLM",
    "FunnelForSequenceClassification",
    "FunnelForQuestionAnswering",
    "FunnelForMultipleChoice",
    "FunnelForTokenClassification",
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


def _flatten(tree: dict, prefix: str = "") -> dict:
    """Nested dict of arrays -> {dotted path: float32 array}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = np.asarray(v, np.float32)
    return out


class HFFunnel:
    """Callable wrapper around a loaded model: `model(input_ids, token_type_ids=None, attention_mask=None)`
    (NumPy or JAX inputs) -> FunnelOutput with the HF class's fields (`.last_hidden_state`, `.logits`,
    `.start_logits`/`.end_logits`). `.module` is the NNX module, `.config` the FunnelConfig."""

    def __init__(self, module: nnx.Module, architecture: str, compiler_options: Optional[dict] = None):
        self.module, self.architecture, self.config = module, architecture, module.config
        module.eval()
        self._forward = FrozenCall(module, lambda m, *inputs: m(*inputs), compiler_options=compiler_options)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, return_dict: bool = True) -> FunnelOutput:
        input_ids, token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        return self._forward(input_ids, token_type_ids, attention_mask)

    def __repr__(self):
        return f"HFFunnel({self.architecture}, {self.config.layout}H{self.config.d_model})"


def load_hf(hf_config: dict, weights: dict, kwargs: dict) -> HFFunnel:
    """HF Funnel config + state dict -> HFFunnel. kwargs override FunnelConfig fields (e.g. dtype="bfloat16",
    attention_type="factorized"); `compiler_options` is passed to `jax.jit` (e.g. {"xla_backend_optimization_level":
    0} compiles small models ~3x faster on CPU)."""
    compiler_options = kwargs.pop("compiler_options", None)
    archs = hf_config.get("architectures") or ["FunnelModel"]
    arch = archs[0]
    if arch not in HF_CLASSES:
        raise ValueError(f"config.json: architectures={archs!r} not supported; supported: {list(HF_CLASSES)}")
    try:
        return _load_hf(hf_config, weights, kwargs, arch, compiler_options)
    except KeyError as e:
        raise KeyError(
            f"HF {arch} weights: missing {e.args[0]} (does config.json 'architectures' match the saved model?)"
        ) from None


def _load_hf(hf_config: dict, weights: dict, kwargs: dict, arch: str, compiler_options) -> HFFunnel:
    cfg = FunnelConfig.from_hf(hf_config, **kwargs)
    build = lambda cls, *a, **k: nnx.eval_shape(lambda: cls(cfg, *a, rngs=nnx.Rngs(0), **k))  # no arrays yet
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
    elif arch == "FunnelForTokenClassification":
        n_labels = weights["classifier.weight"].shape[0]
        module = build(FunnelForTokenClassification, n_labels)
        tree = {
            "funnel": _funnel_state(weights, p, cfg, decoder=True),
            "classifier": _linear(weights, "classifier", (cfg.d_model,), (n_labels,)),
        }
    else:  # FunnelForQuestionAnswering
        module = build(FunnelForQuestionAnswering)
        if weights["qa_outputs.weight"].shape[0] != 2:
            raise ValueError("config.json: FunnelForQuestionAnswering with num_labels != 2 is not supported")
        tree = {
            "funnel": _funnel_state(weights, p, cfg, decoder=True),
            "qa_outputs": _linear(weights, "qa_outputs", (cfg.d_model,), (2,)),
        }
    try:
        module = materialize(module, _flatten(tree))
    except (KeyError, ValueError) as e:
        raise ValueError(f"HF {arch}: {e.args[0]}") from None
    return HFFunnel(module, arch, compiler_options)


def from_hf(hf_config: dict, weights: dict, kwargs: dict) -> HFFunnel:
    """Build the xlgen model for a HF Funnel directory (`xlgen.from_pretrained`): `load_hf` with a copy of kwargs."""
    return load_hf(hf_config, weights, dict(kwargs or {}))
