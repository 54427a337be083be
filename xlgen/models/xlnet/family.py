"""The XLNet family record (`xlgen.registry`)."""

from __future__ import annotations

from xlgen.bench.hf import HFBench
from xlgen.deploy import Stream
from xlgen.finetune.record import Finetuning
from xlgen.models.cost import FlopCount
from xlgen.models.family import Family
from xlgen.models.numbering import layer_stack_ids
from xlgen.models.xlnet import hf_bench, tf_import
from xlgen.models.xlnet.cost import train_flops
from xlgen.models.xlnet.heads import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForSequenceClassification,
    XLNetForTokenClassification,
)
from xlgen.models.xlnet.hf import HF_HEADS, XLNetFromHF, from_hf
from xlgen.models.xlnet.hf_export import to_hf
from xlgen.models.xlnet.model import XLNetConfig, XLNetLMHeadModel, XLNetModel
from xlgen.models.xlnet.objectives import XLNET_PLM
from xlgen.pretrained import Interop, TFImport


def _sequence_head(cfg, *, num_labels, answerability, rngs):
    return XLNetForSequenceClassification(cfg, rngs=rngs)  # num_labels is a config field (Finetuning.overrides)


def _wrap(module, kwargs) -> XLNetFromHF:
    """HF-convention caller of a trained module: the HF class of the same name (LM, or a finetuned head)."""
    head = type(module).__name__ if type(module).__name__ in HF_HEADS else "XLNetLMHeadModel"
    return XLNetFromHF(module, head, {"use_mems_eval": True, **kwargs})


def _squad_outputs(model, batch, *, train: bool):
    """Training: start/end logits (ends conditioned on the gold start) and cls_logits; inference: the beam arrays,
    end arrays flattened [b, S, E] -> [b, S*E] (row k*E + j)."""
    kw = dict(
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        p_mask=batch["p_mask"],
        cls_index=batch["cls_index"],
    )
    if train:
        kw["start_positions"] = batch["start_positions"]
    out = model(batch["input_ids"], **kw)
    out = out[0] if isinstance(out, tuple) else out  # XLNet heads return (outputs, new_mems)
    if train:
        return {n: out[n] for n in ("start_logits", "end_logits", "cls_logits")}
    b = out["start_top_index"].shape[0]
    return {
        "start_top_log_probs": out["start_top_log_probs"],
        "start_top_index": out["start_top_index"],
        "end_top_log_probs": out["end_top_log_probs"].reshape(b, -1),
        "end_top_index": out["end_top_index"].reshape(b, -1),
        "cls_logits": out["cls_logits"],
    }


def _stream_step(module: XLNetLMHeadModel, input_ids, mems, mem_valid):
    """LM-head logits `[b, l, V]` of every position (no permutation: each position sees the memory and the segment
    as `attn_type` allows) and the memory after this segment (fixed-length buffer, `mem_valid` rows real)."""
    return module(input_ids, mems=mems, mem_valid=mem_valid)


def _inference(module: XLNetLMHeadModel) -> XLNetLMHeadModel:
    """Pretraining's batch layouts off: no forward/backward batch halves (bi_data), the whole segment kept in the
    memory (reuse_len), as `xlgen export --to-hf` writes the config."""
    import dataclasses

    cfg = dataclasses.replace(module.config, bi_data=False, reuse_len=None)
    module.config = module.transformer.config = cfg
    return module


def _memory(module: XLNetLMHeadModel):
    c = module.config
    return c.n_layer, int(c.mem_len or 0), c.d_model


FAMILY = Family(
    name="xlnet",
    config_class=XLNetConfig,
    default_objective="xlnet_plm",
    objectives={XLNET_PLM.name: XLNET_PLM},
    models={"lm": XLNetLMHeadModel, "base": XLNetModel},
    layer_ids=layer_stack_ids,
    records=(
        Finetuning(
            heads={
                "classification": _sequence_head,
                "regression": _sequence_head,
                "multiple_choice": lambda cfg, *, num_labels, answerability, rngs: XLNetForMultipleChoice(
                    cfg, rngs=rngs
                ),
                "squad": lambda cfg, *, num_labels, answerability, rngs: XLNetForQuestionAnswering(cfg, rngs=rngs),
                "token_classification": lambda cfg, *, num_labels, answerability, rngs: XLNetForTokenClassification(
                    cfg, rngs=rngs
                ),
            },
            input_style="cls_last",
            squad_outputs=_squad_outputs,
            # one segment per example, no recurrence memory, no bidirectional pipeline
            overrides=lambda num_labels: dict(num_labels=num_labels, mem_len=None, reuse_len=None, bi_data=False),
            segment_heads=("classification", "regression", "multiple_choice"),
        ),
        Interop(
            hf_model_type="xlnet",
            from_hf=from_hf,
            to_hf=to_hf,
            wrap=_wrap,
            from_tf=TFImport(load=tf_import.load, original_config=tf_import.original_config),
        ),
        FlopCount(train_flops),
        HFBench(train_model=hf_bench.train_model, train_inputs=hf_bench.train_inputs, carries_mems=True),
        Stream(scores="logits", step=_stream_step, memory=_memory, prepare=_inference),
    ),
)
