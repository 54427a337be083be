"""`build_program(config, mesh)`: the sharded training program, built abstractly; `train_step` and `eval_step`
(module-level, below) are what it jits. `TrainProgram` is the contract every program meets and the loop, the
reports, `xlgen plan` and `xlgen bench` use: this module's one-model `Program`, or the program an objective builds
itself (`Objective.build_program`: a game's players, `xlgen.train.game.GameProgram`).

    program = build_program(config, mesh)
    state, mems = program.init_state()                      # created directly sharded (jit with out_shardings)
    state, mems, metrics = program.train_step(state, batch, mems)   # jitted, donated, under jax.set_mesh(mesh)

The train state is a plain pytree (what Orbax saves):
    {"params":    {dotted.name: f32 array},   sharded by the logical-axis rules (xlgen.sharding)
     "opt_state": optax state,                 each moment sharded like its parameter
     "step":      int32 (completed updates),   replicated
     "rng":       uint32[2] base key data,     replicated}
With frozen parameters (`xlgen.train.optim.frozen_parameters`: `finetune.freeze`, LoRA) "params" holds only the
trainable ones (adapters, the task head, ...) and a fifth entry `"frozen": {dotted.name: array}` the rest: no
gradient is formed for them, the optimizer state covers only "params", and checkpoints hold the two apart;
`program.params_of(state)` is the whole model's dict.
plus the recurrent memory `mems [n_layer, batch, mem_len, d]` (rows sharded like the batch), passed and donated
separately so that it can be left out of checkpoints.

Randomness is a pure function of (rng, step): the step key is `fold_in(rng, step)`, from which every dropout stream
of the model is reseeded, so a resumed run draws exactly the same masks. `xlgen plan` AOT-compiles
`program.train_step.lower(*program.abstract_args())`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xlgen import registry, sharding
from xlgen.models.cost import FlopCount, train_flops_per_step
from xlgen.models.family import Objective
from xlgen.models.params import concrete_rest, materialize, path_name
from xlgen.train import optim


@dataclasses.dataclass
class ModelSpec:
    """An abstract model (no arrays allocated) and its flat parameter metadata; `materialize(spec.abstract, params,
    rest=...)` (xlgen.models.params) makes the module for a flat {name: array} dict."""

    abstract: nnx.Module  # from nnx.eval_shape, in train or eval mode
    rest: Any  # non-parameter state (RNG streams), abstract
    shapes: Dict[str, Tuple[int, ...]]
    dtypes: Dict[str, Any]
    logical: Dict[str, Tuple]

    def meta(self):
        return {n: (self.shapes[n], self.logical[n]) for n in self.shapes}


def abstract_model(make: Callable[[nnx.Rngs], nnx.Module], train: bool, param_dtype=None) -> ModelSpec:
    """`param_dtype` (the model's precision policy): the storage dtype of its floating-point parameters (None = as
    the modules create them, float32)."""
    model = nnx.eval_shape(lambda: make(nnx.Rngs(params=0, dropout=1, sample=2)))
    if train:
        model.train()
    else:
        model.eval()
    _, params, rest = nnx.split(model, nnx.Param, ...)
    shapes, dtypes, logical = {}, {}, {}
    for path, var in nnx.to_flat_state(params):
        n = path_name(path)
        shapes[n] = tuple(var.shape)
        dtypes[n] = var.dtype if param_dtype is None or not jnp.issubdtype(var.dtype, jnp.floating) else param_dtype
        axes = var.get_metadata().get("out_sharding")
        logical[n] = tuple(axes) if axes is not None else (None,) * len(shapes[n])
    return ModelSpec(model, rest, shapes, dtypes, logical)


def seeded_rest(rest, key: jax.Array):
    """Fresh RNG-stream state for the model: every RngKey leaf := a key derived from `key` (shape-matched for
    stacked/scanned layers), every RngCount := 0. Non-RNG variables are kept."""
    flat = list(nnx.to_flat_state(rest))
    out = []
    for i, (path, var) in enumerate(flat):
        if isinstance(var, nnx.RngKey):
            k = jax.random.fold_in(key, i)
            shape = tuple(var.shape)
            if shape:
                k = jax.random.split(k, math.prod(shape)).reshape(shape)
            out.append((path, var.replace(k)))
        elif isinstance(var, nnx.RngCount):
            out.append((path, var.replace(jnp.zeros(var.shape, var.dtype))))
        else:
            out.append((path, var))
    return nnx.from_flat_state(out)


@dataclasses.dataclass(kw_only=True)
class TrainProgram:
    """What the loop, the reports, `xlgen plan` and `xlgen bench` use of a training program: one jitted, donated
    step `train_step(state, batch, mems) -> (state, mems, metrics)` on a sharded state (a plain dict with "params",
    "opt_state", "step", "rng"), `init_state() -> (state, mems)` creating it directly sharded, and its abstract
    forms (Orbax restore targets, `xlgen plan`'s AOT compile)."""

    config: Any
    mesh: Mesh
    objective: Objective
    param_shapes: Dict[str, Tuple[int, ...]]  # every parameter by dotted name (a game's: "<player>.<name>")
    state_shardings: Any
    batch_shardings: Dict[str, NamedSharding]
    train_step: Any  # jitted (state, batch, mems) -> (state, mems, metrics)
    init_state: Any  # () -> (state, mems)
    tokens_per_step: int  # what one step processes (`Reporting.unit`: tokens, examples)
    analytic_flops_per_step: float = 0.0  # 0.0 = not counted (no MFU)
    mems_shape: Optional[Tuple[int, ...]] = None  # the recurrent memory [n_layer, batch, mem_len, d]; None = none
    mems_dtype: Any = None
    mems_sharding: Optional[NamedSharding] = None
    _abstract_state: Any = None

    def abstract_state(self):
        """ShapeDtypeStructs (with shardings) of the train state, e.g. an Orbax restore target."""
        return self._abstract_state

    def abstract_mems(self) -> Optional[jax.ShapeDtypeStruct]:
        if self.mems_shape is None:
            return None
        return jax.ShapeDtypeStruct(self.mems_shape, self.mems_dtype, sharding=self.mems_sharding)

    def abstract_batch(self, split: str = "train") -> Dict[str, jax.ShapeDtypeStruct]:
        spec = self.objective.batch_shapes(self.config, split)
        return {
            k: jax.ShapeDtypeStruct(s, d, sharding=sharding.batch_sharding(self.mesh, len(s)))
            for k, (s, d) in spec.items()
        }

    def abstract_args(self):
        return self.abstract_state(), self.abstract_batch("train"), self.abstract_mems()

    def params_of(self, state) -> Dict[str, Any]:
        """Every parameter: the model's {name: array} (the trainable ones and, when some are frozen, the frozen
        ones), or a game's {player: {name: array}}."""
        return {**state["frozen"], **state["params"]} if "frozen" in state else state["params"]


@dataclasses.dataclass(kw_only=True)
class Program(TrainProgram):
    """The one-model program: the objective's model and loss, one optimizer (`config.optimizer`)."""

    train_spec: ModelSpec
    eval_spec: ModelSpec
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    param_specs: Dict[str, P]
    param_shardings: Dict[str, NamedSharding] = None  # every parameter's sharding (frozen ones included)
    frozen: Optional[frozenset] = None  # names held in state["frozen"] (None: everything trains)
    _eval: Any = None

    def __post_init__(self):
        if self.param_shardings is None:  # nothing frozen: the state's parameters are all of them
            self.param_shardings = self.state_shardings["params"]

    def with_params(self, state, params: Dict[str, jax.Array]):
        """`state` with its parameters replaced by the whole-model dict `params` (split as the state splits them)."""
        state = dict(state)
        if "frozen" not in state:
            state["params"] = dict(params)
            return state
        state["params"] = {n: v for n, v in params.items() if n not in self.frozen}
        state["frozen"] = {n: v for n, v in params.items() if n in self.frozen}
        return state

    def make_model(self, params, train: bool = False) -> nnx.Module:
        spec = self.train_spec if train else self.eval_spec
        return materialize(spec.abstract, params, rest=concrete_rest(spec.rest))


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """What one training step needs besides its arguments: the config, the objective (model and loss), the abstract
    training model, the optimizer and its schedule, the number of gradient-accumulation micro-batches."""

    config: Any
    objective: Objective
    spec: ModelSpec
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    accum: int


def loss_fn(step: Step, params, batch, mems, key, frozen=None):
    """(loss, (metrics, new_mems)) of the objective on `batch`, the model's dropout streams reseeded from `key`;
    `frozen`: the parameters outside `params` (not differentiated)."""
    if frozen:
        params = {**frozen, **params}
    model = materialize(step.spec.abstract, params, rest=seeded_rest(step.spec.rest, key))
    with sharding.activation_rules(step.config.mesh.rules):  # the models' activation constraints use these rules
        loss, aux, new_mems = step.objective.loss(model, batch, mems, key, step.config)
    return loss, (aux, new_mems)


def accumulated_grads(step: Step, params, batch, mems, key, frozen=None):
    """((loss, (metrics, new_mems)), grads) over `step.accum` micro-batches: micro-batch a = rows a, a+A, a+2A, ...
    (strided, so each stays evenly sharded), weighted by the loss's normaliser (`Objective.loss_weight`, e.g.
    target tokens): the accumulated loss and gradient are those of the global batch, whatever the padding or target
    masks of each micro-batch."""
    grad_fn = jax.value_and_grad(lambda p, b, m, k: loss_fn(step, p, b, m, k, frozen), has_aux=True)
    accum, weight_fn = step.accum, step.objective.loss_weight
    if accum == 1:
        return grad_fn(params, batch, mems, key)

    def split(x, axis):
        shp = x.shape
        x = x.reshape(shp[:axis] + (shp[axis] // accum, accum) + shp[axis + 1 :])
        return jnp.moveaxis(x, axis + 1, 0)

    micro = jax.tree.map(lambda x: split(x, 0), batch)
    micro_mems = split(mems, 1) if mems is not None else None

    def body(acc, xs):
        i, mb, mm = xs
        (l, (a, nm)), g = grad_fn(params, mb, mm, jax.random.fold_in(key, i))
        w = jnp.asarray(weight_fn(mb, step.config), jnp.float32) if weight_fn is not None else jnp.ones((), jnp.float32)
        acc = jax.tree.map(lambda s, x: s + w * x, acc, (l, a, g, 1.0))
        return acc, nm

    zeros = jax.tree.map(jnp.zeros_like, params)
    aux0 = jax.eval_shape(
        lambda: loss_fn(
            step, params, jax.tree.map(lambda x: x[0], micro), None if micro_mems is None else micro_mems[0], key
        )[1][0]
    )
    aux0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux0)
    (loss, aux, grads, total_w), new_micro = jax.lax.scan(
        body,
        (jnp.zeros((), jnp.float32), aux0, zeros, jnp.zeros((), jnp.float32)),
        (jnp.arange(accum), micro, micro_mems),
    )
    total_w = jnp.where(total_w > 0, total_w, 1.0)
    loss, aux, grads = jax.tree.map(lambda x: (x / total_w).astype(x.dtype), (loss, aux, grads))
    new_mems = None
    if new_micro is not None:
        nm = jnp.moveaxis(new_micro, 0, 2)  # [L, b/A, A, M, d]
        new_mems = nm.reshape(nm.shape[:1] + (nm.shape[1] * accum,) + nm.shape[3:])
    return (loss, (aux, new_mems)), grads


def train_step(step: Step, state, batch, mems):
    """One optimizer update: (state, batch, mems) -> (state, mems, metrics). The step key is fold_in(rng, step), so
    a resumed run draws the same dropout masks. A non-finite loss or gradient norm skips the update (parameters,
    optimizer state and memory stay as they were; the step and its batch are consumed); with finite values the
    selects return their first operand bit for bit. The loop counts the skips (metrics["nonfinite"])."""
    t = state["step"]
    key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), t)
    params = state["params"]
    (loss, (aux, new_mems)), grads = accumulated_grads(step, params, batch, mems, key, state.get("frozen"))
    updates, opt_state = step.tx.update(grads, state["opt_state"], params)
    new_params = optax.apply_updates(params, updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new_params, opt_state = jax.tree.map(
        lambda new, old: jnp.where(finite, new, old), (new_params, opt_state), (params, state["opt_state"])
    )
    new_state = {"params": new_params, "opt_state": opt_state, "step": t + 1, "rng": state["rng"]}
    if "frozen" in state:
        new_state["frozen"] = state["frozen"]
    if mems is not None:
        new_mems = jnp.where(finite, new_mems.astype(mems.dtype), mems)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "learning_rate": step.schedule(t),
        **aux,
        "nonfinite": jnp.logical_not(finite).astype(jnp.float32),
    }
    return new_state, new_mems, metrics


