"""XLNet's counterpart in `xlgen bench --compare-hf`: `XLNetLMHeadModel` (transformers 4.34.1) of the same dimensions
doing the permutation-LM training step on the pipeline's own batches (`perm_mask`, `target_mapping`,
`token_type_ids`, targets), with the memory carried from step to step (`use_mems_train`)."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from xlgen.models.family import model_config


def train_model(config):
    import transformers

    from xlgen.models.xlnet.hf_export import hf_config
    from xlgen.models.xlnet.model import XLNetConfig

    cfg = model_config(XLNetConfig, config.model)
    # the bench trains with the memory carried (export writes an inference config) and the biases as configured
    hcfg = {**hf_config(cfg, "XLNetLMHeadModel"), "use_mems_train": True, "untie_r": bool(cfg.untie_r)}
    return transformers.XLNetLMHeadModel(transformers.XLNetConfig(**hcfg))


def train_inputs(batch, config) -> Dict[str, Any]:
    return dict(
        input_ids=np.asarray(batch["input_ids"], np.int64),
        token_type_ids=np.asarray(batch["token_type_ids"], np.int64),
        perm_mask=np.asarray(batch["perm_mask"], np.float32),
        target_mapping=np.asarray(batch["target_mapping"], np.float32),
        labels=np.asarray(batch["target_ids"], np.int64),
    )
