"""The Funnel-Transformer family record (`xlgen.registry`)."""

from __future__ import annotations

from xlgen.bench.hf import HFBench
from xlgen.finetune.record import Finetuning
from xlgen.models.cost import FlopCount
from xlgen.models.family import Family
from xlgen.models.funnel import hf_bench, tf_import
from xlgen.models.funnel.cost import train_flops
from xlgen.models.funnel.heads import (
    FunnelElectra,
    FunnelForMultipleChoice,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    FunnelForTokenClassification,
)
from xlgen.models.funnel.hf import HF_CLASSES, HFFunnel, from_hf
from xlgen.models.funnel.hf_export import to_hf
from xlgen.models.funnel.model import FunnelBaseModel, FunnelConfig, FunnelForMaskedLM, FunnelModel
from xlgen.models.funnel.numbering import layer_ids
from xlgen.models.funnel.objectives import FUNNEL_ELECTRA, FUNNEL_MLM
from xlgen.pretrained import Interop, TFImport


def _sequence_head(cfg, *, num_labels, answerability, rngs):
    return FunnelForSequenceClassification(cfg, num_labels, rngs=rngs)


def _wrap(module, kwargs) -> HFFunnel:
    """HF-convention caller of a trained module: an ELECTRA model's discriminator (FunnelForPreTraining, the model
    that gets finetuned), else the HF class of the same name (MLM, or a finetuned head)."""
    if hasattr(module, "discriminator"):
        return HFFunnel(module.discriminator, "FunnelForPreTraining")
    name = type(module).__name__
    return HFFunnel(module, name if name in HF_CLASSES else "FunnelForMaskedLM")


def _squad_outputs(model, batch, *, train: bool):
    """start/end logits (and cls_logits with the answerability head), training and inference alike."""
    out = model(
        batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        p_mask=batch["p_mask"],
        cls_index=batch["cls_index"],
    )
    res = {"start_logits": out.start_logits, "end_logits": out.end_logits}
    if out.cls_logits is not None:
        res["cls_logits"] = out.cls_logits
    return res


FAMILY = Family(
    name="funnel",
    config_class=FunnelConfig,
    default_objective=FUNNEL_MLM.name,
    objectives={FUNNEL_MLM.name: FUNNEL_MLM, FUNNEL_ELECTRA.name: FUNNEL_ELECTRA},
    models={"mlm": FunnelForMaskedLM, "electra": FunnelElectra, "base": FunnelBaseModel, "model": FunnelModel},
    layer_ids=layer_ids,
    records=(
        Finetuning(
            heads={
                "classification": _sequence_head,
                "regression": _sequence_head,
                "multiple_choice": lambda cfg, *, num_labels, answerability, rngs: FunnelForMultipleChoice(
                    cfg, rngs=rngs
                ),
                "squad": lambda cfg, *, num_labels, answerability, rngs: FunnelForQuestionAnswering(
                    cfg, answerability=answerability, rngs=rngs
                ),
                "token_classification": lambda cfg, *, num_labels, answerability, rngs: FunnelForTokenClassification(
                    cfg, num_labels, rngs=rngs
                ),
            },
            input_style="cls_first",
            squad_outputs=_squad_outputs,
        ),
        Interop(
            hf_model_type="funnel",
            from_hf=from_hf,
            to_hf=to_hf,
            wrap=_wrap,
            # FunnelTokenizer's own defaults are <unk>, <sep>, ...: name the vocab.txt pieces
            hf_wordpiece={"tokenizer_class": "FunnelTokenizer", "bos_token": "[CLS]", "eos_token": "[SEP]"},
            from_tf=TFImport(load=tf_import.load, original_config=tf_import.original_config),
        ),
        FlopCount(train_flops),
        HFBench(train_model=hf_bench.train_model, train_inputs=hf_bench.train_inputs),
    ),
)
