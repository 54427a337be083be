"""XLNet (Yang et al., 2019): `model` (config, two-stream core, LM head, Hugging Face loading) and `heads`
(finetuning heads: classification, multiple choice, SQuAD)."""

from xlgen.models.xlnet.heads import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForSequenceClassification,
    squad_loss,
)
from xlgen.models.xlnet.model import XLNetConfig, XLNetFromHF, XLNetLMHeadModel, XLNetModel, from_hf, materialize

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
