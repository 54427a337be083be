"""XLNet and Hugging Face (transformers 4.34.1): loading HF checkpoints into xlgen modules (`from_hf`, the
`xlgen.from_pretrained` loader) and the HF-convention caller `XLNetFromHF`.

Weights map onto xlgen's layout (attention `[d, n, d_head]`, output `[n, d_head, d]`, Linear weights transposed)
and go into the module through `xlgen.models.params.materialize` (no random initialisation).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
from flax import nnx

from xlgen.models.params import FrozenCall, materialize
from xlgen.models.xlnet.heads import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForSequenceClassification,
    XLNetForTokenClassification,
    squad_loss,
)
from xlgen.models.xlnet.model import XLNetConfig, XLNetLMHeadModel, XLNetModel


def _hf_layer(w: Dict[str, np.ndarray], i: int) -> Dict[str, np.ndarray]:
    """HF layer i weights in xlgen layout (attention `[d,n,dh]`, output `[n,dh,d]`, Linear weights transposed)."""
    p = f"layer.{i}."
    a = {f"rel_attn.{n}.kernel": w[p + f"rel_attn.{n}"] for n in ("q", "k", "v", "r")}
    a["rel_attn.o.kernel"] = np.transpose(w[p + "rel_attn.o"], (1, 2, 0))
    for n in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        a[f"rel_attn.{n}"] = w[p + f"rel_attn.{n}"]
    for src, dst in (("rel_attn.layer_norm", "rel_attn.layer_norm"), ("ff.layer_norm", "ff.layer_norm")):
        a[dst + ".scale"], a[dst + ".bias"] = w[p + src + ".weight"], w[p + src + ".bias"]
    for n in ("layer_1", "layer_2"):
        a[f"ff.{n}.kernel"], a[f"ff.{n}.bias"] = w[p + f"ff.{n}.weight"].T, w[p + f"ff.{n}.bias"]
    return a


def _hf_linear(w, src: str, dst: str, out: dict, in_shape=None):
    """HF nn.Linear `src` (weight [out, in]) -> xlgen Dense `dst` (kernel [in..., out], bias)."""
    kernel = w[src + ".weight"].T
    out[dst + ".kernel"] = kernel if in_shape is None else kernel.reshape(tuple(in_shape) + kernel.shape[1:])
    if src + ".bias" in w:
        out[dst + ".bias"] = w[src + ".bias"]


def hf_to_xlgen(head: str, config: XLNetConfig, weights: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """HF XLNet state dict -> {xlgen dotted parameter path: array} for module class `head`."""
    if head == "XLNetModel" and not any(k.startswith("transformer.") for k in weights):
        core, prefix = dict(weights), ""
    else:
        core = {k[len("transformer.") :]: v for k, v in weights.items() if k.startswith("transformer.")}
        prefix = "" if head == "XLNetModel" else "transformer."
        if not core:
            raise ValueError(f"{head}: no 'transformer.*' weights in the checkpoint")
    out = {prefix + "word_embedding": core["word_embedding.weight"], prefix + "mask_emb": core["mask_emb"].reshape(-1)}
    layers = [_hf_layer(core, i) for i in range(config.n_layer)]
    for name in layers[0]:
        if config.scan_layers:
            out[f"{prefix}layers.{name}"] = np.stack([a[name] for a in layers])
        else:
            out.update({f"{prefix}layers.{i}.{name}": a[name] for i, a in enumerate(layers)})
    w, d = weights, config.d_model
    if head == "XLNetLMHeadModel":
        out["lm_bias"] = w["lm_loss.bias"]
        if "lm_loss.weight" in w and not np.array_equal(w["lm_loss.weight"], core["word_embedding.weight"]):
            raise ValueError("lm_loss.weight differs from the word embedding; xlgen's XLNet LM head is tied")
    elif head in ("XLNetForSequenceClassification", "XLNetForMultipleChoice"):
        if "sequence_summary.summary.weight" in w:
            _hf_linear(w, "sequence_summary.summary", "sequence_summary.summary", out)
        _hf_linear(w, "logits_proj", "logits_proj", out)
    elif head == "XLNetForTokenClassification":
        _hf_linear(w, "classifier", "classifier", out)
    elif head == "XLNetForQuestionAnswering":
        _hf_linear(w, "start_logits.dense", "start_logits.dense", out)
        _hf_linear(w, "end_logits.dense_0", "end_logits.dense_0", out, in_shape=(2, d))
        out["end_logits.layer_norm.scale"] = w["end_logits.LayerNorm.weight"]
        out["end_logits.layer_norm.bias"] = w["end_logits.LayerNorm.bias"]
        _hf_linear(w, "end_logits.dense_1", "end_logits.dense_1", out)
        _hf_linear(w, "answer_class.dense_0", "answer_class.dense_0", out, in_shape=(2, d))
        _hf_linear(w, "answer_class.dense_1", "answer_class.dense_1", out)
    return out


_CLASSES = {
    cls.__name__: cls
    for cls in (
        XLNetModel,
        XLNetLMHeadModel,
        XLNetForSequenceClassification,
        XLNetForQuestionAnswering,
        XLNetForMultipleChoice,
        XLNetForTokenClassification,
    )
}
HF_HEADS = tuple(_CLASSES)


def module_class(name: str):
    """xlgen module class for a HF architecture name."""
    return _CLASSES[name]


def load_hf(head: str, config: XLNetConfig, weights: Dict[str, np.ndarray]):
    """Build xlgen module `head` holding the HF `weights` (no random init)."""
    values = hf_to_xlgen(head, config, weights)
    abstract = nnx.eval_shape(lambda: module_class(head)(config, rngs=nnx.Rngs(0)))

    def lookup(name, shape):
        if name not in values:
            raise KeyError(f"{head}: the checkpoint has no weight for xlgen parameter {name!r}")
        return values.pop(name)

    model = materialize(abstract, lookup)
    if values:
        raise ValueError(f"{head}: checkpoint weights not used by the model: {sorted(values)}")
    return model


class HFOutput(dict):
    """Dict with attribute access, carrying HF output names (`.logits`, `.mems`, ...)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class XLNetFromHF:
    """A loaded HF XLNet checkpoint, callable with HF keyword arguments (NumPy or torch tensors in, NumPy out).

    Matches HF 4.34.1 in eval mode: `use_mems` defaults to `use_mems_eval`; `mems` are HF-layout per-layer
    `[mlen, b, d]` (a tuple, as returned in `.mems`) or an xlgen `[n_layer, b, mlen, d]` array; with `mem_len`
    None/0 the whole history is kept, as HF does. QA inference returns HF's quirky "log probs" (softmax
    probabilities) with end candidates flattened as [b, end_n_top * start_n_top]. `.model` is the xlgen NNX module.
    """

    def __init__(self, model, head: str, hf_config: Dict[str, Any]):
        self.model, self.head, self.hf_config = model, head, hf_config
        self.config: XLNetConfig = model.config
        self.model.eval()
        self._run = FrozenCall(model, lambda module, arrays, static: module(**arrays, **dict(static)), static_argnums=2)

    def __call__(
        self,
        input_ids=None,
        *,
        attention_mask=None,
        mems=None,
        perm_mask=None,
        target_mapping=None,
        token_type_ids=None,
        input_mask=None,
        use_mems=None,
        labels=None,
        start_positions=None,
        end_positions=None,
        is_impossible=None,
        cls_index=None,
        p_mask=None,
        is_forward=None,
        **unsupported,
    ):
        unsupported = {k: v for k, v in unsupported.items() if v is not None and k not in ("return_dict",)}
        if unsupported:
            raise TypeError(
                f"{self.head}: unsupported arguments {sorted(unsupported)} (head_mask, inputs_embeds "
                "and output_* are not implemented)"
            )
        if input_ids is None:
            raise ValueError(f"{self.head}: input_ids is required")
        cfg = self.config
        arrays = {
            k: np.asarray(v)
            for k, v in dict(
                input_ids=input_ids,
                token_type_ids=token_type_ids,
                attention_mask=attention_mask,
                input_mask=input_mask,
                perm_mask=perm_mask,
                target_mapping=target_mapping,
                is_forward=is_forward,
            ).items()
            if v is not None
        }
        for k in ("perm_mask", "target_mapping", "attention_mask", "input_mask"):
            if k in arrays:
                arrays[k] = arrays[k].astype(np.float32)
        training_qa = (
            self.head == "XLNetForQuestionAnswering" and start_positions is not None and end_positions is not None
        )
        if self.head == "XLNetForQuestionAnswering":
            if p_mask is not None:
                arrays["p_mask"] = np.asarray(p_mask, np.float32)
            if cls_index is not None:
                arrays["cls_index"] = np.asarray(cls_index).reshape(-1)
            if training_qa:
                arrays["start_positions"] = np.asarray(start_positions).reshape(-1)
        elif p_mask is not None or cls_index is not None or start_positions is not None:
            raise TypeError(f"{self.head}: p_mask / cls_index / start_positions are QuestionAnswering arguments")

        if mems is not None:
            if isinstance(mems, (list, tuple)):
                mems = np.stack([np.asarray(m) for m in mems]).transpose(0, 2, 1, 3)
            arrays["mems"] = np.asarray(mems, np.float32)
        mlen = 0 if mems is None else arrays["mems"].shape[2]
        use_mems = self.hf_config.get("use_mems_eval", True) if use_mems is None else use_mems
        qlen = arrays["input_ids"].shape[-1]
        if not use_mems:
            mem_len = 0
        elif cfg.mem_len:
            mem_len = cfg.mem_len
        else:  # HF keeps the whole history when mem_len is None/0
            mem_len = mlen + min(cfg.reuse_len or qlen, qlen)
        static = (("mem_len", int(mem_len)),)
        out, new_mems = self._run(arrays, static)
        result = HFOutput()
        if new_mems is not None:
            result["mems"] = tuple(np.asarray(m).transpose(1, 0, 2) for m in new_mems)
        else:
            result["mems"] = None
        self._fill(result, out, labels, start_positions, end_positions, is_impossible, cls_index, training_qa)
        return result

    def _fill(self, result, out, labels, start_positions, end_positions, is_impossible, cls_index, training_qa):
        head = self.head
        if head == "XLNetModel":
            result["last_hidden_state"] = np.asarray(out, np.float32)
        elif head == "XLNetForQuestionAnswering":
            if training_qa:
                o = {k: v for k, v in out.items()}
                start_positions = np.asarray(start_positions).reshape(-1)
                end_positions = np.asarray(end_positions).reshape(-1)
                loss = np.asarray(squad_loss(o, start_positions, end_positions)).mean()
                if cls_index is not None and is_impossible is not None:
                    z = np.asarray(is_impossible, np.float32).reshape(-1)
                    x = np.asarray(o["cls_logits"], np.float64)
                    bce = np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))
                    loss = loss + 0.5 * bce.mean()
                result["loss"] = np.float32(loss)
            else:
                b, s, e = out["end_top_index"].shape
                result["start_top_log_probs"] = np.exp(np.asarray(out["start_top_log_probs"]))
                result["start_top_index"] = np.asarray(out["start_top_index"]).astype(np.int64)
                result["end_top_log_probs"] = (
                    np.exp(np.asarray(out["end_top_log_probs"])).transpose(0, 2, 1).reshape(b, e * s)
                )
                result["end_top_index"] = (
                    np.asarray(out["end_top_index"]).transpose(0, 2, 1).reshape(b, e * s).astype(np.int64)
                )
                result["cls_logits"] = np.asarray(out["cls_logits"])
        else:
            logits = np.asarray(out, np.float32)
            result["logits"] = logits
            if labels is not None:
                result["loss"] = np.float32(_hf_loss(head, self.hf_config, logits, np.asarray(labels)))
        return result


