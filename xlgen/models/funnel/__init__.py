"""Funnel-Transformer (Dai et al., 2020): `model` (config, pooling encoder, decoder, MLM), `heads` (ELECTRA,
finetuning heads, objectives, Hugging Face loading) and `cost` (analytic FLOPs and parameter counts)."""

from xlgen.models.funnel.heads import (
    FunnelElectra,
    FunnelForMultipleChoice,
    FunnelForPreTraining,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    HFFunnel,
    electra_loss,
    mlm_loss,
)
from xlgen.models.funnel.model import FunnelBaseModel, FunnelConfig, FunnelForMaskedLM, FunnelModel, from_hf

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
