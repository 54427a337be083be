"""`xlgen export --workdir=W --to-stablehlo=OUT` (and the function `--to-onnx` exports): a trained model as a
deployed function of arrays, with the weights inside.

What a workdir deploys (`served`):

    finetuned head (xlnet, funnel)     inputs  input_ids, token_type_ids, attention_mask `[batch, length]` int32
                                               (multiple choice `[batch, choices, length]`; SQuAD adds p_mask
                                               `[batch, length]` float32 and cls_index `[batch]` int32)
                                       outputs the finetuning objective's inference outputs
                                               (`xlgen.finetune.objective.forward`, train=False): `logits`, or
                                               SQuAD start/end logits (+ `cls_logits`, answerability) / XLNet's
                                               beam arrays
    language model (a `Stream` record) inputs  input_ids `[batch, length]` int32, mems `[n_layer, batch, M, d]`
                                               float32, mem_valid `[batch]` int32 (real rows at the end of mems;
                                               0 = empty memory: start of a text)
                                       outputs log_probs / logits `[batch, length, V]`, mems, mem_valid
                                               (= min(mem_valid + length, M)): fed back in with the next segment

`OUT/model.stablehlo` is `jax.export.Exported.serialize()`; `jax.export.deserialize(bytes).call(*arrays)` runs it
with jax alone. Its batch axis is symbolic; its length axis too where the model's shapes allow it (else the
length it was trained with). `OUT/io.json` names the inputs and outputs with their shapes (symbolic axes by name)
and dtypes, the label names and the tokenizer files written beside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from xlgen.deploy.shapes import symbolic_args

Dim = Union[int, str]


class NotExportable(ValueError):
    """The workdir holds nothing `--to-onnx` / `--to-stablehlo` exports (one line naming what can be)."""


@dataclasses.dataclass(frozen=True)
class Stream:
    """The record of a pretrained language model served segment by segment with its memory, in `Family.records`
    (`xlgen.registry`): what `--to-onnx` / `--to-stablehlo` export of a pretraining workdir.

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
class TensorSpec:
    name: str
    shape: Tuple[Dim, ...]  # ints, or "batch" / "length" (symbolic axes)
    dtype: str  # numpy dtype name

    def concrete(self, sizes: Dict[str, int]) -> Tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)


@dataclasses.dataclass
class Served:
    """A workdir's model as a function of arrays: `fn(*inputs) -> tuple of outputs` (weights closed over)."""

    kind: str  # a finetuning task kind, or "language_model"
    fn: Callable[..., Tuple[Any, ...]]
    inputs: List[TensorSpec]
    outputs: List[str]
    trained: Dict[str, int]  # the sizes of the symbolic axes in the trained program {"batch": b, "length": l}
    family: str
    task: Optional[str] = None
    label_names: Optional[Sequence[str]] = None
    input_style: Optional[str] = None  # "cls_last" (left padding, <cls> last) | "cls_first" (`Finetuning.input_style`)
    module: Any = None  # the eval-mode module (for the ONNX route)
    config: Any = None
    notes: Dict[str, Any] = dataclasses.field(default_factory=dict)
    min_length: int = 1  # the shortest length the symbolic program holds for (`symbolic_args`)

    def example(self, sizes: Optional[Dict[str, int]] = None, seed: int = 0) -> List[np.ndarray]:
        """Valid random inputs of the given axis sizes (default: the trained ones)."""
        sizes = dict(self.trained, **(sizes or {}))
        return example_inputs(self, sizes, seed)


# ----------------------------------------------------------------------------------------------------------------
# What a workdir deploys
# ----------------------------------------------------------------------------------------------------------------

HEAD_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "p_mask", "cls_index")


def exportable_summary() -> str:
    """What `--to-onnx` / `--to-stablehlo` export, from the registry (one line)."""
    from xlgen import registry
    from xlgen.finetune.record import Finetuning

    heads, lms = [], []
    for name in registry.names():
        fam = registry.get(name)
        if fam.record(Finetuning) is not None:
            heads.append(name)
        if fam.record(Stream) is not None:
            lms.append(name)
    return (
        f"finetuned heads of {', '.join(heads)} (xlgen finetune workdirs) and the language models of "
        f"{', '.join(lms)} (pretraining workdirs)"
    )


