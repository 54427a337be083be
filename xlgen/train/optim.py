"""Optimizer and learning-rate schedule (optax), as in the original XLNet / Funnel / Transformer-XL code.

    lr(t) = peak * t / warmup                                   t < warmup
          = decay(peak -> peak * min_lr_ratio over total - warmup steps)   (linear | poly | cosine | constant)

A resumed run that changes total_steps (extending a finished run: `xlgen train --workdir=DIR
--config.total_steps=N`) never re-warms: from the step S it resumes at, the learning rate decays in the same shape
from lr(S) to the same floor at the new total (`continue_schedule`; recorded in `optimizer.schedule_history`).

    chain: clip_by_global_norm(clip) -> [faithful: grad *= layer_scale] -> Adam(b1, b2, eps) + weight decay
           -> * lr(t) -> [lr mode: * layer_scale] -> * -1
    (`optimizer.name=sgd`: no Adam and no weight decay, the plain SGD update -lr(t) * grad)

Large-batch optimizers (`optimizer.name`), the same chain around them (clipping, layer-wise decay, parameter groups):

* "lamb" (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", 2020): `optax.lamb`'s
  building blocks, u = Adam direction + weight_decay · mask · param, then the layer-wise trust ratio
  u *= ||param|| / ||u|| (`optax.scale_by_trust_ratio`; 1 where either norm is 0), then * lr(t). The trust ratio is
  skipped for the parameters `optimizer.lamb.trust_ratio_mask` excludes: "xlgen" (default) = biases and LayerNorm
  parameters (the reference BERT LAMB's `exclude_from_layer_adaptation`, which defaults to its weight-decay
  exclusion), "original" = the same with r_w/r_r/r_s_bias adapted, "all" = every parameter adapted (= `optax.lamb`).
  Weight decay uses `optimizer.weight_decay` with `optimizer.weight_decay_mask`.
* "adafactor" (Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018):
  `optax.adafactor` with `optimizer.adafactor.*`: `factored` second moments (a matrix's row and column means of g²
  instead of g², for parameters with two dimensions >= `min_dim_size_to_factor`), the decay 1 - t^-`decay_rate`,
  update clipping to block RMS `clipping_threshold` (0 = off), `multiply_by_parameter_scale` (the step relative to
  RMS(param)), `momentum` (0 = no first moment: the memory-saving default), `eps`; weight decay (not scaled by
  lr(t), as in optax) with `optimizer.weight_decay_mask`. `relative_step=True` replaces lr(t) by Adafactor's
  relative step size min(learning_rate, 1/sqrt(t)) (t from 1; `warmup_init=True`: min(1e-6 · t, 1/sqrt(t))), as
  the paper (learning_rate 1e-2) and Hugging Face's `Adafactor(relative_step=True)`.

For both, a scanned stack (parameters with a leading `layers` logical axis) is split per layer: LAMB's trust ratio
and all of Adafactor (factoring, clipping, parameter scale) run on each layer's slice (`per_layer_slices`), so a
scanned model gets the updates of the unscanned one, as the layer-wise decay does. Adafactor's factored moments
(shape of the parameter with one dimension dropped) are sharded like their parameter without that dimension
(`xlgen.sharding.opt_state_shardings`).

Adam update rule (`optimizer.update_rule`):

* "optax" (default): `optax.scale_by_adam` (bias-corrected moments, eps added to sqrt(v_hat)), then
  `+ weight_decay * param` (decoupled), then `* lr(t)`.
* "original": the originals' update, u_t = f_t * (m_t / (sqrt(v_t) + eps) + weight_decay * param) with
  f_t = sqrt(1 - b2^t) / (1 - b1^t) when `bias_correction` else 1, then `* lr(t)`. This is exactly
  `tf.train.AdamOptimizer` (XLNet finetuning and pretraining without weight decay, Transformer-XL: eps is TF's
  "epsilon hat", not bias corrected) with `bias_correction=True`; XLNet's `model_utils.AdamWeightDecayOptimizer`
  (weight decay > 0) with `bias_correction=False`; Funnel's `optimization.AdamWeightDecayOptimizer` with
  `bias_correction=True` (its `adam_correction` default; the factor also multiplies the decay term).

Weight-decay mask (`optimizer.weight_decay_mask`, only when weight_decay > 0 and name "adamw"):

* "xlgen" (default): no decay on LayerNorm parameters and on any parameter whose name contains "bias", including
  the attention biases r_w_bias / r_r_bias / r_s_bias.
* "original": BERT's exclusion (LayerNorm, "bias") but r_w_bias / r_r_bias / r_s_bias ARE decayed: both originals'
  `AdamWeightDecayOptimizer(include_in_weight_decay=["r_s_bias", "r_r_bias", "r_w_bias"])` overrides the exclusion
  (XLNet `model_utils.py`; Funnel with `use_wd_exclusion=True`).
* "all": every parameter is decayed: Funnel's default (`use_wd_exclusion=False`).

Layer-wise learning-rate decay: layer l of L gets `rate ** (L - 1 - l)` (top layer 1.0), parameters outside the
layer stack get 1.0. Layer indices are read from the parameter names (`layer_ids`), as the original code does with
its variable scopes, and L = 1 + the largest index found:

* Transformer-XL / XLNet (`xlnet/model_utils.py`): `layers.<l>` -> l. Embeddings, `mask_emb`, untied-or-not shared
  biases outside the layers and all heads are NOT decayed (the original only matches `model/transformer/layer_<l>/`).
* Funnel (`tensorflow/optimization.py`): the input layer (`embeddings`, `encoder.input_projection`) is layer 0, the
  encoder's parameter layers follow block by block, `blocks.<b>.<j>` -> 1 + sum(sizes[:b]) + j (a shared "3x2" layer
  counts once, as its variable scope does), then the decoder, `decoder.layers.<k>` -> 1 + sum(sizes) + k. Heads
  (MLM/ELECTRA/classifier/QA) get 1.0. Each tower is numbered on its own (ELECTRA's generator and discriminator both
  start at 0, as the original regex matches both).
* Scanned models (parameters stacked on a leading `layers` logical axis) get a per-slice vector of scales: slice i of
  a stack is the same layer as the unscanned `layers.<i>`, so scanned and unscanned models receive identical updates.

Two semantics (`optimizer.layer_decay_mode`):

* "lr": a true per-layer learning rate: the scale multiplies the final update, so layer l moves
  `rate ** (L - 1 - l)` times as far as the top layer.
* "faithful": scales the clipped *gradients* before Adam, exactly what `xlnet/model_utils.py` and Funnel's
  `optimization.py` do, and what the paper-reproduction finetuning configs use. Adam divides by sqrt(v) of the same
  scaled gradient, so the scale c cancels except against eps: the step is ~ c|g| / (c|g| + eps). After clipping to
  global norm 1, per-element gradients of a large model are ~1e-5..5e-5, comparable to eps = 1e-6, so the effective
  damping is far weaker than `lr` mode's but not nothing: for XLNet-Large (24 layers, rate 0.75, |g| ~ 5e-5) a
  layer's update relative to the top layer's is ~0.9 / 0.4 / 0.07 at layers 16 / 8 / 0, against 0.13 / 0.013 /
  0.0013 in `lr` mode (`effective_layer_ratios`; table in docs/training.md).

Parameter groups (`optimizer.param_groups`, default None = none): a sequence of dicts
{"pattern": regex, "lr_scale": float | "learning_rate": float, "frozen": bool}, matched with `re.search` against the
dotted parameter names (`softmax.slope_logits`, `layers.3.attn.q.kernel`; a scanned stack is one name, `layers.…`);
the first group that matches a parameter owns it, and every group must match at least one parameter. A group's
update is multiplied by `lr_scale`, or by `learning_rate / optimizer.learning_rate` (its own peak, the same
schedule shape), on top of any layer-wise decay: a true per-group learning rate. `frozen=True` parameters never
move: their gradients are zeroed before clipping (so they do not count in the global norm; their Adam moments stay
0) and their update, weight decay included, is multiplied by 0 (`optax.masked(optax.set_to_zero())` + a scale).
Without groups the optimizer (and its state) is exactly what it was. Examples: LMS-PLIF's layer-specific rate
(001 §4.3.2.1) `({"pattern": "^softmax[.]slope_logits$", "learning_rate": 0.02},)`; LMS-PLIF† (frozen random
slopes, 001 §5.7.1) `({"pattern": "slope_logits", "frozen": True},)`; finetuning with a frozen embedding
`({"pattern": "^embedding[.]", "frozen": True},)`. On the command line: `--config.optimizer.param_groups=
"({'pattern': 'slope_logits', 'frozen': True},)"`.

Parameters live in a flat dict {dotted_name: array}; stacked layers (a leading `layers` logical axis) get a
per-row scale vector. A system's `Family.layer_ids` (meta -> ({name: layer id array | None}, n_layer)) is the only
way parameters are numbered into layers; the caller passes it (`make_optimizer(..., layer_ids=...)`, the trainer
gives its system's): the numberings live in `xlgen.models.numbering` (Transformer-XL, XLNet) and
`xlgen.models.funnel.numbering`, and a new model family registers its own.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

NO_DECAY_PATTERN = re.compile(r"(bias|layer_norm|layernorm|LayerNorm|\bnorm\b|_norm\.)")
# Both originals' AdamWeightDecayOptimizer(include_in_weight_decay=...): decayed even though they are "biases".
ORIGINAL_ALWAYS_DECAY = re.compile(r"(r_s_bias|r_r_bias|r_w_bias)")
WEIGHT_DECAY_MASKS = ("xlgen", "original", "all")
UPDATE_RULES = ("optax", "original")
# A system's numbering of its parameters into layers (`Family.layer_ids`): meta {name: (shape, logical axes)} ->
# ({name: None (outside the layer stack) | int array broadcastable to the parameter}, n_layer = 1 + max id).
LayerIds = Callable[[Dict[str, Tuple[Tuple[int, ...], Tuple]]], Tuple[Dict[str, Optional[np.ndarray]], int]]


def _decay(kind: str, opt_cfg, init: float, floor: float, steps: int) -> optax.Schedule:
    """`init` -> `floor` over `steps` steps in the schedule's shape (linear | poly | cosine | constant = init)."""
    if kind in ("linear", "poly"):
        power = 1.0 if kind == "linear" else float(opt_cfg.poly_power)
        return optax.polynomial_schedule(init, floor, power, steps)
    if kind == "cosine":
        alpha = float(opt_cfg.min_lr_ratio) if init == float(opt_cfg.learning_rate) else floor / init if init else 0.0
        return optax.cosine_decay_schedule(init, steps, alpha=alpha)
    if kind == "constant":
        return optax.constant_schedule(init)
    raise ValueError(f"optimizer.schedule={kind!r}: expected linear, poly, cosine or constant")


