"""Funnel's counterpart in `xlgen bench --compare-hf`: `FunnelForMaskedLM` (transformers 4.34.1) of the same
dimensions doing the MLM training step on the pipeline's own batches (labels outside the masked positions set to
-100). ELECTRA has no HF counterpart here."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from xlgen.models.family import model_config


def train_model(config):
    import transformers

    from xlgen.models.funnel.hf_export import hf_config
    from xlgen.models.funnel.model import FunnelConfig
    from xlgen.models.funnel.objectives import FUNNEL_MLM

    if (config.objective or FUNNEL_MLM.name) != FUNNEL_MLM.name:
        raise ValueError(
            f"objective={config.objective!r} has no Hugging Face counterpart in the bench (funnel_mlm has)"
        )
    cfg = model_config(FunnelConfig, config.model)
    return transformers.FunnelForMaskedLM(transformers.FunnelConfig(**hf_config(cfg, "FunnelForMaskedLM")))


def train_inputs(batch, config) -> Dict[str, Any]:
    labels = np.array(batch["labels"], np.int64)
    labels[np.asarray(batch["label_mask"]) == 0] = -100
    return dict(
        input_ids=np.asarray(batch["input_ids"], np.int64),
        token_type_ids=np.asarray(batch["token_type_ids"], np.int64),
        attention_mask=np.asarray(batch["attention_mask"], np.int64),
        labels=labels,
    )