def served(config, program, params, *, kind_of_run: str) -> Served:
    """The deployed function of a restored workdir (`xlgen.train.workdir_model.restore_params`)."""
    if kind_of_run == "finetune":
        from xlgen.finetune.peft import lora_rank, merged_model

        module = merged_model(config, program, params) if lora_rank(config) else program.make_model(params)
    else:
        module = program.make_model(params)
    return served_module(config, module, kind_of_run=kind_of_run)


def served_module(config, module, *, kind_of_run: str) -> Served:
    """The deployed function of an eval-mode module built for `config` (a finetuning head, or a pretraining
    model whose family has a `Stream`)."""
    from flax import nnx

    from xlgen import registry

    family = registry.get(config.model.family)
    if kind_of_run == "finetune":
        module.eval()
        return _served_head(config, family, module)
    objective = registry.objective(config)
    if family.record(Stream) is None or objective.build_program is not None:
        raise NotExportable(
            f"model.family={family.name!r} objective={objective.name!r} (a pretraining run) has no deployable "
            f"function; exportable: {exportable_summary()}"
        )
    module = family.record(Stream).prepare(unrolled(module))
    module.eval()
    graphdef, state = nnx.split(module)
    return _served_stream(config, family, graphdef, state, module)


def unrolled(module):
    """`module` with its layer stack unrolled (`config.scan_layers=False`), the same parameter values: a scanned
    stack of NNX layers does not trace with `jax.export` dimension variables, an unrolled one computes the same
    function. The stacked `<prefix>.rest` [n_layer, ...] becomes `<prefix>.<i>.rest`. Unscanned modules are
    returned as they are."""
    import re

    from flax import nnx

    from xlgen.models.params import flat_params, materialize

    config = getattr(module, "config", None)
    if not getattr(config, "scan_layers", False):
        return module
    stacked = flat_params(module, dtype=None)
    abstract = nnx.eval_shape(lambda: type(module)(dataclasses.replace(config, scan_layers=False), rngs=nnx.Rngs(0)))

    def value(name, shape):
        if name in stacked:
            return stacked[name]
        m = re.fullmatch(r"(.*layers)\.(\d+)\.(.*)", name)
        return stacked[f"{m[1]}.{m[3]}"][int(m[2])]

    return materialize(abstract, value)


def _axis_names(shape: Tuple[int, ...], length: int) -> Tuple[Dim, ...]:
    """A finetuning batch shape with its symbolic axes named: axis 0 "batch", a last axis of the sequence length
    "length"; the others (choices, segments) stay fixed."""
    out: List[Dim] = ["batch"] + list(shape[1:])
    if len(shape) > 1 and shape[-1] == length:
        out[-1] = "length"
    return tuple(out)


def _served_head(config, family, module) -> Served:
    from flax import nnx

    from xlgen.finetune import objective as ft
    from xlgen.finetune.record import input_style
    from xlgen.finetune.tasks import get_task

    task = get_task(config.task)
    spec = ft.batch_shapes(config, "eval")
    length = int(config.data.max_seq_length)
    names = [k for k in HEAD_INPUTS if k in spec]
    inputs = [TensorSpec(k, _axis_names(spec[k][0], length), np.dtype(spec[k][1]).name) for k in names]
    graphdef, state = nnx.split(module)

    def fn(*arrays):
        model = nnx.merge(graphdef, state)
        out = ft.forward(model, dict(zip(names, arrays)), config, train=False)
        return tuple(out[k] for k in sorted(out))

    served_ = Served(
        kind=task.kind,
        fn=fn,
        inputs=inputs,
        outputs=[],
        trained={"batch": int(spec["input_ids"][0][0]), "length": length},
        family=family.name,
        task=task.name,
        label_names=task.label_names,
        input_style=input_style(family),
        module=module,
        config=config,
    )
    served_.outputs = _head_output_keys(config, module, served_)
    if task.kind == "squad" and "start_top_index" in served_.outputs:
        served_.notes["beam"] = (
            "end_top_* rows k*E + j: the j-th best end for the k-th best start (S = start_n_top, E = end_n_top)"
        )
    return served_


def _head_output_keys(config, module, served_: Served) -> List[str]:
    """The names of the head's inference outputs, sorted (the order `fn` returns them in)."""
    import jax
    from flax import nnx

    from xlgen.finetune import objective as ft

    graphdef, state = nnx.split(module)
    names = [s.name for s in served_.inputs]
    arrays = [jax.ShapeDtypeStruct(s.concrete(served_.trained), s.dtype) for s in served_.inputs]
    forward = lambda *a: ft.forward(nnx.merge(graphdef, state), dict(zip(names, a)), config, train=False)
    return sorted(jax.eval_shape(forward, *arrays))