def make_schedule(opt_cfg, total_steps: int) -> optax.Schedule:
    """lr(t) of the module docstring; with `optimizer.schedule_history` ((step S, total before S), ...) — the
    points where a resumed run changed total_steps (`continue_schedule`) — the schedule runs as planned up to the
    first S, and from each S on decays from its own value at S to the floor at the next total (never re-warms)."""
    history = sorted((int(s), int(t)) for s, t in opt_cfg.schedule_history)
    peak = float(opt_cfg.learning_rate)
    warmup = int(opt_cfg.warmup_steps)
    floor = peak * float(opt_cfg.min_lr_ratio)
    kind = opt_cfg.schedule
    first_total = history[0][1] if history else int(total_steps)
    schedule = _decay(kind, opt_cfg, peak, floor, max(first_total - warmup, 1))
    if warmup > 0:
        schedule = optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), schedule], [warmup])
    for i, (step, _) in enumerate(history):
        end = history[i + 1][1] if i + 1 < len(history) else int(total_steps)
        tail = _decay(kind, opt_cfg, float(schedule(step)), floor, max(end - step, 1))
        schedule = optax.join_schedules([schedule, tail], [step])
    return schedule


def continue_schedule(opt_cfg, old_history, old_total: int, new_total: int, step: int) -> Tuple:
    """The `optimizer.schedule_history` of a run resumed at `step` whose total_steps changes from `old_total` to
    `new_total`: the stored history up to `step`, plus (step, old_total) when the change would alter the learning
    rate from `step` on (not during warm-up, where every total gives the same schedule)."""
    history = tuple((int(s), int(t)) for s, t in (old_history or ()) if int(s) <= step)
    if new_total == old_total or step < int(opt_cfg.warmup_steps) or step <= 0 or any(s == step for s, _ in history):
        return history
    return history + ((int(step), int(old_total)),)


