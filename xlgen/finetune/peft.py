"""Parameter-efficient finetuning: the config side of freezing (`finetune.freeze`) and LoRA (`finetune.lora.*`).

    finetune.freeze           regex over dotted parameter names; matches leave the optimizer (no gradient, no
                              state) and stay bit-identical (`xlgen.train.optim.frozen_parameters`)
    finetune.lora.rank        0 = off; r > 0: adapters (`xlgen.models.lora`) on the Dense projections matching
    finetune.lora.targets     (regex over module paths), scaled by
    finetune.lora.alpha       / rank; every non-adapter parameter is frozen except those matching
    finetune.lora.trainable   (default: the task head)

A LoRA run's checkpoints hold the trainable parameters (adapters, head) in `params` and the frozen base in
`frozen`; `merged_params` / `merged_model` fold the adapters into the weights (`xlgen export --to-hf`, `init_from`).
"""

from __future__ import annotations

import copy
from typing import Dict, Optional

import numpy as np


def lora_rank(config) -> int:
    return int(config.finetune.lora.rank) if "finetune" in config else 0


def lora_scale(config) -> Optional[float]:
    """alpha / rank of the config's adapters; None when it has none."""
    rank = lora_rank(config)
    return float(config.finetune.lora.alpha) / rank if rank > 0 else None


def attach_adapters(model, config, rngs):
    """`model` with the config's LoRA adapters attached (unchanged when `finetune.lora.rank` is 0 or absent)."""
    rank = lora_rank(config)
    if rank > 0:
        from xlgen.models.lora import attach

        lora = config.finetune.lora
        attach(model, rank=rank, alpha=float(lora.alpha), targets=str(lora.targets), rngs=rngs)
    return model


def merged_params(config, params: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The flat parameters with the adapters folded into their kernels (unchanged without LoRA)."""
    scale = lora_scale(config)
    if scale is None:
        return params
    from xlgen.models.lora import merge

    return merge({n: np.asarray(v) for n, v in params.items()}, scale)


def without_lora(config):
    """A copy of `config` with LoRA off (the architecture the merged parameters belong to)."""
    config = copy.deepcopy(config)
    with config.unlocked():
        config.finetune.lora.rank = 0
    return config


def merged_model(config, program, params):
    """The eval-mode model without adapters holding the merged parameters (what `xlgen export --to-hf` writes)."""
    from flax import nnx

    from xlgen.models.params import concrete_rest, materialize

    plain = without_lora(config)
    model = nnx.eval_shape(lambda: program.objective.make_model(plain, nnx.Rngs(params=0, dropout=1, sample=2), False))
    model.eval()
    _, _, rest = nnx.split(model, nnx.Param, ...)
    return materialize(model, merged_params(config, params), rest=concrete_rest(rest))
