"""XLNet -> Hugging Face XLNet classes (transformers 4.34.1): the inverse of `xlnet.hf.hf_to_xlgen` /
`XLNetConfig.from_hf`, for `XLNetModel`, `XLNetLMHeadModel` and the finetuning heads (sequence classification,
multiple choice, question answering).

`bi_data` is exported off: it describes how pretraining batches were read, not the model, and HF's XLNet with
`bi_data=True` splits every batch into forward and backward halves (batch 1 -> no rows).

Attention kernels keep HF's `[d_model, n, d_head]` layout; the output kernel `[n, d_head, d]` goes back to
`[d, n, d_head]`; Linear kernels are transposed to torch's (out, in). Shared u/v/s biases (`untie_r=False`) are
copied into every layer (HF always holds them per layer; the result is the same model).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from xlgen.models.params import flat_params


def hf_config(config, architecture: str) -> Dict[str, Any]:
    """HF `XLNetConfig` dict (architecture and head fields) of an `XLNetConfig`."""
    c = config
    if c.d_model != c.n_head * c.d_head:
        raise ValueError(
            f"XLNet d_model={c.d_model} != n_head={c.n_head} x d_head={c.d_head}: HF XLNetConfig derives "
            "d_head = d_model // n_head, so this model has no HF equivalent"
        )
    n_labels = 1 if architecture == "XLNetForMultipleChoice" else int(c.num_labels)
    out = {
        "architectures": [architecture],
        "model_type": "xlnet",
        "vocab_size": int(c.vocab_size),
        "d_model": int(c.d_model),
        "n_layer": int(c.n_layer),
        "n_head": int(c.n_head),
        "d_head": int(c.d_head),
        "d_inner": int(c.d_inner),
        "ff_activation": c.ff_activation,
        "untie_r": True,  # HF keeps the biases per layer (shared ones are copied into each layer)
        "attn_type": c.attn_type,
        "initializer_range": float(c.initializer_range),
        "layer_norm_eps": float(c.layer_norm_eps),
        "dropout": float(c.dropout),
        "mem_len": c.mem_len or None,
        "reuse_len": c.reuse_len or None,
        "use_mems_eval": True,
        "use_mems_train": False,
        # bi_data is a pretraining data layout (half the batch read backwards); HF applies it at inference too,
        # where batch 1 then has no rows (logits of shape (0, l, V)): exports carry the inference semantics.
        "bi_data": False,
        "clamp_len": int(c.clamp_len),
        "same_length": bool(c.same_length),
        "summary_type": c.summary_type,
        "summary_use_proj": bool(c.summary_use_proj),
        "summary_activation": c.summary_activation,
        "summary_proj_to_labels": bool(c.summary_proj_to_labels),
        "summary_last_dropout": float(c.summary_last_dropout),
        "start_n_top": int(c.start_n_top),
        "end_n_top": int(c.end_n_top),
        "pad_token_id": 5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    out["id2label"] = {str(i): f"LABEL_{i}" for i in range(n_labels)}
    out["label2id"] = {f"LABEL_{i}": i for i in range(n_labels)}
    return out


def _linear(p: Dict[str, np.ndarray], src: str, dst: str, sd: Dict[str, np.ndarray]) -> None:
    """xlgen Dense `src` (kernel [in..., out]) -> torch Linear `dst` (weight [out, in])."""
    kernel = p[src + ".kernel"]
    sd[dst + ".weight"] = kernel.reshape(-1, kernel.shape[-1]).T
    if src + ".bias" in p:
        sd[dst + ".bias"] = p[src + ".bias"]


def to_hf(module) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(HF config, state dict) of an xlgen XLNet module; the HF class is the module's class name."""
    arch = type(module).__name__
    c = module.config
    core = "" if arch == "XLNetModel" else "transformer."
    p = flat_params(module, sep=".", scanned=(core + "layers",) if c.scan_layers else ())
    hf_core = "" if arch == "XLNetModel" else "transformer."
    sd: Dict[str, np.ndarray] = {
        hf_core + "word_embedding.weight": p[core + "word_embedding"],
        hf_core + "mask_emb": p[core + "mask_emb"].reshape(1, 1, -1),
    }
    for i in range(c.n_layer):
        src, dst = f"{core}layers.{i}.", f"{hf_core}layer.{i}."
        for n in ("q", "k", "v", "r"):
            sd[dst + f"rel_attn.{n}"] = p[src + f"rel_attn.{n}.kernel"]
        sd[dst + "rel_attn.o"] = np.transpose(p[src + "rel_attn.o.kernel"], (2, 0, 1))
        for n in ("r_w_bias", "r_r_bias", "r_s_bias"):
            sd[dst + f"rel_attn.{n}"] = p[src + f"rel_attn.{n}"] if c.untie_r else p[core + n]
        sd[dst + "rel_attn.seg_embed"] = p[src + "rel_attn.seg_embed"]
        for ln in ("rel_attn.layer_norm", "ff.layer_norm"):
            sd[dst + ln + ".weight"], sd[dst + ln + ".bias"] = p[src + ln + ".scale"], p[src + ln + ".bias"]
        for n in ("layer_1", "layer_2"):
            sd[dst + f"ff.{n}.weight"] = p[src + f"ff.{n}.kernel"].T
            sd[dst + f"ff.{n}.bias"] = p[src + f"ff.{n}.bias"]
    if arch == "XLNetLMHeadModel":
        sd["lm_loss.weight"] = p["transformer.word_embedding"]  # tied
        sd["lm_loss.bias"] = p["lm_bias"]
    elif arch in ("XLNetForSequenceClassification", "XLNetForMultipleChoice"):
        if c.summary_use_proj:
            _linear(p, "sequence_summary.summary", "sequence_summary.summary", sd)
        _linear(p, "logits_proj", "logits_proj", sd)
    elif arch == "XLNetForTokenClassification":
        _linear(p, "classifier", "classifier", sd)
    elif arch == "XLNetForQuestionAnswering":
        _linear(p, "start_logits.dense", "start_logits.dense", sd)
        _linear(p, "end_logits.dense_0", "end_logits.dense_0", sd)
        sd["end_logits.LayerNorm.weight"] = p["end_logits.layer_norm.scale"]
        sd["end_logits.LayerNorm.bias"] = p["end_logits.layer_norm.bias"]
        _linear(p, "end_logits.dense_1", "end_logits.dense_1", sd)
        _linear(p, "answer_class.dense_0", "answer_class.dense_0", sd)
        _linear(p, "answer_class.dense_1", "answer_class.dense_1", sd)
    elif arch != "XLNetModel":
        raise ValueError(f"{arch}: no Hugging Face XLNet class")
    return hf_config(c, arch), sd
