"""Funnel-Transformer (Dai et al., 2020): `model` (config, pooling encoder, decoder, MLM), `heads` (ELECTRA,
finetuning heads, objectives), `hf` (Hugging Face loading), `cost` (analytic FLOPs and parameter counts),
`numbering` (layers for LR decay) and `family` (the registry record)."""

from xlgen.models.funnel.heads import (
    FunnelElectra,
    FunnelForMultipleChoice,
    FunnelForPreTraining,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    electra_loss,
    mlm_loss,
)
from xlgen.models.funnel.hf import HFFunnel, from_hf
from xlgen.models.funnel.model import FunnelBaseModel, FunnelConfig, FunnelForMaskedLM, FunnelModel

__all__ = [
    "FunnelBaseModel",
    "FunnelConfig",
    "FunnelElectra",
    "FunnelForMaskedLM",
    "FunnelForMultipleChoice",
    "FunnelForPreTraining",
    "FunnelForQuestionAnswering",
    "FunnelForSequenceClassification",
    "FunnelModel",
    "HFFunnel",
    "electra_loss",
    "from_hf",
    "mlm_loss",
]