def _hf_loss(head, hf_config, logits, labels):
    """The losses HF computes from `labels` (mean over the batch)."""

    def ce(lg, y):
        lg = lg.reshape(-1, lg.shape[-1]).astype(np.float64)
        y = y.reshape(-1)
        lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        keep = y != -100
        return (lse - lg[np.arange(len(y)), np.where(keep, y, 0)])[keep].mean()

    if head == "XLNetForSequenceClassification":
        problem = hf_config.get("problem_type")
        n = logits.shape[-1]
        if problem is None:
            problem = (
                "regression"
                if n == 1
                else (
                    "single_label_classification"
                    if np.issubdtype(labels.dtype, np.integer)
                    else "multi_label_classification"
                )
            )
        if problem == "regression":
            return np.mean((logits.reshape(labels.shape if n == 1 else logits.shape) - labels) ** 2)
        if problem == "multi_label_classification":
            x, z = logits.astype(np.float64), labels.astype(np.float64)
            return np.mean(np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x))))
    return ce(logits, labels)


def from_hf(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray], kwargs: Dict[str, Any]) -> XLNetFromHF:
    """`xlgen.from_pretrained` loader for HF XLNet directories; the head comes from `architectures`.

    kwargs: XLNetConfig overrides (e.g. `scan_layers=True`, `dtype="bfloat16"`), and `head=` to force a class.
    """
    kwargs = dict(kwargs)
    archs = hf_config.get("architectures") or ["XLNetModel"]
    head = kwargs.pop("head", None) or archs[0]
    if head not in HF_HEADS:
        raise ValueError(
            f"config.json architectures={archs}: unsupported XLNet class {head!r}; supported: {sorted(HF_HEADS)}"
        )
    kwargs.setdefault("answer_class_start", "gold")  # HF's QA training path, for parity with HF outputs
    config = XLNetConfig.from_hf(hf_config, **kwargs)
    return XLNetFromHF(load_hf(head, config, weights), head, hf_config)
