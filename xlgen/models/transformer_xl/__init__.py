"""Transformer-XL (Dai et al., 2019): `model` (config, segment-recurrent LM, Hugging Face loading); the adaptive
softmax it uses is shared in `xlgen.models.adaptive_softmax`."""

from xlgen.models.transformer_xl.model import (
    TransformerXLConfig,
    TransformerXLLM,
    TransfoXLPretrained,
    attention_mask,
    count_params,
    from_hf,
    load_params,
)

__all__ = [
    "TransfoXLPretrained",
    "TransformerXLConfig",
    "TransformerXLLM",
    "attention_mask",
    "count_params",
    "from_hf",
    "load_params",
]
