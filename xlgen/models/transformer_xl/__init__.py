"""Transformer-XL (Dai et al., 2019): `model` (config, segment-recurrent LM), `pretrained` (HF calling convention and evaluation cache), `hf` (Hugging
Face loading), `cost` (analytic FLOPs) and `family` (the registry record); the adaptive softmax it uses is shared in
`xlgen.models.adaptive_softmax`."""

from xlgen.models.transformer_xl.hf import from_hf
from xlgen.models.transformer_xl.model import (
    TransformerXLConfig,
    TransformerXLLM,
    attention_mask,
    count_params,
    from_params,
)
from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained

__all__ = [
    "TransfoXLPretrained",
    "TransformerXLConfig",
    "TransformerXLLM",
    "attention_mask",
    "count_params",
    "from_hf",
    "from_params",
]
