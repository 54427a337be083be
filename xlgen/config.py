"""Config files, command-line overrides and the resolved `config.json`.

A config file is a Python file with `get_config()` returning an `ml_collections.ConfigDict` (see
`configs/pretrain/*.py`). Every key a run can use is declared there with its default, so that

    --config.optimizer.learning_rate=3e-4      # type-checked against the declared default (int -> float ok)
    --config.model.n_layer=4
    --config.mesh.data=-1

are checked: an unknown key is an error that lists the valid keys (with a "did you mean" suggestion), and a value that
does not parse as the declared type is an error naming the key. Values are parsed as Python literals (`True`, `3e-4`,
`(1, 2)`, `None`); strings need no quotes.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import re
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import ml_collections

ConfigDict = ml_collections.ConfigDict


class ConfigError(ValueError):
    """A bad config file, key or value (the message names the file or key)."""


def split_config_arg(path: str) -> Tuple[str, str | None]:
    """`configs/x.py:ARG` -> (`configs/x.py`, `ARG`) (the `ml_collections.config_flags` syntax: `get_config(ARG)`);
    a plain path -> (path, None)."""
    if os.path.exists(path) or ".py:" not in path:
        return path, None
    head, _, arg = path.partition(".py:")
    return head + ".py", arg


def load_config_file(path: str) -> ConfigDict:
    """Import `path` and return its `get_config()` (unlocked copy); `path:ARG` returns `get_config(ARG)`."""
    path, arg = split_config_arg(path)
    if not os.path.exists(path):
        raise ConfigError(f"{path}: config file not found")
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a directory; --config takes a Python file with get_config()")
    if path.endswith(".json"):  # a workdir's resolved config.json
        with open(path, "rb") as f:
            return parse_json_config(f.read(), path)
    if not path.endswith(".py"):
        raise ConfigError(f"{path}: not a Python file; --config takes a .py file with get_config() (or a config.json)")
    spec = importlib.util.spec_from_file_location(f"xlgen_config_{abs(hash(os.path.abspath(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a syntax/import error in the user's config: say which file
        raise ConfigError(f"{path}: cannot import config file: {type(e).__name__}: {e}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: no get_config() function")
    try:
        config = module.get_config() if arg is None else module.get_config(arg)
    except Exception as e:  # noqa: BLE001  (any error of the user's get_config: name the file)
        where = path if arg is None else f"{path}:{arg}"
        what = "" if isinstance(e, (TypeError, ValueError)) else f"{type(e).__name__}: "  # a bad argument: its message
        raise ConfigError(f"{where}: get_config: {what}{e}") from e
    if not isinstance(config, ConfigDict):
        raise ConfigError(f"{path}: get_config() must return an ml_collections.ConfigDict, got {type(config).__name__}")
    return ConfigDict(config.to_dict(), type_safe=True)


def flat_keys(config: ConfigDict, prefix: str = "") -> List[str]:
    """All leaf keys of a (nested) ConfigDict as dotted names, sorted."""
    keys = []
    for k, v in config.items():
        name = f"{prefix}{k}"
        if isinstance(v, ConfigDict):
            keys.extend(flat_keys(v, name + "."))
        else:
            keys.append(name)
    return sorted(keys)


def flat_items(config: ConfigDict) -> Dict[str, Any]:
    """{dotted key: value} of every leaf of `config`, keys sorted."""
    out = {}
    for key in flat_keys(config):
        node = config
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def _literal(key: str, text: str) -> Any:
    """A field declared `None` (no type to parse by): any Python literal; a bare word is a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _expected(key: str, text: str, current: Any) -> ConfigError:
    if isinstance(current, bool):
        return ConfigError(f"--config.{key}={text}: expected a bool (True/False)")
    if isinstance(current, (tuple, list)):
        return ConfigError(f"--config.{key}={text}: expected a tuple like (1, 2) (declared default {current!r})")
    kind = {int: "an int", float: "a float"}.get(type(current), type(current).__name__)
    return ConfigError(f"--config.{key}={text}: expected {kind} (declared default {current!r})")


def _flag_text(key: str, text: str, current: Any) -> str:
    """The command-line spellings xlgen accepts beyond absl's parsers: yes/no for bools, 1e3 for ints."""
    if isinstance(current, bool):
        low = text.strip().lower()
        return {"yes": "true", "no": "false"}.get(low, low)
    if isinstance(current, int):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
    return text