def weight_decay_mask(names: Sequence[str], kind: str = "xlgen") -> Dict[str, bool]:
    """True where weight decay applies (module docstring): "xlgen" = everything except LayerNorm parameters and
    biases (incl. r_w_bias...); "original" = the same but r_w_bias / r_r_bias / r_s_bias decayed (both originals);
    "all" = everything (Funnel's default `use_wd_exclusion=False`)."""
    if kind == "all":
        return {n: True for n in names}
    if kind == "original":
        return {n: ORIGINAL_ALWAYS_DECAY.search(n) is not None or NO_DECAY_PATTERN.search(n) is None for n in names}
    if kind == "xlgen":
        return {n: NO_DECAY_PATTERN.search(n) is None for n in names}
    raise ValueError(f"optimizer.weight_decay_mask={kind!r}: expected one of {WEIGHT_DECAY_MASKS}")


class OriginalAdamState(NamedTuple):
    count: Any  # int32 step count t (before this update)
    mu: Any
    nu: Any


def original_adam(
    b1: float, b2: float, eps: float, bias_correction: bool, weight_decay: float = 0.0, mask=None
) -> optax.GradientTransformation:
    """The originals' Adam direction (learning rate NOT applied):
    u_t = f_t * (m_t / (sqrt(v_t) + eps) + weight_decay * mask * param), m_t, v_t the raw (uncorrected) moments,
    f_t = sqrt(1 - b2^t) / (1 - b1^t) if bias_correction else 1 (`tf.train.AdamOptimizer`; XLNet and Funnel
    `AdamWeightDecayOptimizer`). `mask` {name: bool} selects the decayed parameters."""

    def init(params):
        zeros = lambda p: jnp.zeros(p.shape, jnp.float32)  # noqa: E731
        return OriginalAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

    def update(updates, state, params=None):
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)), state.nu, updates)
        t = state.count + 1
        f = jnp.sqrt(1 - b2 ** t.astype(jnp.float32)) / (1 - b1 ** t.astype(jnp.float32)) if bias_correction else 1.0
        out = {}
        for k, g in updates.items():
            u = mu[k] / (jnp.sqrt(nu[k]) + eps)
            if weight_decay and (mask is None or mask[k]):
                if params is None:
                    raise ValueError("original_adam with weight decay needs params")
                u = u + weight_decay * params[k].astype(jnp.float32)
            out[k] = (f * u).astype(g.dtype)
        return out, OriginalAdamState(t, mu, nu)

    return optax.GradientTransformation(init, update)