def _served_stream(config, family, graphdef, state, module) -> Served:
    import jax.numpy as jnp
    from flax import nnx

    from xlgen import registry
    from xlgen.models.relative_attention import advance_memory_validity

    stream = family.record(Stream)
    n_layer, mem_len, d_model = stream.memory(module)
    spec = registry.objective(config).batch_shapes(config, "eval")
    ids_shape = spec["input_ids"][0] if "input_ids" in spec else next(s for s, _ in spec.values() if len(s) == 2)
    inputs = [TensorSpec("input_ids", ("batch", "length"), "int32")]
    if mem_len:
        inputs += [
            TensorSpec("mems", (n_layer, "batch", mem_len, d_model), "float32"),
            TensorSpec("mem_valid", ("batch",), "int32"),
        ]

    def fn(input_ids, mems=None, mem_valid=None):
        model = nnx.merge(graphdef, state)
        scores, new_mems = stream.step(model, input_ids, mems, mem_valid)
        if not mem_len:
            return (scores.astype(jnp.float32),)
        valid = advance_memory_validity(mem_valid, input_ids.shape[1], mem_len)
        return scores.astype(jnp.float32), new_mems.astype(jnp.float32), valid

    outputs = [stream.scores] + (["mems", "mem_valid"] if mem_len else [])
    notes = {}
    if mem_len:
        notes["memory"] = (
            "start a text with mems = zeros and mem_valid = 0; feed each segment's mems and mem_valid outputs "
            "back with the next segment (the last mem_valid rows of mems are the previous tokens' states)"
        )
    return Served(
        kind="language_model",
        fn=fn,
        inputs=inputs,
        outputs=outputs,
        trained={"batch": int(ids_shape[0]), "length": int(ids_shape[-1])},
        family=family.name,
        module=module,
        config=config,
        notes=notes,
    )