def _unknown_key_error(key: str, valid: Sequence[str], where: str) -> ConfigError:
    """`unknown config key K (where). Did you mean ...?` and how to list every key; with no close match, the valid
    keys of K's deepest existing section (the top-level sections when there is none)."""
    close = difflib.get_close_matches(key, valid, n=3)
    if close:
        return ConfigError(
            f"unknown config key {key!r} ({where}). Did you mean {', '.join(close)}? "
            "(every key with its value: xlgen config show --config=PATH)"
        )
    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        section = ".".join(parts[:depth]) + "."
        keys = [k for k in valid if k.startswith(section)]
        if keys:
            return ConfigError(
                f"unknown config key {key!r} ({where}). Valid keys of {section[:-1]}:\n  " + "\n  ".join(keys)
            )
    tops = sorted({k.split(".")[0] + ("." if "." in k else "") for k in valid})
    return ConfigError(
        f"unknown config key {key!r} ({where}). Valid keys and sections: {', '.join(tops)} "
        "(every key: xlgen config show --config=PATH)"
    )


def _field(config: ConfigDict, key: str, valid: Sequence[str]) -> Tuple[ConfigDict, str]:
    """(parent section, leaf name) of dotted `key`; unknown keys and sections are errors naming the valid keys."""
    parts = key.split(".")
    node = config
    for i, part in enumerate(parts):
        if not isinstance(node, ConfigDict) or part not in node:
            raise _unknown_key_error(key, valid, "command line")
        if i < len(parts) - 1:
            node = node[part]
    if isinstance(node[parts[-1]], ConfigDict):
        raise ConfigError(
            f"--config.{key}: is a section, set one of its keys: "
            + ", ".join(k for k in valid if k.startswith(key + "."))
        )
    return node, parts[-1]


def apply_overrides(config: ConfigDict, overrides: Dict[str, str]) -> ConfigDict:
    """Set dotted keys from command-line strings, in place. The values are parsed by `ml_collections.config_flags`
    (absl's flag parsers, typed by each field's declared default); a field declared `None` takes any Python
    literal. Every key is checked first: an unknown key is an error with a "did you mean" and the valid keys; a
    value of the wrong type is an error naming the key and its declared default."""
    from absl import flags
    from ml_collections import config_flags

    valid = flat_keys(config)
    typed: Dict[str, str] = {}
    for key, text in overrides.items():
        node, leaf = _field(config, key, valid)
        current = node[leaf]
        if current is None:  # config_flags has no parser for a None-declared field
            with node.unlocked():
                node[leaf] = _literal(key, text)
        else:
            typed[key] = _flag_text(key, text, current)
    if typed:
        argv = ["xlgen"] + [f"--config.{k}={v}" for k, v in typed.items()]
        flag_values = flags.FlagValues()
        config_flags.DEFINE_config_dict("config", config, flag_values=flag_values, lock_config=False, sys_argv=argv)
        try:
            flag_values(argv)
        except flags.Error as e:
            m = re.search(r"--config\.([\w.]+)=", str(e))
            if m is None or m.group(1) not in typed:
                raise ConfigError(f"command-line config overrides: {e}") from None
            node, leaf = _field(config, m.group(1), valid)
            raise _expected(m.group(1), overrides[m.group(1)], node[leaf]) from None
    return config


def apply_override(config: ConfigDict, key: str, text: str) -> None:
    """Set dotted `key` from the command-line string `text`, type-checked against the declared default."""
    apply_overrides(config, {key: text})


def parse_overrides(argv: Iterable[str]) -> Tuple[Dict[str, str], List[str]]:
    """Split `--config.KEY=VALUE` arguments from the others. Returns ({key: text}, rest)."""
    overrides, rest = {}, []
    argv = list(argv)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--config."):
            body = a[len("--config.") :]
            if "=" in body:
                k, v = body.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                k, v = body, argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"{a}: missing value (use --config.KEY=VALUE)")
            if k in overrides:
                raise ConfigError(f"--config.{k} given twice")
            overrides[k] = v
        else:
            rest.append(a)
        i += 1
    return overrides, rest


