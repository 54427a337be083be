"""The two records a trainable system provides to the rest of xlgen: one `Family` (the system) owning its
`Objective`s.

Each system package defines its record in one place (`xlgen/models/<family>/family.py`, or `xlgen/systems/<name>/`
for systems that are not pretrained language models) and `xlgen.registry` names it in one line; everything else asks
the registry (`registry.get(config.model.family)`, `registry.objective(config)`, `registry.by_hf_model_type(...)`)
instead of importing a system by name or branching on it. `config.model.family` + `config.objective` select one
entry; the data pipeline follows from the objective.

    name               `config.model.family`: "transformer_xl" | "xlnet" | "funnel" | another system's name
    config_class       frozen dataclass whose fields are the keys of `config.model` (minus `family`); has
                       `.from_hf(hf_config_dict, **overrides)` where the family has a Hugging Face counterpart
    objectives         {`config.objective`: Objective}: the training losses the system owns, each with its model
                       constructor, batch layout and data pipeline
    default_objective  the objective when `config.objective` is empty (a key of `objectives`)
    hf_model_type      Hugging Face `config.json["model_type"]` ("transfo-xl" | "xlnet" | "funnel"); None for a
                       system with no Hugging Face counterpart (then from_hf / wrap / to_hf are None too)
    models             {role: constructor(cfg, *, rngs, **options) -> nnx.Module}: the pretraining models
                       ("lm", Funnel "mlm" / "electra", ...)
    heads              {task kind: constructor(cfg, *, num_labels, answerability, rngs) -> nnx.Module}: finetuning
                       heads ("classification", "regression", "multiple_choice", "squad"); empty = not finetunable
    squad_outputs      (head model, batch, *, train) -> {name: array}: the SQuAD head's outputs in the finetuning
                       objective's names (training: start/end logits, cls_logits; inference: the family's
                       beam arrays or logits)
    finetune_overrides num_labels -> {config field: value} applied to `config_class` for finetuning
    segment_heads      the task kinds whose heads take N segments `[b, (c,) N, l]` with the memory carried across
                       them (`max_segments`, XLNet `recurrence.py`); empty = no segment-recurrent finetuning
    input_style        task-input layout of the family's finetuning inputs (`xlgen.finetune.readers.features`):
                       "cls_last" (XLNet: <cls> last, left padding) or "cls_first" (BERT, Funnel: <cls> first);
                       None for a family without finetuning heads
    from_hf            (hf_config, state_dict, kwargs) -> HF-convention callable (`xlgen.from_pretrained`)
    to_hf              module -> (hf_config, state_dict): the inverse of `from_hf` (`xlgen export --to-hf`); None
                       while a family has no writer
    wrap               (module, kwargs) -> HF-convention callable around a trained xlgen module
                       (`xlgen.from_pretrained(workdir)`)
    layer_ids          {dotted param name: (shape, logical axes)} -> ({name: None | int array}, n_layer): the
                       numbering of parameters into layers for layer-wise LR decay (`xlgen.train.optim`)
    hf_wordpiece       the Hugging Face tokenizer class (and special pieces it must be told) for an exported
                       WordPiece vocabulary (`xlgen export`): BertTokenizer unless the family says otherwise
    train_flops        config -> analytic model FLOPs of one global training step (`xlgen.models.cost`); None = not
                       counted (no MFU)
    hf_bench           `HFBench`: how `xlgen bench --compare-hf` builds the Hugging Face PyTorch counterpart of a
                       config's model (in the family's own `hf_bench.py`); None = not compared
    sample             (config, program, state, workdir, num_samples, seed) -> [sentence]: `xlgen generate
                       --workdir=W` for a system that generates text unconditionally (a text GAN) from the workdir's
                       restored state, the same sentences for the same seed; None = the language-model decoders of
                       `xlgen.generate` (a prompt, memory)
    from_tf            `TFImport`: the original TensorFlow release's variable names -> the family's module
                       (`xlgen convert --from-tf`, in the family's own `tf_import.py`); None = no importer
    reporting          `Reporting`: what the system's logs and advice speak of (the unit a step processes, the
                       learning-rate schedules that train it, the config sections it reads); default: a language
                       model's (tokens, `config.optimizer`'s schedule, every section)
    stream             `Stream`: the pretrained language model served segment by segment with its memory
                       (`xlgen export --to-onnx/--to-stablehlo`, `xlgen.deploy`); None = no such export
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

Meta = Dict[str, Tuple[Tuple[int, ...], Tuple]]
LayerIds = Tuple[Dict[str, Optional[np.ndarray]], int]


Batch = Dict[str, Any]
ShapeDtype = Tuple[Tuple[int, ...], Any]


@dataclasses.dataclass(frozen=True)
class Objective:
    """One training objective: how to build the model for a config, what a global batch looks like, which data
    pipeline produces it, whether a recurrent memory is carried, and (model, batch, memory) -> loss."""

    name: str
    # (config, rngs, train: bool) -> nnx.Module.  Eval modules may differ in static settings (same_length...)
    make_model: Callable[[Any, Any, bool], Any]
    # (config, split) -> {name: (global shape, dtype)} of a training batch (split="train") or eval batch
    batch_shapes: Callable[[Any, str], Dict[str, ShapeDtype]]
    # (model, batch, mems, rng, config) -> (scalar loss, {metric: scalar}, new_mems or None)
    loss: Callable[..., Tuple[Any, Dict[str, Any], Optional[Any]]]
    # (model, batch, mems, config) -> (sum of per-token losses, token count, new_mems)  -- for eval
    eval_loss: Callable[..., Tuple[Any, Any, Optional[Any]]]
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
    # (config) -> xlgen.train.game.Game: a multi-player objective (several networks, each with its own optimizer and
    # loss, updated in order in one step, e.g. a GAN's discriminator and generator). The trainer then builds
    # `xlgen.train.game.build_game_program` instead of the one-model step; `make_model` returns a module holding
    # every player (for shape checks), `loss` / `eval_loss` are not used.
    game: Optional[Callable[[Any], Any]] = None
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
class HFBench:
    """The Hugging Face PyTorch counterpart that `xlgen bench --compare-hf` measures against a family's model. The
    functions import torch/transformers when called (a family's record never needs them); every field is optional.

        train_model     config -> a randomly initialised HF model (transformers 4.34.1) doing the training work of
                        `config.objective` on the same dimensions: `model(**inputs)` returns `.loss` (and `.mems`);
                        ValueError when that objective has no HF counterpart
        train_inputs    (the objective pipeline's batch, config) -> {HF keyword: NumPy array} of one training step
        carries_mems    the step's `out.mems` (detached) are fed back as `mems=` to the next step
        memory_lm       (config, directory) -> path of a random-weight HF language model with a segment-level memory
                        written there, loadable by `xlgen.from_pretrained(path, mem_len=M)` (`--eval`,
                        `--generate`)
        load_memory_lm  (path, mem_len) -> that model in transformers, in eval mode, with memory length mem_len
    """

    train_model: Optional[Callable[[Any], Any]] = None
    train_inputs: Optional[Callable[[Batch, Any], Dict[str, np.ndarray]]] = None
    carries_mems: bool = False
    memory_lm: Optional[Callable[[Any, str], str]] = None
    load_memory_lm: Optional[Callable[[str, int], Any]] = None


@dataclasses.dataclass(frozen=True)
class Reporting:
    """How `xlgen train` / `xlgen config show` report a system's runs (`xlgen.train.report` asks the record, never
    the system's name).

        unit            what `Objective.tokens_per_step` counts: logs print `<unit>/step`, `<unit>/s`
        learning_rates  (config, total_steps) -> {player: step -> learning rate}: the schedules that train the
                        system (a game's players); None = `config.optimizer`'s schedule (xlgen/train/optim.py), which
                        the end-of-run extend advice and the total_steps-change note read
        unused_keys     config sections (dotted prefixes, e.g. "optimizer", "objective_options") the system never
                        reads: left out of `xlgen config show`
    """

    unit: str = "tokens"
    learning_rates: Optional[Callable[[Any, int], Dict[str, Callable[[int], float]]]] = None
    unused_keys: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TFImport:
    """How `xlgen convert --from-tf` reads the family's original TensorFlow checkpoints (the family's own
    `tf_import.py` holds its name map: original variable name -> xlgen parameter).

        original_config  (the release's own config JSON as a dict, e.g. XLNet's xlnet_config.json, Funnel's
                         net_config.json) -> config_class; None = only HF config.json / xlgen config files
        load             (checkpoint: `xlgen.interop.tf_checkpoint.TFCheckpoint` (names, `name in ckpt`, `ckpt[name]`),
                         config_class instance) -> nnx.Module holding the checkpoint's weights (no random init);
                         the module's class is the Hugging Face class `Family.to_hf` writes
    """

    load: Callable[[Any, Any], Any]
    original_config: Optional[Callable[[Dict[str, Any]], Any]] = None


@dataclasses.dataclass(frozen=True)
class Stream:
    """A pretrained language model as a deployed function of one segment and its memory (`xlgen.deploy`).

    scores   the name of the per-position output ("log_probs" | "logits"), `[b, l, V]` float32
    step     (module, input_ids `[b, l]`, mems `[n_layer, b, M, d]` | None, mem_valid `[b]` int | None) ->
             (scores, new_mems `[n_layer, b, M, d]`): a fixed-length memory buffer of M = mem_len rows whose
             last `mem_valid` rows are real (0 = empty: the first segment sees no memory)
    memory   module -> (n_layer, mem_len, d_model): the memory's shape; mem_len 0 = no memory
    prepare  module -> module in its inference settings (e.g. pretraining-only batch layouts off)
    """

    scores: str
    step: Callable[..., Tuple[Any, Any]]
    memory: Callable[[Any], Tuple[int, int, int]]
    prepare: Callable[[Any], Any] = lambda module: module


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    default_objective: str
    models: Mapping[str, Callable[..., Any]]
    objectives: Mapping[str, Objective] = dataclasses.field(default_factory=dict)
    hf_model_type: Optional[str] = None
    from_hf: Optional[Callable[[Dict[str, Any], Dict[str, np.ndarray], Dict[str, Any]], Any]] = None
    wrap: Optional[Callable[[Any, Dict[str, Any]], Any]] = None
    layer_ids: Optional[Callable[[Meta], LayerIds]] = None
    train_flops: Optional[Callable[[Any], float]] = None
    heads: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    squad_outputs: Optional[Callable[..., Dict[str, Any]]] = None
    finetune_overrides: Callable[[int], Dict[str, Any]] = lambda num_labels: {}
    segment_heads: Tuple[str, ...] = ()
    input_style: Optional[str] = None
    to_hf: Optional[Callable[[Any], Tuple[Dict[str, Any], Dict[str, np.ndarray]]]] = None
    hf_wordpiece: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"tokenizer_class": "BertTokenizer"})
    hf_bench: Optional[HFBench] = None
    sample: Optional[Callable[..., List[str]]] = None
    from_tf: Optional[TFImport] = None
    reporting: Reporting = Reporting()
    stream: Optional[Stream] = None

    def model_config(self, model_section: Mapping[str, Any], **overrides):
        """`config_class` from a `config.model` mapping (its `family` key ignored), lists as tuples; an unknown key
        is an error naming it and the valid fields."""
        return model_config(self.config_class, model_section, **overrides)

    def head(self, kind: str, cfg, *, num_labels: int, answerability: bool, rngs):
        """The finetuning model for a task of `kind` (see `heads`)."""
        if kind not in self.heads:
            supported = sorted(self.heads) or "none: this family has no finetuning heads"
            raise ValueError(f"model.family={self.name!r}: no finetuning head for task kind {kind!r} ({supported})")
        return self.heads[kind](cfg, num_labels=num_labels, answerability=answerability, rngs=rngs)


def model_config(cls: type, model_section: Mapping[str, Any], **overrides):
    """`cls` (a family's frozen config dataclass) from a `config.model` mapping (its `family` key ignored), lists as
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