def effective_layer_ratios(
    n_layer: int, rate: float, grad_abs: float, eps: float, mode: str = "faithful"
) -> np.ndarray:
    """Steady-state size of layer l's update relative to the top layer's, `[n_layer]`, for a gradient of
    per-element magnitude `grad_abs` (after clipping) held constant: `lr` mode c_l; `faithful` mode
    (c_l |g| / (c_l |g| + eps)) / (|g| / (|g| + eps)), c_l = rate ** (n_layer - 1 - l) (Adam: m -> g, sqrt(v) -> |g|)."""
    c = rate ** (n_layer - 1 - np.arange(n_layer, dtype=np.float64))
    if mode == "lr":
        return c
    if mode != "faithful":
        raise ValueError(f"mode={mode!r}: expected 'lr' or 'faithful'")
    step = c * grad_abs / (c * grad_abs + eps)
    return step / step[-1]


def scales_from_ids(ids: Dict[str, Optional[np.ndarray]], n_layer: int, rate: float) -> Dict[str, np.ndarray]:
    """`rate ** (n_layer - 1 - id)` per parameter (per slice for stacked ids); 1.0 where id is None."""
    return {
        name: np.float32(1.0)
        if i is None or rate == 1.0
        else (rate ** (n_layer - 1 - np.asarray(i, np.float64))).astype(np.float32)
        for name, i in ids.items()
    }