def load_config(path: str, overrides: Dict[str, str] | Sequence[str] = ()) -> ConfigDict:
    """`get_config()` of `path` with overrides applied (dict key->text, or a list of `--config.K=V` strings)."""
    config = load_config_file(path)
    if not isinstance(overrides, dict):
        overrides, rest = parse_overrides(overrides)
        if rest:
            raise ConfigError(f"not config overrides: {rest}")
    return validate(follow_objective(apply_overrides(config, overrides)))


def follow_objective(config: ConfigDict) -> ConfigDict:
    """`config.data.pipeline` follows the run's objective (`xlgen.registry.objective`): the objective names the stream
    it reads, so a config cannot pair it with another. A config whose data section holds the keys of another
    pipeline with the same keys (mlm <-> electra) is switched; one with different keys is an error naming both."""
    model, data = config.get("model"), config.get("data")
    if model is None or data is None or "pipeline" not in data or "family" not in model:
        return config
    from xlgen import registry

    try:
        objective = registry.objective(config)
    except ValueError:
        return config  # an unknown family / objective is reported where the run is built, with its valid names
    want, have = objective.pipeline, data.pipeline
    if not isinstance(want, str) or want == have:
        return config
    import data_pipelines

    if have in data_pipelines.PIPELINES and set(data_pipelines.default_config(have)) == set(
        data_pipelines.default_config(want)
    ):
        config.data.pipeline = want  # an existing key: allowed on a locked ConfigDict too
        return config
    raise ConfigError(
        f"config.data.pipeline={have!r}: objective {objective.name!r} reads the {want!r} stream; start config.data "
        f"from data_pipelines.default_config({want!r}) (or choose an objective of {have!r} data)"
    )


def _get(config: ConfigDict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, ConfigDict) or part not in node:
            return None
        node = node[part]
    return node


DTYPES = ("float32", "bfloat16", "float16")


def validate(config: ConfigDict) -> ConfigDict:
    """Domain checks of every numeric key (`xlgen.domains.KEYS`: sizes and steps positive, rates in [0, 1), seeds in
    [0, 2**32), ...) and known dtype names. A violation is a ConfigError naming the key and its allowed range."""
    from xlgen import domains

    items = flat_items(config)
    bad = domains.problems(items)
    if bad:
        key = sorted(bad)[0]
        raise ConfigError(f"config key {key}={items[key]!r}: {bad[key]}")
    for key in ("model.dtype", "model.param_dtype"):
        v = _get(config, key)
        if v is not None and v not in DTYPES:
            raise ConfigError(f"config key {key}={v!r}: expected one of {', '.join(DTYPES)}")
    return config


def to_json_dict(config: ConfigDict) -> Dict[str, Any]:
    return json.loads(config.to_json_best_effort())


def from_json_dict(d: Dict[str, Any]) -> ConfigDict:
    d = {k: v for k, v in d.items() if k != "xlgen"}
    return ConfigDict(_tuplify(d), type_safe=True)


def _tuplify(x):
    if isinstance(x, dict):
        return {k: _tuplify(v) for k, v in x.items()}
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    return x


def write_resolved_config(
    config: ConfigDict, workdir: str, kind: str = "pretrain", meta: Dict[str, Any] | None = None
) -> str:
    """Write `workdir/config.json` (the resolved config, tagged with an `xlgen` block {"version", "kind", **meta}
    so that `xlgen.from_pretrained(workdir)` knows it is an xlgen workdir and not a Hugging Face directory).
    Commands open runs through `xlgen.train.workdir.Workdir`, which calls this."""
    from data_pipelines import paths
    from xlgen.version import __version__

    paths.makedirs(workdir)
    path = paths.join(workdir, "config.json")
    d = to_json_dict(config)
    d["xlgen"] = {"version": __version__, "kind": kind, **(meta or {})}
    paths.write_json_atomic(path, d)
    return path


def read_workdir_config(workdir: str) -> ConfigDict | None:
    """`workdir/config.json` (local or gs://) as a ConfigDict, or None if there is none (`Workdir.read_config`
    also registers a finetune run's objective)."""
    from data_pipelines import paths

    path = paths.as_path(workdir) / "config.json"
    if not path.exists():
        return None
    return parse_json_config(path.read_bytes(), str(path))


