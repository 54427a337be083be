"""XLNet (Yang et al., 2019): `model` (config, two-stream core, LM head), `heads` (finetuning heads:
classification, multiple choice, SQuAD), `hf` (Hugging Face loading), `cost` (analytic FLOPs) and `family` (the
registry record)."""

from xlgen.models.params import materialize
from xlgen.models.xlnet.heads import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForSequenceClassification,
    squad_loss,
)
from xlgen.models.xlnet.hf import XLNetFromHF, from_hf
from xlgen.models.xlnet.model import XLNetConfig, XLNetLMHeadModel, XLNetModel

__all__ = [
    "XLNetConfig",
    "XLNetFromHF",
    "XLNetForMultipleChoice",
    "XLNetForQuestionAnswering",
    "XLNetForSequenceClassification",
    "XLNetLMHeadModel",
    "XLNetModel",
    "from_hf",
    "materialize",
    "squad_loss",
]