def layer_decay_scales(
    meta: Dict[str, Tuple[Tuple[int, ...], Tuple]], layer_ids: Optional[LayerIds], rate: float
) -> Dict[str, np.ndarray]:
    """The layer-wise LR decay multiplier of every parameter (`layer_ids(meta)` + `scales_from_ids`).
    rate 1.0 needs no numbering (all 1.0); any other rate needs the system's `layer_ids`."""
    if rate == 1.0:
        return {name: np.float32(1.0) for name in meta}
    if layer_ids is None:
        raise ValueError(
            f"optimizer.lr_layer_decay_rate={rate}: layer-wise decay needs model.family's numbering of its parameters "
            "into layers (`Family.layer_ids`), and this system has none; set the rate to 1.0"
        )
    ids, n = layer_ids(meta)
    return scales_from_ids(ids, n, rate)


def scale_by_tree(scales: Dict[str, np.ndarray]) -> optax.GradientTransformation:
    """Multiply each leaf by a fixed (broadcastable) constant."""

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return {k: u * jnp.asarray(scales[k], u.dtype) for k, u in updates.items()}, state

    return optax.GradientTransformation(init, update)


PARAM_GROUP_KEYS = ("pattern", "lr_scale", "learning_rate", "frozen")


def param_group_scales(
    names: Sequence[str], groups, base_learning_rate: float
) -> Tuple[Dict[str, float], Dict[str, bool], list]:
    """({name: update scale}, {name: frozen}, [names matched by each group]) for `optimizer.param_groups` (module
    docstring). Errors name the group index and key."""
    parsed = []
    for i, g in enumerate(groups or ()):
        where = f"optimizer.param_groups[{i}]"
        try:
            g = dict(g)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a dict with keys {PARAM_GROUP_KEYS}, got {g!r}") from None
        bad = sorted(set(g) - set(PARAM_GROUP_KEYS))
        if bad:
            raise ValueError(f"{where}.{bad[0]}: unknown key; valid keys: {PARAM_GROUP_KEYS}")
        if "pattern" not in g:
            raise ValueError(f"{where}: needs a 'pattern' (regex on dotted parameter names)")
        try:
            pattern = re.compile(str(g["pattern"]))
        except re.error as e:
            raise ValueError(f"{where}.pattern={g['pattern']!r}: not a regex ({e})") from None
        if "lr_scale" in g and "learning_rate" in g:
            raise ValueError(f"{where}: give lr_scale or learning_rate, not both")
        if "learning_rate" in g:
            if base_learning_rate <= 0:
                raise ValueError(f"{where}.learning_rate needs optimizer.learning_rate > 0")
            scale = float(g["learning_rate"]) / float(base_learning_rate)
        else:
            scale = float(g.get("lr_scale", 1.0))
        if scale < 0:
            raise ValueError(f"{where}: the learning rate must be >= 0")
        frozen = bool(g.get("frozen", False))
        parsed.append((pattern, 0.0 if frozen else scale, frozen))
    scales = {n: 1.0 for n in names}
    frozen_mask = {n: False for n in names}
    matched: list = [[] for _ in parsed]
    for n in names:
        for i, (pattern, scale, frozen) in enumerate(parsed):
            if pattern.search(n):
                scales[n], frozen_mask[n] = scale, frozen
                matched[i].append(n)
                break
    for i, m in enumerate(matched):
        if not m:
            raise ValueError(
                f"optimizer.param_groups[{i}].pattern={parsed[i][0].pattern!r}: matches no parameter (or only ones "
                f"an earlier group owns); names look like {sorted(names)[:3]}"
            )
    return scales, frozen_mask, matched


