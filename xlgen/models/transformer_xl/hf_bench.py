"""Transformer-XL's counterpart in `xlgen bench --compare-hf --eval | --generate`: a random-weight
`TransfoXLLMHeadModel` (transformers 4.34.1) of the config's dimensions, written as a HF directory that both
`xlgen.from_pretrained(dir, mem_len=M)` and transformers load, so both sides evaluate the same weights."""

from __future__ import annotations

import os

from xlgen.models.family import model_config


def memory_lm(config, root: str) -> str:
    import torch
    import transformers

    from xlgen.models.transformer_xl.hf_export import hf_config
    from xlgen.models.transformer_xl.model import TransformerXLConfig

    torch.manual_seed(0)
    hcfg = {**hf_config(model_config(TransformerXLConfig, config.model)), "dropout": 0.0, "dropatt": 0.0}
    model = transformers.TransfoXLLMHeadModel(transformers.TransfoXLConfig(**hcfg))
    path = os.path.join(root, "hf_txl")
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_memory_lm(path: str, mem_len: int):
    import transformers

    model = transformers.TransfoXLLMHeadModel.from_pretrained(path).eval()
    model.reset_memory_length(mem_len)
    return model