def eval_step(config, objective: Objective, spec: ModelSpec, params, batch, mems):
    """(sum of per-token losses, count, new_mems) of the eval model (dropout off) on `batch`."""
    model = materialize(spec.abstract, params, rest=seeded_rest(spec.rest, jax.random.key(0)))
    with sharding.activation_rules(config.mesh.rules):
        total, count, new_mems = objective.eval_loss(model, batch, mems, config)
    if mems is not None:
        new_mems = new_mems.astype(mems.dtype)
    return total, count, new_mems


# Config sections that do not change the compiled program (a resumed or re-run job reuses the executables).
_NOT_PROGRAM = (
    "checkpoint",
    "watchdog",
    "log_every_steps",
    "eval_every_steps",
    "tensorboard",
    "peak_flops_per_device",
    "profile",
    "trackers",
    "tracking",
)
_PROGRAMS: Dict[Tuple, TrainProgram] = {}


def program_key(config, mesh: Mesh) -> Tuple:
    import json

    d = {k: v for k, v in config.to_dict().items() if k not in _NOT_PROGRAM}
    d.get("eval", {}).pop("steps", None)
    return (
        json.dumps(d, sort_keys=True, default=str),
        mesh.axis_names,
        mesh.devices.shape,
        tuple(int(x.id) for x in mesh.devices.flat),
    )