def frozen_parameters(config, names: Sequence[str]) -> Optional[frozenset]:
    """The parameters that leave the optimizer entirely (no gradient computed, no optimizer state, carried in the
    train state's `frozen` subtree), or None: `finetune.freeze` (a regex, matched like an
    `optimizer.param_groups` pattern with `frozen=True`) and, with `finetune.lora.rank > 0`, every non-adapter
    parameter except those matching `finetune.lora.trainable` (default: the task head). A frozen
    `optimizer.param_groups` entry keeps its own semantics (zero gradient and update, moments kept)."""
    ft = config.get("finetune", None)
    if ft is None:
        return None
    frozen = set()
    regex = str(ft.freeze)
    if regex:
        try:
            _, mask, _ = param_group_scales(list(names), ({"pattern": regex, "frozen": True},), 1.0)
        except ValueError as e:  # the group's message, under the key the user set
            raise ValueError(f"finetune.freeze={regex!r}: {str(e).split(': ', 1)[1]}") from None
        frozen |= {n for n, f in mask.items() if f}
    lora = ft.lora
    if int(lora.rank) > 0:
        from xlgen.models.lora import is_adapter

        keep = str(lora.trainable)
        try:
            keep_re = re.compile(keep) if keep else None
        except re.error as e:
            raise ValueError(f"finetune.lora.trainable={keep!r}: not a regex ({e})") from None
        frozen |= {n for n in names if not is_adapter(n) and not (keep_re and keep_re.search(n))}
    if regex and len(frozen) == len(names):
        raise ValueError(f"finetune.freeze={regex!r}: freezes every parameter, nothing would train")
    return frozenset(frozen) or None


OPTIMIZERS = ("adamw", "adam", "sgd", "lamb", "adafactor")
TRUST_RATIO_MASKS = WEIGHT_DECAY_MASKS


def relative_step_schedule(cap: float, warmup_init: bool = False) -> optax.Schedule:
    """Adafactor's relative step size: lr(t) = min(cap, 1/sqrt(t + 1)) for update t = 0, 1, ... (`warmup_init`:
    min(1e-6 · (t + 1), 1/sqrt(t + 1)), the cap unused), as Hugging Face's `Adafactor(relative_step=True)`."""

    def schedule(count):
        t = jnp.asarray(count, jnp.float32) + 1.0
        first = 1e-6 * t if warmup_init else jnp.float32(cap)
        return jnp.minimum(first, jax.lax.rsqrt(t))

    return schedule


def stacked_axes(meta: Dict[str, Tuple[Tuple[int, ...], Tuple]]) -> Dict[str, int]:
    """{name: position of the `layers` logical axis} of the scanned stacks among the parameters."""
    from xlgen.models.numbering import stack_axis

    out = {}
    for name, (_, axes) in meta.items():
        axis = stack_axis(axes)
        if axis is not None:
            out[name] = axis
    return out


