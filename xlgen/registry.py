"""The one registry: every trainable system xlgen runs, one line each, and the two records a system provides, one
`Family` owning its `Objective`s.

    from xlgen import registry
    fam = registry.get(config.model.family)          # the system's record (`Family`)
    obj = registry.objective(config)                 # its `Objective` for `config.objective` (or its default)
    ft = fam.record(Finetuning)                      # one of its optional records, or None
    [f for f in registry.having(Finetuning)]         # the systems that have one

A system is one package that defines its record and one line in `SYSTEMS` below; it is imported only when a run
asks for it. `Family` holds what every system has; what only some systems have is an optional record in
`Family.records` whose type the code that reads it defines (`xlgen.finetune.record.Finetuning`,
`xlgen.interop.Interop`, ...: the table in docs/architecture.md, "Adding a system").

Objectives shared by every family with finetuning heads (the finetuning losses) are named in `SHARED_OBJECTIVES`.
Nothing outside a system's package branches on its name. This module imports nothing of xlgen: the bottom of the
layers. docs/architecture.md, "Adding a system", is the recipe.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar

import numpy as np

Batch = Dict[str, Any]
ShapeDtype = Tuple[Tuple[int, ...], Any]
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Objective:
    """One training objective: how to build the model for a config, what a global batch looks like, which data
    pipeline produces it, whether a recurrent memory is carried, and (model, batch, memory) -> loss -- or, instead
    of the loss, a training program of its own (`build_program`: a game's players)."""

    name: str
    # (config, rngs, train: bool) -> nnx.Module.  Eval modules may differ in static settings (same_length...)
    make_model: Callable[[Any, Any, bool], Any]
    # (config, split) -> {name: (global shape, dtype)} of a training batch (split="train") or eval batch
    batch_shapes: Callable[[Any, str], Dict[str, ShapeDtype]]
    # (model, batch, mems, rng, config) -> (scalar loss, {metric: scalar}, new_mems or None): the one-model step's
    # loss (`xlgen.train.program.Program`); None with `build_program`
    loss: Optional[Callable[..., Tuple[Any, Dict[str, Any], Optional[Any]]]] = None
    # (model, batch, mems, config) -> (sum of per-token losses, token count, new_mems)  -- for eval
    eval_loss: Optional[Callable[..., Tuple[Any, Any, Optional[Any]]]] = None
    # the data stream this objective reads: a `data_pipelines.PIPELINES` name (config.data holds that pipeline's
    # keys; `config.data.pipeline` follows the objective), or (data_config, split, process_index, process_count) ->
    # pipeline; None = the caller supplies batches (finetuning's feature pipeline)
    pipeline: Any = None
    # (config, split) -> memory shape [n_layer, batch, mem_len, d] (or None: no memory)
    mems_shape: Callable[[Any, str], Optional[Tuple[int, ...]]] = lambda config, split: None
    mems_dtype: Callable[[Any], Any] = lambda config: np.float32
    # tokens processed per training step (for tokens/s)
    tokens_per_step: Callable[[Any], int] = lambda config: 0
    # final eval metrics from the mean eval loss
    eval_metrics: Callable[[float, Any], Dict[str, float]] = lambda loss, config: {"loss": loss}
    # (batch, config) -> the loss's normaliser for that batch (e.g. its number of target tokens), so that gradient
    # accumulation weights micro-batches like one global batch: sum_i w_i * loss_i / sum_i w_i. None = equal weights
    # (exact when every micro-batch has the same normaliser, e.g. a per-example mean).
    loss_weight: Optional[Callable[[Batch, Any], Any]] = None
    # (config, mesh, objective) -> `xlgen.train.program.TrainProgram`: the objective's own training program in
    # place of the one-model step on `loss`, e.g. a game's (`xlgen.train.game.game_objective`: several networks,
    # each with its own optimizer and loss, updated in order in one step); `make_model` then returns a module
    # holding every network (for shape checks)
    build_program: Optional[Callable[[Any, Any, Any], Any]] = None
    # (config, program, state, out_dir, full) -> {metric: float}: the objective's own evaluation, in place of the
    # eval-split loss. The loop calls it every `eval_every_steps` (full=False: cheap metrics) and `xlgen eval` calls
    # it on the latest checkpoint (full=True: every metric and figure, the figures in out_dir) and writes the
    # metrics to DIR/eval_results.json.
    evaluate: Optional[Callable[..., Dict[str, float]]] = None
    # (config) -> the training loss of a uniform guess (log V for a softmax over V outputs), or None: the health
    # guard's ceiling (`xlgen.train.guards.HealthGuard`: once the model has beaten it, a loss above it is unhealthy).
    # None = the objective has no such bound (a sum of losses, a regression, a game).
    uniform_loss: Optional[Callable[[Any], Optional[float]]] = None


@dataclasses.dataclass(frozen=True)
class Family:
    """A trainable system.

    name               `config.model.family`
    config_class       frozen dataclass whose fields are the keys of `config.model` (minus `family`); has
                       `.from_hf(hf_config_dict, **overrides)` where the system has a Hugging Face counterpart
    default_objective  the objective when `config.objective` is empty (a key of `objectives`)
    objectives         {`config.objective`: Objective}: the training losses the system owns
    models             {role: constructor(cfg, *, rngs, **options) -> nnx.Module}: the system's models ("lm", ...)
    records            the optional records of what only some systems have (one per type; see the module
                       docstring), each read by the code that defines its type: `record(kind)`
    """

    name: str
    config_class: type
    default_objective: str
    objectives: Mapping[str, Objective] = dataclasses.field(default_factory=dict)
    models: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    records: Tuple[Any, ...] = ()

    def __post_init__(self):
        kinds = [type(r) for r in self.records]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"Family {self.name!r}: more than one record of a type: {[k.__name__ for k in kinds]}")

    def record(self, kind: Type[R]) -> Optional[R]:
        """The system's record of type `kind` (e.g. `xlgen.finetune.record.Finetuning`), None when it has none."""
        return next((r for r in self.records if isinstance(r, kind)), None)

    def model_config(self, model_section: Mapping[str, Any], **overrides):
        """`config_class` from a `config.model` mapping (its `family` key ignored), lists as tuples; an unknown key
        is an error naming it and the valid fields."""
        return dataclass_config(self.config_class, model_section, **overrides)