def example_inputs(served_: Served, sizes: Dict[str, int], seed: int = 0) -> List[np.ndarray]:
    """Random valid inputs: token ids below the vocabulary size, left/right padding in the attention mask, a
    p_mask over the padding, cls_index at <cls>, a memory of random states with a random number of valid rows."""
    rng = np.random.default_rng(seed)
    vocab = _vocab_size(served_)
    cls_last = served_.input_style == "cls_last"
    out = []
    for s in served_.inputs:
        shape = s.concrete(sizes)
        if s.name == "input_ids":
            a = rng.integers(0, vocab, shape)
        elif s.name == "token_type_ids":
            a = (np.arange(shape[-1]) >= shape[-1] // 2).astype(np.int64) * np.ones(shape, np.int64)
        elif s.name == "attention_mask":  # two padding positions in the first row
            a = np.ones(shape, np.int64)
            pad = slice(0, 2) if cls_last else slice(shape[-1] - 2, shape[-1])
            a[(0,) + (slice(None),) * (len(shape) - 2) + (pad,)] = 0
        elif s.name == "p_mask":
            a = np.zeros(shape, np.float32)
            a[:, -1] = 1.0
        elif s.name == "cls_index":
            a = np.full(shape, sizes["length"] - 1 if cls_last else 0)
        elif s.name == "mems":
            a = rng.normal(size=shape)
        elif s.name == "mem_valid":
            a = rng.integers(0, served_.inputs[1].shape[2] + 1, shape)
        else:  # pragma: no cover - every input above
            raise KeyError(s.name)
        out.append(np.asarray(a, s.dtype))
    return out


def _vocab_size(served_: Served) -> int:
    cfg = served_.module.config
    return int(getattr(cfg, "vocab_size"))


# ----------------------------------------------------------------------------------------------------------------
# StableHLO (jax.export)
# ----------------------------------------------------------------------------------------------------------------


def export_stablehlo(served_: Served):
    """`jax.export.Exported` of `served_.fn` with the input shapes of `symbolic_args`. Returns (exported,
    {axis: "symbolic" | size})."""
    import jax
    from jax import export

    _, axes, exported = symbolic_args(served_, lambda args: export.export(jax.jit(served_.fn))(*args))
    return exported, axes


def _dims(shape) -> List[Dim]:
    return [d if isinstance(d, int) else str(d) for d in shape]


def io_description(
    served_: Served, fmt: str, axes: Dict[str, Any], out_shapes: Sequence[Tuple[Sequence, str]], files: Sequence[str]
) -> Dict[str, Any]:
    """The `io.json` of an export: inputs/outputs (names, shapes with symbolic axes by name, dtypes) and the rest a
    server needs."""

    def shape(s: TensorSpec):
        return [d if not isinstance(d, str) or axes.get(d) == "symbolic" else axes[d] for d in s.shape]

    desc = {
        "format": fmt,
        "family": served_.family,
        "kind": served_.kind,
        "task": served_.task,
        "axes": axes,
        "inputs": [{"name": s.name, "shape": shape(s), "dtype": s.dtype} for s in served_.inputs],
        "outputs": [{"name": n, "shape": _dims(sh), "dtype": dt} for n, (sh, dt) in zip(served_.outputs, out_shapes)],
        "min_length": served_.min_length,
        "label_names": list(served_.label_names) if served_.label_names else None,
        "files": sorted(files),
    }
    desc.update(served_.notes)
    return desc


def write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------------------
# A workdir to an export directory
# ----------------------------------------------------------------------------------------------------------------

FORMATS = {"stablehlo": "model.stablehlo", "onnx": "model.onnx"}


def run_kind(workdir: str) -> str:
    """ "finetune" or "pretrain"; NotExportable (one line naming what is exportable) for a run whose model has no
    deployed function: checked on the workdir's config.json alone, before any checkpoint is read."""
    from xlgen import registry
    from xlgen.finetune import is_finetune_workdir
    from xlgen.train.workdir import Workdir

    wd = Workdir.parse(workdir)[0]
    if is_finetune_workdir(wd.path):
        return "finetune"
    config = wd.read_config()
    if config is None:
        raise FileNotFoundError(f"--workdir={workdir}: no config.json (not an xlgen workdir)")
    family = registry.get(config.model.family)
    objective = registry.objective(config)
    if family.record(Stream) is None or objective.build_program is not None:
        raise NotExportable(
            f"--workdir={workdir}: a {family.name} {objective.name} pretraining run has no deployable function; "
            f"exportable: {exportable_summary()}"
        )
    return "pretrain"


def export_workdir(
    workdir: str,
    out_dir: str,
    fmt: str,
    step: Optional[int] = None,
    tokenizer_files: Optional[Callable[[Any, str, str], List[str]]] = None,
):
    """Write `OUT/model.<fmt>`, `OUT/io.json`, `OUT/labels.txt` (tasks with label names) and the tokenizer files
    (`tokenizer_files(config, directory, hf_model_type) -> names`, `xlgen.interop.export`); returns (out path, io
    description)."""
    from xlgen import registry
    from xlgen.pretrained import hf_model_type
    from xlgen.train import outdir
    from xlgen.train.workdir_model import restore_params

    flag = f"--to-{fmt}"
    outdir.check_export_dir(out_dir, flag)
    kind = run_kind(workdir)
    config, program, params, _ = restore_params(workdir, step)
    served_ = served(config, program, params, kind_of_run=kind)
    if fmt == "stablehlo":
        exported, axes = export_stablehlo(served_)
        payload = bytes(exported.serialize())
        out_shapes = [(a.shape, np.dtype(a.dtype).name) for a in exported.out_avals]
    else:
        from xlgen.deploy import onnx_graph as deploy_onnx

        payload, axes, out_shapes = deploy_onnx.export_onnx(served_)
        served_ = dataclasses.replace(served_, outputs=deploy_onnx.output_names(served_))
    desc = {}

    def fill(tmp: str) -> None:
        with open(os.path.join(tmp, FORMATS[fmt]), "wb") as f:
            f.write(payload)
        files = [FORMATS[fmt], "io.json"]
        if tokenizer_files is not None:
            files += tokenizer_files(config, tmp, hf_model_type(registry.get(served_.family)) or "")
        if served_.label_names:
            with open(os.path.join(tmp, "labels.txt"), "w", encoding="utf-8") as f:
                f.write("".join(f"{n}\n" for n in served_.label_names))
            files.append("labels.txt")
        desc.update(io_description(served_, fmt, axes, out_shapes, files))
        write_json(os.path.join(tmp, "io.json"), desc)

    out = outdir.write_export_dir(out_dir, fill, flag=flag, kind=fmt)
    return out, desc
