"""The two records a trainable system provides to the rest of xlgen: one `Family` (the system) owning its
`Objective`s, and what the language-model objectives share.

Each system package defines its record in one place (`xlgen/models/<family>/family.py`, or `xlgen/systems/<name>/`
for systems that are not pretrained language models) and `xlgen.registry` names it in one line; everything else asks
the registry (`registry.get(config.model.family)`, `registry.objective(config)`) instead of importing a system by
name or branching on it. `config.model.family` + `config.objective` select one entry; the data pipeline follows
from the objective.

`Family` holds what every system has; what only some systems have is an optional record in `Family.records` whose
type the code that reads it defines (`xlgen.finetune.record.Finetuning`, `xlgen.pretrained.Interop`, ...: the
table in docs/architecture.md, "Adding a system"), asked for with `family.record(Kind)`.
"""

from __future__ import annotations

import dataclasses
import math
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
    layer_ids          {dotted param name: (shape, logical axes)} -> ({name: None | int array}, n_layer): the
                       numbering of parameters into layers the trainer gives the optimizer for layer-wise LR decay
                       (`xlgen.train.optim`); None = no numbering (a decay rate other than 1.0 is an error)
    records            the optional records of what only some systems have (one per type; see the module
                       docstring), each read by the code that defines its type: `record(kind)`
    """

    name: str
    config_class: type
    default_objective: str
    objectives: Mapping[str, Objective] = dataclasses.field(default_factory=dict)
    models: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    layer_ids: Optional[Callable[[Dict[str, Tuple[Tuple[int, ...], Tuple]]], Any]] = None
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
        return model_config(self.config_class, model_section, **overrides)


def model_config(cls: type, model_section: Mapping[str, Any], **overrides):
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


def batch_size(config, split: str) -> int:
    """The global batch size of a split: `data.batch_size` (train) or `data.eval_batch_size`."""
    return int(config.data.batch_size) if split == "train" else int(config.data.eval_batch_size)


def compute_dtype(config):
    """The memory dtype of a config's `model.dtype` (bfloat16 or float32)."""
    import jax.numpy as jnp

    return jnp.bfloat16 if config.model.get("dtype", "float32") == "bfloat16" else jnp.float32


def reset_rows(mems, stream_reset):
    """Zero the memory rows whose stream (re)starts: mems [L, b, M, d], stream_reset [b] bool."""
    keep = 1.0 - stream_reset.astype(mems.dtype)
    return mems * keep[None, :, None, None]


def log_vocab_size(config) -> Optional[float]:
    """log V (V = `config.model.vocab_size`): the cross-entropy of a uniform guess over the vocabulary, the
    `Objective.uniform_loss` of a language-modelling loss; None when the config has no vocabulary size."""
    v = config.model.get("vocab_size")
    return math.log(int(v)) if v else None