def build_program(config, mesh: Mesh) -> TrainProgram:
    """The Program for (config, mesh); memoised in-process, so that re-running on the same config (resume,
    evaluation, from_pretrained) does not trace and compile again."""
    key = program_key(config, mesh)
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= 8:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = _build_program(config, mesh)
    return _PROGRAMS[key]


def _build_program(config, mesh: Mesh) -> TrainProgram:
    objective = registry.objective(config)
    if objective.build_program is not None:  # a program of the objective's own (a game: xlgen/train/game.py)
        return objective.build_program(config, mesh, objective)
    if objective.loss is None:
        raise ValueError(f"objective={objective.name!r}: neither a loss nor a program of its own (build_program)")
    # precision policy: parameters stored in model.param_dtype, optimizer state in optimizer.state_dtype ("" = the
    # parameters'); the compute / softmax / logits dtypes are the model's own (xlgen.models.layers.PRECISION_KEYS)
    pdt = jnp.dtype(config.model.get("param_dtype", "float32"))
    train_spec = abstract_model(lambda r: objective.make_model(config, r, True), train=True, param_dtype=pdt)
    eval_spec = abstract_model(lambda r: objective.make_model(config, r, False), train=False, param_dtype=pdt)

    rules = sharding.rules_for(config.mesh.rules)
    param_specs = {
        n: sharding.logical_to_spec(train_spec.logical[n], train_spec.shapes[n], rules, mesh) for n in train_spec.shapes
    }
    all_shardings = {n: NamedSharding(mesh, s) for n, s in param_specs.items()}
    frozen = optim.frozen_parameters(config, list(train_spec.shapes))
    trains = [n for n in train_spec.shapes if not frozen or n not in frozen]
    param_shardings = {n: all_shardings[n] for n in trains}
    meta = train_spec.meta()
    family = registry.get(config.model.family)
    tx, schedule = optim.make_optimizer(
        config.optimizer, int(config.total_steps), {n: meta[n] for n in trains}, layer_ids=family.layer_ids
    )
    tx = optim.with_state_dtype(tx, config.optimizer.state_dtype)

    abstract_all = {n: jax.ShapeDtypeStruct(train_spec.shapes[n], train_spec.dtypes[n]) for n in train_spec.shapes}
    abstract_params = {n: abstract_all[n] for n in trains}
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    rep = sharding.replicated(mesh)
    state_shardings = {
        "params": param_shardings,
        "opt_state": sharding.opt_state_shardings(abstract_opt, param_shardings, train_spec.shapes, mesh),
        "step": rep,
        "rng": rep,
    }
    if frozen:
        state_shardings["frozen"] = {n: all_shardings[n] for n in train_spec.shapes if n in frozen}
    mems_shape = objective.mems_shape(config, "train")
    mems_dtype = objective.mems_dtype(config)
    mems_sharding = NamedSharding(mesh, sharding.mems_spec()) if mems_shape is not None else None
    bspec = objective.batch_shapes(config, "train")
    batch_shardings = {k: sharding.batch_sharding(mesh, len(s)) for k, (s, _) in bspec.items()}
    global_batch = next(iter(bspec.values()))[0][0]
    dp = sharding.data_parallel_size(mesh)
    if global_batch % dp:
        raise ValueError(
            f"global batch size {global_batch} is not divisible by the data-parallel mesh size "
            f"{dp} (mesh.data * mesh.fsdp)"
        )

    seed = int(config.seed)

    def init_fn():
        model = objective.make_model(config, nnx.Rngs(params=seed, dropout=seed + 1, sample=seed + 2), True)
        _, params, _ = nnx.split(model, nnx.Param, ...)
        flat = {
            path_name(p): v.get_value() if hasattr(v, "get_value") else v.value for p, v in nnx.to_flat_state(params)
        }
        flat = {n: x.astype(train_spec.dtypes[n]) for n, x in flat.items()}
        trainable = {n: flat[n] for n in trains}
        state = {
            "params": trainable,
            "opt_state": tx.init(trainable),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(jax.random.key(seed + 3)),
        }
        if frozen:
            state["frozen"] = {n: x for n, x in flat.items() if n in frozen}
        mems = jnp.zeros(mems_shape, mems_dtype) if mems_shape is not None else None
        return state, mems

    init_jit = jax.jit(init_fn, out_shardings=(state_shardings, mems_sharding))

    def init_state():
        """(state, mems) created directly sharded. Runs once, so on CPU it is compiled without LLVM's expensive
        optimisations (the random initialisers of a whole model otherwise take minutes to compile there)."""
        if mesh.devices.flat[0].platform == "cpu":
            opts = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
            return init_jit.lower().compile(compiler_options=opts)()
        return init_jit()

    accum = int(config.optimizer.grad_accum_steps)
    if accum < 1:
        raise ValueError(f"optimizer.grad_accum_steps={accum}: must be >= 1")
    if global_batch % (accum * dp):
        raise ValueError(
            f"data.batch_size={global_batch} is not divisible by optimizer.grad_accum_steps * "
            f"data-parallel size = {accum} * {dp}: every micro-batch must split evenly over the "
            f"data-parallel devices"
        )
    step = Step(config=config, objective=objective, spec=train_spec, tx=tx, schedule=schedule, accum=accum)

    train_step_jit = jax.jit(
        functools.partial(train_step, step),
        in_shardings=(state_shardings, batch_shardings, mems_sharding),
        out_shardings=(state_shardings, mems_sharding, rep),
        donate_argnums=(0, 2),
    )

    abstract_tree = {
        "params": abstract_params,
        "opt_state": abstract_opt,
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "rng": jax.ShapeDtypeStruct((2,), jnp.uint32),
    }
    if frozen:
        abstract_tree["frozen"] = {n: abstract_all[n] for n in train_spec.shapes if n in frozen}
    abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract_tree, state_shardings
    )

    return Program(
        config=config,
        mesh=mesh,
        objective=objective,
        train_spec=train_spec,
        eval_spec=eval_spec,
        tx=tx,
        schedule=schedule,
        param_specs=param_specs,
        param_shapes=train_spec.shapes,
        state_shardings=state_shardings,
        batch_shardings=batch_shardings,
        mems_sharding=mems_sharding,
        mems_shape=mems_shape,
        mems_dtype=mems_dtype,
        train_step=train_step_jit,
        init_state=init_state,
        analytic_flops_per_step=train_flops_per_step(config, family.record(FlopCount)),
        tokens_per_step=objective.tokens_per_step(config),
        param_shardings=all_shardings,
        frozen=frozen,
        _abstract_state=abstract_state,
    )


def make_eval_step(program: Program):
    """Jitted (params, batch, mems) -> (loss sum, count, new_mems) with the eval model (dropout off); cached."""
    if getattr(program, "_eval", None) is None:
        program._eval = _make_eval_step(program)
    return program._eval


def _make_eval_step(program: Program):
    config, objective, spec, mesh = program.config, program.objective, program.eval_spec, program.mesh
    mems_shape = objective.mems_shape(config, "eval")
    mems_sh = NamedSharding(mesh, sharding.mems_spec()) if mems_shape is not None else None
    bspec = objective.batch_shapes(config, "eval")
    bsh = {k: sharding.batch_sharding(mesh, len(s)) for k, (s, _) in bspec.items()}
    rep = sharding.replicated(mesh)

    step = jax.jit(
        functools.partial(eval_step, config, objective, spec),
        in_shardings=(program.param_shardings, bsh, mems_sh),
        out_shardings=(rep, rep, mems_sh),
        donate_argnums=(2,),
    )
    zeros = (
        jax.jit(lambda: jnp.zeros(mems_shape, program.mems_dtype), out_shardings=mems_sh)
        if mems_shape is not None
        else (lambda: None)
    )
    return step, zeros, bsh
