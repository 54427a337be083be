"""The Transformer-XL family record (`xlgen.registry`)."""

from __future__ import annotations

import dataclasses

from xlgen.bench.hf import HFBench
from xlgen.deploy import Stream
from xlgen.models.cost import FlopCount
from xlgen.models.family import Family
from xlgen.models.numbering import layer_stack_ids
from xlgen.models.transformer_xl import hf_bench, tf_import
from xlgen.models.transformer_xl.cost import train_flops
from xlgen.models.transformer_xl.hf import from_hf
from xlgen.models.transformer_xl.hf_export import to_hf
from xlgen.models.transformer_xl.model import TransformerXLConfig, TransformerXLLM
from xlgen.models.transformer_xl.objectives import TXL_LM
from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained
from xlgen.pretrained import Interop, TFImport


def _wrap(module: TransformerXLLM, kwargs) -> TransfoXLPretrained:
    """A trained LM with HF's TransfoXLLMHeadModel calling convention; kwargs override config fields (mem_len...)."""
    if kwargs:
        module.config = dataclasses.replace(module.config, **kwargs)
    return TransfoXLPretrained(module)


def _stream_step(module: TransformerXLLM, input_ids, mems, mem_valid):
    """log-probs `[b, l, V]` and the memory after this segment (fixed-length buffer, `mem_valid` rows real)."""
    return module(input_ids, mems, mem_valid=mem_valid)[:2]


def _memory(module: TransformerXLLM):
    c = module.config
    return c.n_layer, c.mem_len, c.d_model


FAMILY = Family(
    name="transformer_xl",
    config_class=TransformerXLConfig,
    default_objective="txl_lm",
    objectives={TXL_LM.name: TXL_LM},
    models={"lm": TransformerXLLM},
    layer_ids=layer_stack_ids,
    records=(
        Interop(hf_model_type="transfo-xl", from_hf=from_hf, to_hf=to_hf, wrap=_wrap, from_tf=TFImport(tf_import.load)),
        FlopCount(train_flops),
        HFBench(memory_lm=hf_bench.memory_lm, load_memory_lm=hf_bench.load_memory_lm),
        Stream(scores="log_probs", step=_stream_step, memory=_memory),
    ),
)
