"""Funnel-Transformer -> Hugging Face Funnel classes (transformers 4.34.1): the inverse of
`funnel.hf.load_hf` / `FunnelConfig.from_hf`.

Dense kernels `[in..., out...]` become torch Linear weights `[prod(out), prod(in)]`. The MLM softmax is tied to the
input embedding in both libraries (`lm_head.weight` is written as the embedding). Configurations HF cannot express
raise a ValueError naming the field: `mlm_transform` / `d_embed` (the original `lm_proj` and the ELECTRA
generator's narrow width), the original block-1 residual when block 1 repeats (shares) layers, and the SQuAD 2.0
answerability head of `FunnelForQuestionAnswering`.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from xlgen.models.params import flat_params


def hf_config(cfg, architecture: str, num_labels: int = 2) -> Dict[str, Any]:
    """HF `FunnelConfig` dict of a `FunnelConfig`."""
    if cfg.mlm_transform or cfg.embed_dim != cfg.d_model:
        raise ValueError(
            "Funnel model.mlm_transform / model.d_embed != d_model: HF Funnel has no MLM transform or input "
            "projection, so this model has no HF equivalent"
        )
    if cfg.block_repeats[0] > 1 and cfg.block_sizes[0] > 1 and not cfg.hf_block1_residual:
        raise ValueError(
            f"Funnel block layout {cfg.layout}: block 1 repeats its layers and this model adds block 1's last "
            "output to the decoder (original code); HF adds the output after block_sizes[0] applications, so the "
            "HF model would differ"
        )
    return {
        "architectures": [architecture],
        "model_type": "funnel",
        "vocab_size": int(cfg.vocab_size),
        "block_sizes": [int(x) for x in cfg.block_sizes],
        "block_repeats": [int(x) for x in cfg.block_repeats],
        "num_decoder_layers": int(cfg.num_decoder_layers),
        "d_model": int(cfg.d_model),
        "n_head": int(cfg.n_head),
        "d_head": int(cfg.d_head),
        "d_inner": int(cfg.d_inner),
        "hidden_act": cfg.hidden_act,
        "hidden_dropout": float(cfg.dropout),
        "attention_dropout": float(cfg.dropatt),
        "activation_dropout": float(cfg.dropact),
        "initializer_range": 0.1,
        "initializer_std": float(cfg.init_std),
        "layer_norm_eps": float(cfg.layer_norm_eps),
        "pooling_type": cfg.pooling_type,
        "attention_type": cfg.attention_type,
        "separate_cls": bool(cfg.separate_cls),
        "truncate_seq": bool(cfg.truncate_seq),
        "pool_q_only": bool(cfg.pool_q_only),
        "id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(num_labels)},
    }


def _linear(p: Dict[str, np.ndarray], src: str, dst: str, sd: Dict[str, np.ndarray], n_in: int = 1) -> None:
    """xlgen Dense `src` (kernel with `n_in` input axes) -> torch Linear `dst` (weight [out, in])."""
    kernel = p[src + ".kernel"]
    d_in = int(np.prod(kernel.shape[:n_in]))
    sd[dst + ".weight"] = kernel.reshape(d_in, -1).T
    if src + ".bias" in p:
        sd[dst + ".bias"] = p[src + ".bias"].reshape(-1)


def _layer(p, src: str, dst: str, sd) -> None:
    a, h = src + "attention.", dst + "attention."
    _linear(p, a + "q", h + "q_head", sd)
    _linear(p, a + "k", h + "k_head", sd)
    _linear(p, a + "v", h + "v_head", sd)
    _linear(p, a + "o", h + "post_proj", sd, n_in=2)
    sd[h + "r_kernel"] = p[a + "r.kernel"]
    for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        sd[h + n] = p[a + n]
    sd[h + "layer_norm.weight"], sd[h + "layer_norm.bias"] = p[a + "layer_norm.scale"], p[a + "layer_norm.bias"]
    f, g = src + "ffn.", dst + "ffn."
    _linear(p, f + "layer_1", g + "linear_1", sd)
    _linear(p, f + "layer_2", g + "linear_2", sd)
    sd[g + "layer_norm.weight"], sd[g + "layer_norm.bias"] = p[f + "layer_norm.scale"], p[f + "layer_norm.bias"]


def _funnel(p, src: str, dst: str, cfg, decoder: bool, sd) -> None:
    sd[dst + "embeddings.word_embeddings.weight"] = p[src + "embeddings.word_embeddings"]
    sd[dst + "embeddings.layer_norm.weight"] = p[src + "embeddings.layer_norm.scale"]
    sd[dst + "embeddings.layer_norm.bias"] = p[src + "embeddings.layer_norm.bias"]
    for m, n in enumerate(cfg.block_sizes):
        for i in range(n):
            _layer(p, f"{src}encoder.blocks.{m}.{i}.", f"{dst}encoder.blocks.{m}.{i}.", sd)
    if decoder:
        for i in range(cfg.num_decoder_layers):
            _layer(p, f"{src}decoder.layers.{i}.", f"{dst}decoder.layers.{i}.", sd)


def to_hf(module) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(HF config, state dict) of an xlgen Funnel module (an ELECTRA model exports its discriminator)."""
    arch = type(module).__name__
    if arch == "FunnelElectra":
        module, arch = module.discriminator, type(module.discriminator).__name__
    cfg = module.config
    hf_config(cfg, arch)  # refuses models HF cannot express before reading any parameter
    if arch == "FunnelForQuestionAnswering" and getattr(module, "answer_dense", None) is not None:
        raise ValueError(
            "FunnelForQuestionAnswering with the SQuAD 2.0 answerability head (cls_logits): HF's class has "
            "start/end logits only, so this model has no HF equivalent"
        )
    p = flat_params(module, sep=".")
    sd: Dict[str, np.ndarray] = {}
    num_labels = 2
    if arch in ("FunnelModel", "FunnelBaseModel"):
        _funnel(p, "", "", cfg, arch == "FunnelModel", sd)
    elif arch == "FunnelForMaskedLM":
        _funnel(p, "funnel.", "funnel.", cfg, True, sd)
        sd["lm_head.weight"] = p["funnel.embeddings.word_embeddings"]
        sd["lm_head.bias"] = p["lm_head.bias"]
    elif arch == "FunnelForPreTraining":
        _funnel(p, "funnel.", "funnel.", cfg, True, sd)
        _linear(p, "discriminator_predictions.dense", "discriminator_predictions.dense", sd)
        d = "discriminator_predictions.dense_prediction"
        sd[d + ".weight"] = p[d + ".kernel"].reshape(1, -1)
        sd[d + ".bias"] = p[d + ".bias"].reshape(1)
    elif arch in ("FunnelForSequenceClassification", "FunnelForMultipleChoice"):
        _funnel(p, "funnel.", "funnel.", cfg, False, sd)
        _linear(p, "classifier.linear_hidden", "classifier.linear_hidden", sd)
        _linear(p, "classifier.linear_out", "classifier.linear_out", sd)
        num_labels = int(sd["classifier.linear_out.weight"].shape[0]) if arch.endswith("Classification") else 1
    elif arch == "FunnelForTokenClassification":
        _funnel(p, "funnel.", "funnel.", cfg, True, sd)
        _linear(p, "classifier", "classifier", sd)
        num_labels = int(sd["classifier.weight"].shape[0])
    elif arch == "FunnelForQuestionAnswering":
        _funnel(p, "funnel.", "funnel.", cfg, True, sd)
        _linear(p, "qa_outputs", "qa_outputs", sd)
    else:
        raise ValueError(f"{arch}: no Hugging Face Funnel class")
    return hf_config(cfg, arch, num_labels), sd