def parse_json_config(data: bytes, path: str) -> ConfigDict:
    """A resolved config.json's bytes as a ConfigDict; not UTF-8, not JSON or not a run's config (no `model`
    section) is a ConfigError naming the file."""
    try:
        d = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise ConfigError(f"{path}: not an xlgen run config (no `model` section)")
    return validate(with_declared_defaults(from_json_dict(d)))


# sections a config file sets as a whole for its system (base_config's are placeholders or one system's keys)
SYSTEM_SECTIONS = ("model", "data", "eval")


def with_declared_defaults(config: ConfigDict) -> ConfigDict:
    """A stored config.json completed with the keys of `base_config()` it predates, at their declared defaults
    (outside SYSTEM_SECTIONS), so that code reads every key without a fallback of its own."""

    def fill(node: ConfigDict, declared: ConfigDict, top: bool) -> None:
        for key, value in declared.items():
            if top and key in SYSTEM_SECTIONS:
                continue
            if key not in node:
                with node.unlocked():
                    node[key] = value
            elif isinstance(value, ConfigDict) and isinstance(node[key], ConfigDict):
                fill(node[key], value, False)

    fill(config, base_config(), True)
    return config


def model_section(family: str, **fields) -> Dict[str, Any]:
    """`config.model` of a registered system: `family` and every field of its config dataclass at its default, a
    nested config record (a field whose default instance holds a dataclass, e.g. Transformer-XL's `output`) as a
    section of its defaults; `fields` set on top. A config file states only what differs from the dataclass."""
    import dataclasses

    from xlgen import registry

    cls = registry.get(family).config_class
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"model.{unknown[0]}: not a field of {cls.__name__}")
    instance = cls()
    section: Dict[str, Any] = {"family": family}
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            section[f.name] = dataclasses.asdict(value)
        else:
            section[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return section | fields


def base_config() -> ConfigDict:
    """Every training key with its default; config files start from this and set `model` and `data`.

    model             family ("transformer_xl" | "xlnet" | "funnel") + the family config's fields
    objective         "" = family default (txl_lm | xlnet_plm | funnel_mlm); or funnel_electra, or a registered one
    objective_options loss_positions ("all" | "later_half", TXL), disc_coeff / generator_* (ELECTRA)
    data              the data pipeline's keys (data_pipelines.default_config(pipeline), docs/data.md)
    optimizer         see xlgen/train/optim.py
    mesh              data / fsdp / tensor sizes (-1 = fill) and the rule preset (dp | fsdp | fsdp_tp)
    checkpoint        every_steps, keep, async_save, save_mems, local_dir, local_every_steps
    watchdog          timeout_s (0 = derived from the step time), factor, min_timeout_s, phase_timeout_s,
                      straggler_factor (xlgen/train/watchdog.py)
    profile           start_step (-1 = off), num_steps, top_ops: a jax.profiler trace of those steps + a summary
    eval              split, steps (-1 = whole split), mem_len / same_length / clamp_len (TXL eval), metric
    """
    c = ConfigDict()
    c.model = ConfigDict({"family": ""})
    c.objective = ""
    c.objective_options = ConfigDict(
        dict(
            loss_positions="all",  # TXL: "all" or "later_half" (loss only on the second half of each segment)
            disc_coeff=50.0,  # ELECTRA: loss = generator MLM + disc_coeff * discriminator BCE
            disc_target="original",  # ELECTRA discriminator target 1 = original token (original code); "replaced"
            generator_width=0.25,  # ELECTRA: generator d_model / d_inner / n_head shrink factor
            # Funnel MLM/ELECTRA: the last decoder layer and the MLM softmax run at this many masked positions per
            # row only; 0 = the mlm/electra pipeline's own per-row count (exact), -1 = at every position
            max_predictions=0,
        )
    )
    c.data = ConfigDict()
    c.optimizer = ConfigDict(
        dict(
            name="adamw",
            learning_rate=2.5e-4,
            warmup_steps=0,
            schedule="cosine",
            poly_power=1.0,
            min_lr_ratio=0.0,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=0.0,
            clip_norm=0.25,
            lr_layer_decay_rate=1.0,
            layer_decay_mode="lr",  # "lr" | "faithful" (the originals' gradient scaling); xlgen/train/optim.py
            update_rule="optax",  # "optax" | "original" (the originals' Adam / AdamWeightDecayOptimizer)
            bias_correction=True,  # update_rule "original" only: False = XLNet's AdamWeightDecayOptimizer
            weight_decay_mask="xlgen",  # "xlgen" | "original" (r_w/r_r/r_s biases decayed) | "all" (Funnel)
            grad_accum_steps=1,
            param_groups=None,  # ({"pattern": regex, "lr_scale"|"learning_rate": x, "frozen": bool}, ...); optim.py
            # ((step, total_steps before it), ...): where a resumed run changed total_steps; set by `xlgen train`
            # (xlgen/train/optim.py continue_schedule: from each step the LR decays from its value there, no re-warm-up)
            schedule_history=(),
            state_dtype="",  # optimizer state (Adam moments) storage dtype: "" = the parameters', or "bfloat16"
            # name "lamb": which parameters get the trust ratio ("xlgen": not biases / LayerNorm; "all"); optim.py
            lamb=ConfigDict(dict(trust_ratio_mask="xlgen")),
            # name "adafactor": optax.adafactor's options (xlgen/train/optim.py); clipping_threshold / momentum 0 = off
            adafactor=ConfigDict(
                dict(
                    factored=True,
                    min_dim_size_to_factor=128,
                    decay_rate=0.8,
                    clipping_threshold=1.0,
                    multiply_by_parameter_scale=True,
                    momentum=0.0,
                    eps=1e-30,
                    relative_step=False,
                    warmup_init=False,
                )
            ),
        )
    )
    # num_devices 0 = all; num_slices: slices over DCN (`data` spans them; xlgen.sharding.make_mesh)
    c.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1, rules="fsdp", num_devices=0, num_slices=1))
    # local_dir / local_every_steps: a local checkpoint tier saved between the workdir's saves (xlgen/train/tiers.py)
    c.checkpoint = ConfigDict(
        dict(every_steps=1000, keep=3, async_save=True, save_mems=True, local_dir="", local_every_steps=0)
    )
    # hang watchdog (xlgen/train/watchdog.py): timeout_s 0 = factor x the longest recent gap between steps, at least
    # min_timeout_s; compilation, evaluation and checkpointing get phase_timeout_s; a hung run exits with status 3
    c.watchdog = ConfigDict(
        dict(timeout_s=0.0, factor=10.0, min_timeout_s=300.0, phase_timeout_s=3600.0, straggler_factor=3.0)
    )
    # jax.profiler trace of updates start_step+1 .. start_step+num_steps into WORKDIR/profile (start_step -1 = off),
    # then the top_ops operations by time printed (xlgen/train/profile.py)
    c.profile = ConfigDict(dict(start_step=-1, num_steps=3, top_ops=12))
    # TXL eval: mem_len / same_length / clamp_len None = as in training (the papers evaluate with longer memory)
    c.eval = ConfigDict(dict(split="valid", steps=-1, mem_len=None, same_length=None, clamp_len=None, metric="ppl"))
    c.total_steps = 1000
    c.log_every_steps = 50
    c.eval_every_steps = 500  # 0 = never (not even at the end), -1 = only at the end
    c.seed = 0
    c.prefetch = 2  # training batches built ahead on a worker thread (data_pipelines.prefetch); 0 = in line
    c.peak_flops_per_device = 0.0  # for MFU; per JAX device, e.g. 61.5e12 for one TPU v3 TensorCore (bf16)
    c.tensorboard = True
    # optional trackers besides metrics.jsonl / TensorBoard: "" or a comma list of wandb, mlflow (xlgen.train.metrics)
    c.trackers = ""
    c.tracking = ConfigDict(dict(project="xlgen", run_name="", mlflow_uri=""))  # mlflow_uri "" = WORKDIR/mlruns
    # a step with a non-finite loss or gradient norm skips its update; this many in a row stop the run (0 = never)
    c.max_nonfinite_steps = 10
    # a finite loss above divergence_factor x max(best loss so far, 1) is unhealthy like a non-finite one (so is one
    # above a uniform guess, log V, once the model has beaten it): no checkpoint is saved during such a streak and
    # max_nonfinite_steps of them in a row stop the run (0 = off)
    c.divergence_factor = 3.0
    return c