def per_layer_slices(make, names: Sequence[str], stacked: Dict[str, int]) -> optax.GradientTransformation:
    """`make(names) -> GradientTransformation` over the dict of those parameters, run on each layer of a scanned
    stack separately: `make(unstacked)` on the other parameters as they are, `jax.vmap` of `make(stacked)` over the
    `layers` axis of the stacks (state batched on axis 0). Without stacks: `make(names)` itself."""
    plain = [n for n in names if n not in stacked]
    stack = [n for n in names if n in stacked]
    if not stack:
        return make(list(names))
    tx_plain, tx_stack = make(plain), make(stack)
    axes = {n: stacked[n] for n in stack}

    def sub(tree, keys):
        return None if tree is None else {k: tree[k] for k in keys}

    def init(params):
        return (tx_plain.init(sub(params, plain)), jax.vmap(tx_stack.init, in_axes=(axes,))(sub(params, stack)))

    def update(updates, state, params=None):
        u_plain, s_plain = tx_plain.update(sub(updates, plain), state[0], sub(params, plain))
        in_params = axes if params is not None else None
        u_stack, s_stack = jax.vmap(tx_stack.update, in_axes=(axes, 0, in_params), out_axes=(axes, 0))(
            sub(updates, stack), state[1], sub(params, stack)
        )
        return {**u_plain, **u_stack}, (s_plain, s_stack)

    return optax.GradientTransformation(init, update)


def _lamb_trust_ratio(names: Sequence[str], mask: Dict[str, bool]) -> optax.GradientTransformation:
    """`optax.scale_by_trust_ratio` on the parameters `mask` selects (all: the plain transformation)."""
    if all(mask[n] for n in names):
        return optax.scale_by_trust_ratio()
    return optax.masked(optax.scale_by_trust_ratio(), {n: mask[n] for n in names})


def _adafactor(ada, schedule, names: Sequence[str], wd: float, mask) -> optax.GradientTransformation:
    """`optax.adafactor` with `optimizer.adafactor.*` over the parameters `names` (module docstring)."""
    clip = float(ada.clipping_threshold or 0.0)
    momentum = float(ada.momentum or 0.0)
    return optax.adafactor(
        learning_rate=schedule,
        min_dim_size_to_factor=int(ada.min_dim_size_to_factor),
        decay_rate=float(ada.decay_rate),
        multiply_by_parameter_scale=bool(ada.multiply_by_parameter_scale),
        clipping_threshold=clip if clip > 0 else None,
        momentum=momentum if momentum > 0 else None,
        weight_decay_rate=wd if wd > 0 else None,
        eps=float(ada.eps),
        factored=bool(ada.factored),
        weight_decay_mask=None if mask is None else {n: mask[n] for n in names},
    )


