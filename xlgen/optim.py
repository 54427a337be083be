"""Optimizer and learning-rate schedule (optax), as in the original XLNet / Funnel / Transformer-XL code.

    lr(t) = peak * t / warmup                                   t < warmup
          = decay(peak -> peak * min_lr_ratio over total - warmup steps)   (linear | poly | cosine | constant)

    chain: clip_by_global_norm(clip) -> [faithful: grad *= layer_scale] -> Adam(b1, b2, eps)
           -> + weight_decay * param (masked: no decay on LayerNorm and any "*bias*" parameter, as BERT/XLNet)
           -> * lr(t) -> [lr mode: * layer_scale] -> * -1

Layer-wise learning-rate decay: layer l of L gets `rate ** (L - 1 - l)` (top layer 1.0, as XLNet/Funnel); parameters
outside the layer stack (embeddings, heads) get 1.0. Two semantics:

* `layer_decay_mode="lr"` (default): a true per-layer learning rate — the scale multiplies the final update.
* `layer_decay_mode="faithful"`: scales the clipped *gradients* before Adam, exactly what `xlnet/model_utils.py`
  and Funnel's `optimization.py` do. Adam divides by sqrt(v) of the same scaled gradient, so a constant per-tensor
  gradient scale cancels except against epsilon: this mode is nearly a no-op and exists for parity experiments.

Parameters live in a flat dict {dotted_name: array}; stacked layers (a leading `layers` logical axis) get a
per-row scale vector.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

NO_DECAY_PATTERN = re.compile(r"(bias|layer_norm|layernorm|LayerNorm|\bnorm\b|_norm\.)")


def make_schedule(opt_cfg, total_steps: int) -> optax.Schedule:
    peak = float(opt_cfg.learning_rate)
    warmup = int(opt_cfg.warmup_steps)
    floor = peak * float(opt_cfg.min_lr_ratio)
    decay_steps = max(int(total_steps) - warmup, 1)
    kind = opt_cfg.schedule
    if kind in ("linear", "poly"):
        power = 1.0 if kind == "linear" else float(opt_cfg.poly_power)
        decay = optax.polynomial_schedule(peak, floor, power, decay_steps)
    elif kind == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=float(opt_cfg.min_lr_ratio))
    elif kind == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise ValueError(f"optimizer.schedule={kind!r}: expected linear, poly, cosine or constant")
    if warmup <= 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def weight_decay_mask(names: Sequence[str]) -> Dict[str, bool]:
    """True where weight decay applies: everything except LayerNorm parameters and biases (incl. r_w_bias...)."""
    return {n: NO_DECAY_PATTERN.search(n) is None for n in names}


def layer_scales(meta: Dict[str, Tuple[Tuple[int, ...], Tuple]], layer_of: Callable[[str], Optional[int]],
                 n_layer: int, rate: float) -> Dict[str, np.ndarray]:
    """Per-parameter multiplier `rate ** (n_layer - 1 - l)`; a vector over rows for stacked (`layers`) params."""
    out = {}
    for name, (shape, axes) in meta.items():
        if rate == 1.0:
            out[name] = np.float32(1.0)
            continue
        if axes and "layers" in axes:
            ax = list(axes).index("layers")
            rows = rate ** (n_layer - 1 - np.arange(shape[ax], dtype=np.float64))
            bshape = [1] * len(shape)
            bshape[ax] = shape[ax]
            out[name] = rows.reshape(bshape).astype(np.float32)
            continue
        l = layer_of(name)
        out[name] = np.float32(1.0 if l is None else rate ** (n_layer - 1 - l))
    return out


def scale_by_tree(scales: Dict[str, np.ndarray]) -> optax.GradientTransformation:
    """Multiply each leaf by a fixed (broadcastable) constant."""
    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return {k: u * jnp.asarray(scales[k], u.dtype) for k, u in updates.items()}, state

    return optax.GradientTransformation(init, update)


def make_optimizer(opt_cfg, total_steps: int, meta: Dict[str, Tuple[Tuple[int, ...], Tuple]],
                   layer_of: Callable[[str], Optional[int]] = lambda name: None,
                   n_layer: int = 1) -> Tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax transformation for flat-dict params with metadata {name: (shape, logical_axes)}."""
    schedule = make_schedule(opt_cfg, total_steps)
    if opt_cfg.name not in ("adamw", "adam"):
        raise ValueError(f"optimizer.name={opt_cfg.name!r}: expected adamw or adam")
    rate = float(opt_cfg.lr_layer_decay_rate)
    mode = opt_cfg.layer_decay_mode
    if mode not in ("lr", "faithful"):
        raise ValueError(f"optimizer.layer_decay_mode={mode!r}: expected 'lr' or 'faithful'")
    scales = layer_scales(meta, layer_of, n_layer, rate)
    parts = []
    if float(opt_cfg.clip_norm) > 0:
        parts.append(optax.clip_by_global_norm(float(opt_cfg.clip_norm)))
    if rate != 1.0 and mode == "faithful":
        parts.append(scale_by_tree(scales))
    parts.append(optax.scale_by_adam(b1=float(opt_cfg.b1), b2=float(opt_cfg.b2), eps=float(opt_cfg.eps)))
    wd = float(opt_cfg.weight_decay)
    if wd > 0 and opt_cfg.name == "adamw":
        parts.append(optax.add_decayed_weights(wd, mask=weight_decay_mask(list(meta))))
    parts.append(optax.scale_by_learning_rate(schedule))
    if rate != 1.0 and mode == "lr":
        parts.append(scale_by_tree(scales))
    return optax.chain(*parts), schedule
