"""Low-rank adapters (LoRA, Hu et al. 2021) on the `Dense` projections of any xlgen model.

A targeted projection y = x W (+ c), W of shape `in_shape + out_shape`, becomes

    y = x W + (alpha / r) (x A) B (+ c),     A `[prod(in), r]` ~ N(0, 1/prod(in)),   B `[r, prod(out)]` = 0,

stored with the kernel's own axes (A `in_shape + (r,)`, B `(r,) + out_shape`, a scanned stack's leading `layers`
axis kept), so the adapted model starts equal to the base model. The adapters are ordinary `nnx.Param`s of the
`Dense` module (`lora_a`, `lora_b`; flat names `<projection>.lora_a` / `.lora_b`): the trainer differentiates them
like any parameter, and freezing the rest (`xlgen.train.optim.frozen_parameters`) leaves the base weights bit-identical.

    attach(model, rank, alpha, targets, rngs)   adapters on every Dense whose dotted path matches `targets`
    merge(params, scale)                         W + scale * A B folded into each kernel, adapters dropped (export)
    is_adapter(name)                             an adapter's flat parameter name
"""

from __future__ import annotations

import math
import re
from typing import Dict, List

import numpy as np
from flax import nnx

from xlgen.models.layers import Dense, normal, param
from xlgen.models.params import path_name

ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
# defaults of `finetune.lora.targets` (XLNet `rel_attn.{q,k,v,o}`, Funnel `attention.{q,k,v,o}`; the relative-position
# projection `r` left alone) and `finetune.lora.trainable` (the non-adapter parameters that still train: the task
# head, everything outside the backbone `transformer.` / `funnel.`)
TARGETS = r"(rel_attn|attention)[.](q|k|v|o)$"
TRAINABLE = r"^(?!(transformer|funnel)[.])"


def is_adapter(name: str) -> bool:
    return name.endswith(ADAPTER_SUFFIXES)


def attach(model: nnx.Module, *, rank: int, alpha: float, targets: str, rngs: nnx.Rngs) -> List[str]:
    """Give every `Dense` of `model` whose dotted path matches `targets` (`re.search`) a rank-`rank` adapter scaled
    by alpha / rank; returns the adapted paths. No match is an error naming the pattern and some paths."""
    if rank <= 0:
        raise ValueError(f"finetune.lora.rank={rank}: must be > 0 to attach adapters")
    pattern = re.compile(targets)
    dense = [(path_name(p), m) for p, m in nnx.iter_graph(model) if isinstance(m, Dense)]
    hit = [(n, m) for n, m in dense if pattern.search(n)]
    if not hit:
        raise ValueError(
            f"finetune.lora.targets={targets!r}: matches no Dense projection; paths look like "
            f"{[n for n, _ in dense[:4]]}"
        )
    for _, m in hit:
        shape = tuple(m.kernel.shape)
        axes = tuple(m.kernel.get_metadata().get("out_sharding") or (None,) * len(shape))
        lead = len(shape) - m.n_in - m.n_out  # a scanned stack's leading layer axis
        in_shape, out_shape = shape[lead : lead + m.n_in], shape[lead + m.n_in :]
        in_axes, out_axes = axes[lead : lead + m.n_in], axes[lead + m.n_in :]
        m.lora_a = param(
            rngs,
            normal(1.0 / math.sqrt(math.prod(in_shape))),
            shape[:lead] + in_shape + (rank,),
            axes[:lead] + in_axes + (None,),
        )
        m.lora_b = param(
            rngs, nnx.initializers.zeros_init(), shape[:lead] + (rank,) + out_shape, axes[:lead] + (None,) + out_axes
        )
        m.lora_scale = float(alpha) / float(rank)
    return [n for n, _ in hit]


def merge(params: Dict[str, np.ndarray], scale: float) -> Dict[str, np.ndarray]:
    """Flat parameters with every adapter folded into its kernel, W' = W + scale * A B (float32), and the adapter
    entries dropped: the parameters of the same model without adapters (`xlgen export --to-hf`)."""
    out = {n: np.asarray(v) for n, v in params.items() if not is_adapter(n)}
    for name in params:
        if not name.endswith(".lora_a"):
            continue
        base = name[: -len(".lora_a")]
        a, b = np.asarray(params[name], np.float32), np.asarray(params[base + ".lora_b"], np.float32)
        w = out[base + ".kernel"]
        lead = a.ndim + b.ndim - 2 - w.ndim
        r = a.shape[-1]
        a2 = a.reshape(a.shape[:lead] + (-1, r))
        b2 = b.reshape(b.shape[:lead] + (r, -1))
        delta = np.matmul(a2, b2).reshape(w.shape)
        out[base + ".kernel"] = (np.asarray(w, np.float32) + np.float32(scale) * delta).astype(w.dtype)
    return out