def make_optimizer(
    opt_cfg, total_steps: int, meta: Dict[str, Tuple[Tuple[int, ...], Tuple]], layer_ids: Optional[LayerIds] = None
) -> Tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax transformation for flat-dict params with metadata {name: (shape, logical_axes)}.

    Layer decay (`lr_layer_decay_rate` != 1): the layer of every parameter comes from `layer_ids(meta)`, the
    system's numbering (`Family.layer_ids` of `config.model.family`)."""
    schedule = make_schedule(opt_cfg, total_steps)
    if opt_cfg.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={opt_cfg.name!r}: expected one of {', '.join(OPTIMIZERS)}")
    rate = float(opt_cfg.lr_layer_decay_rate)
    mode = opt_cfg.layer_decay_mode
    if mode not in ("lr", "faithful"):
        raise ValueError(f"optimizer.layer_decay_mode={mode!r}: expected 'lr' or 'faithful'")
    rule = opt_cfg.update_rule
    if rule not in UPDATE_RULES:
        raise ValueError(f"optimizer.update_rule={rule!r}: expected one of {UPDATE_RULES}")
    if rule != "optax" and opt_cfg.name in ("lamb", "adafactor"):
        raise ValueError(f"optimizer.update_rule={rule!r} applies to adam/adamw; optimizer.name={opt_cfg.name!r}")
    scales = layer_decay_scales(meta, layer_ids, rate)
    wd = float(opt_cfg.weight_decay) if opt_cfg.name in ("adamw", "lamb", "adafactor") else 0.0
    mask = weight_decay_mask(list(meta), opt_cfg.weight_decay_mask) if wd > 0 else None
    groups = opt_cfg.param_groups
    group_scales, frozen, _ = param_group_scales(list(meta), groups, float(opt_cfg.learning_rate))
    parts = []
    if any(frozen.values()):  # no gradient for frozen parameters: outside the clip norm, Adam moments stay 0
        parts.append(optax.masked(optax.set_to_zero(), frozen))
    if float(opt_cfg.clip_norm) > 0:
        parts.append(optax.clip_by_global_norm(float(opt_cfg.clip_norm)))
    if rate != 1.0 and mode == "faithful":
        parts.append(scale_by_tree(scales))
    b1, b2, eps = float(opt_cfg.b1), float(opt_cfg.b2), float(opt_cfg.eps)
    names, stacked = list(meta), stacked_axes(meta)
    if opt_cfg.name == "adafactor":  # its own lr(t) scaling and sign inside `optax.adafactor`
        ada = opt_cfg.adafactor
        if bool(ada.relative_step):
            schedule = relative_step_schedule(float(opt_cfg.learning_rate), bool(ada.warmup_init))
        parts.append(per_layer_slices(lambda ns: _adafactor(ada, schedule, ns, wd, mask), names, stacked))
    else:
        if opt_cfg.name == "sgd":  # plain SGD: the update is -lr(t) * grad (Planetoid's optimiser)
            pass
        elif rule == "original":
            parts.append(original_adam(b1, b2, eps, bool(opt_cfg.bias_correction), wd, mask))
        else:
            parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
            if wd > 0:
                parts.append(optax.add_decayed_weights(wd, mask=mask))
        if opt_cfg.name == "lamb":
            kind = opt_cfg.lamb.trust_ratio_mask
            if kind not in TRUST_RATIO_MASKS:
                raise ValueError(f"optimizer.lamb.trust_ratio_mask={kind!r}: expected one of {TRUST_RATIO_MASKS}")
            trust = weight_decay_mask(names, kind)
            parts.append(per_layer_slices(lambda ns: _lamb_trust_ratio(ns, trust), names, stacked))
        parts.append(optax.scale_by_learning_rate(schedule))
    if rate != 1.0 and mode == "lr":
        parts.append(scale_by_tree(scales))
    if groups:  # per-group learning rate; 0 for frozen groups (weight decay included)
        parts.append(scale_by_tree({n: np.float32(v) for n, v in group_scales.items()}))
    return optax.chain(*parts), schedule


def with_state_dtype(tx: optax.GradientTransformation, dtype: str) -> optax.GradientTransformation:
    """`tx` whose floating-point state arrays (Adam's moments, ...) are stored in `dtype` ("bfloat16" halves the
    optimizer state) and widened back to the dtype `tx` keeps them in for each update, so the update arithmetic is
    unchanged. `dtype` "" (`optimizer.state_dtype`'s default) returns `tx` itself: the state in the parameters'
    dtype, as optax keeps it."""
    if not dtype:
        return tx
    dt = jnp.dtype(dtype)

    def narrow(state):
        return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim else x, state)

    def init(params):
        return narrow(tx.init(params))

    def update(updates, state, params=None):
        wide = jax.eval_shape(tx.init, updates)  # the dtypes tx itself keeps (gradients are typed like parameters)
        state = jax.tree.map(lambda x, ref: x.astype(ref.dtype), state, wide)
        updates, state = tx.update(updates, state, params)
        return updates, narrow(state)

    return optax.GradientTransformation(init, update)