def dataclass_config(cls: type, model_section: Mapping[str, Any], **overrides):
    """`cls` (a system's frozen config dataclass) from a `config.model` mapping (its `family` key ignored), lists as
    tuples; an unknown key is an error naming it and the valid fields."""
    if hasattr(model_section, "to_dict"):
        model_section = model_section.to_dict()
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in dict(model_section).items() if k != "family"}
    unknown = sorted(set(kw) - fields)
    if unknown:
        raise ValueError(f"config.model.{unknown[0]}: not a field of {cls.__name__}; valid fields: {sorted(fields)}")
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kw.items()}
    kw.update(overrides)
    return cls(**kw)


# config.model.family -> "module:attribute" of its Family record
SYSTEMS: Dict[str, str] = {
    "transformer_xl": "xlgen.models.transformer_xl.family:FAMILY",
    "xlnet": "xlgen.models.xlnet.family:FAMILY",
    "funnel": "xlgen.models.funnel.family:FAMILY",
    "cegan": "xlgen.systems.gan.system:CEGAN",
    "badgan": "xlgen.systems.gan.system:BADGAN",
    "planetoid": "xlgen.systems.planetoid.system:FAMILY",
    "gdan": "xlgen.systems.gdan.system:FAMILY",
    "initialgan": "xlgen.systems.initialgan.system:FAMILY",
}

# config.objective -> "module:attribute" of an Objective that works with any family's finetuning heads
SHARED_OBJECTIVES: Dict[str, str] = {
    "finetune": "xlgen.finetune.objective:FINETUNE",
}

# installed packages add systems under this entry-point group (`_installed`)
ENTRY_POINT_GROUP = "xlgen.systems"

_LOADED: Dict[str, object] = {}


def _load(ref: str):
    if ref not in _LOADED:
        module, attr = ref.split(":")
        _LOADED[ref] = getattr(importlib.import_module(module), attr)
    return _LOADED[ref]


def register(family: Family) -> Family:
    """Add (or replace) a system in this process (a notebook, a script; an installed package declares its systems
    under the `xlgen.systems` entry-point group instead, so that every `xlgen` command finds them)."""
    _LOADED[f"<registered>:{family.name}"] = family
    SYSTEMS[family.name] = f"<registered>:{family.name}"
    return family


@functools.lru_cache(maxsize=1)
def _installed() -> Dict[str, str]:
    """{name: "module:attribute"} of the systems installed packages declare in their metadata:

    [project.entry-points."xlgen.systems"]          # pyproject.toml (setup.py: entry_points={...})
    my_system = "my_package.system:FAMILY"
    """
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _systems() -> Dict[str, str]:
    """The built-in systems and those registered in this process, then the installed ones (a built-in name wins)."""
    return {**_installed(), **SYSTEMS}


def names() -> Tuple[str, ...]:
    """The registered `config.model.family` values."""
    return tuple(_systems())


def get(name: str) -> Family:
    """The system called `name` (`config.model.family`); ValueError naming the registered ones otherwise."""
    systems = _systems()
    if name not in systems:
        raise ValueError(f"model.family={name!r}: unknown; expected one of {sorted(systems)}")
    return _load(systems[name])


def objective_names(family: str) -> Tuple[str, ...]:
    """The `config.objective` values a system accepts: its own, then the shared ones."""
    return tuple(get(family).objectives) + tuple(SHARED_OBJECTIVES)


def objective(config) -> Objective:
    """The `Objective` of a run: `config.objective` (empty = the system's default) among the system's own objectives
    and the shared ones; ValueError naming the valid ones otherwise."""
    fam = get(config.model.family)
    name = config.get("objective") or fam.default_objective
    if name in fam.objectives:
        return fam.objectives[name]
    if name in SHARED_OBJECTIVES:
        return _load(SHARED_OBJECTIVES[name])
    raise ValueError(
        f"objective={name!r}: not an objective of model.family={fam.name!r}; expected one of "
        f"{list(objective_names(fam.name))}"
    )


def having(kind: type) -> Tuple[Family, ...]:
    """The registered systems that have a record of type `kind`."""
    return tuple(f for f in (get(n) for n in _systems()) if f.record(kind) is not None)


def family_of(module) -> Family:
    """The system an xlgen module (model or head) belongs to: the system whose package defines its class."""
    mod = type(module).__module__
    systems = _systems()
    for name, ref in systems.items():
        package = ref.split(":")[0].rsplit(".", 1)[0]
        if mod == package or mod.startswith(package + "."):
            return get(name)
    for name in systems:  # systems registered at run time: a model class they list
        family = get(name)
        if any(type(module) is cls for cls in family.models.values() if isinstance(cls, type)):
            return family
    raise ValueError(f"{type(module).__name__}: not a model of a registered family ({sorted(systems)})")


def model_config(config, **overrides):
    """The system's frozen config dataclass from `config.model` (minus `family`), with clear errors."""
    return get(config.model.family).model_config(config.model, **overrides)
