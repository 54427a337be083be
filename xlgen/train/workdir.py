"""A run directory, opened one way by every command (train, eval, finetune, `from_pretrained`, init_from).

    DIR/config.json      the resolved config + an `xlgen` block: {"version", "kind": "pretrain" | "finetune",
                         "tokenizer": "tokenizer/<file>" (the run's tokenizer, when one was recorded)}
    DIR/checkpoints/<s>  Orbax checkpoints (state, memory, meta) — resume point
    DIR/best/<s>         finetuning: the best checkpoint by the task's primary metric
    DIR/metrics.jsonl    one JSON record per logged step / evaluation (`xlgen.train.metrics`)
    DIR/tokenizer/       the run's tokenizer file(s), named in config.json
    DIR/cache/           finetuning: tokenized task features

`Workdir.parse("DIR/checkpoints/1200")` -> (Workdir("DIR"), step 1200, "checkpoints"): a checkpoint path names its
run and step. `hf_config(path)` tells a Hugging Face model directory (config.json with `model_type`, no `xlgen`
block) from an xlgen workdir. `DIR` may be a URL (`gs://bucket/run`; data_pipelines/paths.py).
"""

from __future__ import annotations

import json
from typing import Any, Dict, NamedTuple, Optional, Tuple

from data_pipelines import paths

CONFIG_JSON = "config.json"
KINDS = ("pretrain", "finetune")


def read_json_config(path) -> Optional[Dict[str, Any]]:
    """`path/config.json` as a dict, None if there is none; invalid JSON is an error naming the file."""
    p = paths.as_path(path) / CONFIG_JSON
    if not p.exists():
        return None
    try:
        return json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        from xlgen.config import ConfigError

        raise ConfigError(f"{p}: invalid JSON ({e})") from None


def hf_config(path) -> Optional[Dict[str, Any]]:
    """The Hugging Face `config.json` of `path` if it is a HF model directory (has `model_type`, no `xlgen` block)."""
    d = read_json_config(path)
    return d if d is not None and "model_type" in d and "xlgen" not in d else None


class Restored(NamedTuple):
    state: Any  # {"params", "opt_state", "step", "rng"} with the program's shardings
    mems: Any  # recurrent memory or None
    meta: Dict[str, Any]
    step: int


class Workdir:
    """`Workdir(path)`: the files of one run (see the module docstring)."""

    def __init__(self, path: str):
        self.path = paths.display(path)  # absolute if local; a URL stays a URL

    def __repr__(self) -> str:
        return f"Workdir({self.path!r})"

    @classmethod
    def parse(cls, path: str) -> Tuple["Workdir", Optional[int], Optional[str]]:
        """`DIR` -> (Workdir(DIR), None, None); `DIR/checkpoints/<step>` or `DIR/best/<step>` -> (.., step, sub)."""
        p = paths.as_path(path)
        if p.name.isdigit() and p.parent.name in ("checkpoints", "best"):
            return cls(str(p.parent.parent)), int(p.name), p.parent.name
        return cls(str(p)), None, None

    # -- files -----------------------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        return paths.join(self.path, *parts)

    def exists(self, *parts: str) -> bool:
        return paths.as_path(self.join(*parts) if parts else self.path).exists()

    @property
    def config_path(self) -> str:
        return self.join(CONFIG_JSON)

    @property
    def metrics_path(self) -> str:
        return self.join("metrics.jsonl")

    def makedirs(self) -> None:
        paths.makedirs(self.path)

    # -- config.json -----------------------------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        """The `xlgen` block of config.json ({} for a directory without an xlgen config.json)."""
        try:
            d = read_json_config(self.path)
        except (OSError, ValueError):
            return {}
        return dict(d.get("xlgen") or {}) if isinstance(d, dict) else {}

    @property
    def kind(self) -> Optional[str]:
        """ "pretrain" | "finetune" | None (no xlgen config.json)."""
        return self.info().get("kind")

    def require_kind(self, kind: str) -> None:
        """A workdir that holds a run of another kind (or a config.json that is not an xlgen run's) is an error,
        raised before anything in it changes."""
        d = read_json_config(self.path)
        if d is None:
            return
        block = d.get("xlgen") if isinstance(d, dict) else None
        have = block.get("kind", "pretrain") if isinstance(block, dict) else None  # no kind: an early pretrain run
        if have != kind:
            what = f"a {have} run" if have else "a config.json that is not an xlgen run's"
            raise ValueError(f"{self.path} holds {what}; `{kind}` will not write into it (use another --workdir)")

    def read_config(self):
        """config.json as a ConfigDict (None if absent)."""
        from xlgen import config as config_lib

        return config_lib.read_workdir_config(self.path)

    def write_config(self, config, kind: str) -> str:
        """Write config.json (temp file + rename) tagged {"version", "kind"}; keeps the rest of the `xlgen` block
        (the tokenizer record of `xlgen.train.tokenizer_store`)."""
        from xlgen import config as config_lib

        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
        kept = {k: v for k, v in self.info().items() if k not in ("version", "kind")}  # the tokenizer record
        return config_lib.write_resolved_config(config, self.path, kind, kept)

    # -- tokenizer -------------------------------------------------------------------------------------------
    def tokenizer(self):
        """The run's tokenizer (a data_pipelines.vocab object with encode/decode), or None if none is stored."""
        from xlgen.train import tokenizer_store

        return tokenizer_store.load(self.path)

    # -- checkpoints -----------------------------------------------------------------------------------------
    def checkpoint_dir(self, sub: str = "checkpoints") -> str:
        return self.join(sub)

    def has_checkpoints(self, sub: str = "checkpoints") -> bool:
        return paths.as_path(self.checkpoint_dir(sub)).is_dir()

    def latest_step(self, sub: str = "checkpoints") -> Optional[int]:
        """The newest committed checkpoint step of `DIR/<sub>`, None if there is none."""
        if not self.has_checkpoints(sub):
            return None
        ckpt = self.checkpointer(sub)
        try:
            return ckpt.latest_step()
        finally:
            ckpt.close()

    def checkpointer(self, sub: str = "checkpoints", *, keep: int = 0, async_save: bool = False, **options):
        """The Orbax-backed `Checkpointer` of `DIR/<sub>` (options: see `xlgen.train.checkpointing.Checkpointer`)."""
        from xlgen.train.checkpointing import Checkpointer

        return Checkpointer(self.checkpoint_dir(sub), keep=keep, async_save=async_save, **options)

    def restore(
        self,
        program,
        *,
        step: Optional[int] = None,
        sub: str = "checkpoints",
        mems: bool = False,
        checkpointer=None,
        quarantine: bool = False,
    ) -> Optional[Restored]:
        """Restore `step` (None: the newest that reads and verifies) of `DIR/<sub>` onto `program`'s shardings (call
        inside `jax.set_mesh(program.mesh)`); `mems`: also the recurrent memory when the checkpoint has it.
        `quarantine`: move failed checkpoints aside (only the workdir's writer, under its lock; readers change
        nothing). None when there is no checkpoint (and no `step` was asked for)."""
        own = checkpointer is None
        ckpt = self.checkpointer(sub) if own else checkpointer
        try:
            abstract_mems = program.abstract_mems() if mems and program.mems_shape is not None else None
            if step is None:
                out = ckpt.restore_latest(program.abstract_state(), abstract_mems, quarantine=quarantine)
                return None if out is None else Restored(*out)
            if step not in ckpt.all_steps():
                raise FileNotFoundError(f"{ckpt.directory}: no checkpoint of step {step} (has {ckpt.all_steps()})")
            state, m, meta = ckpt.restore(step, program.abstract_state(), abstract_mems)
            return Restored(state, m, meta, step)
        finally:
            if own:
                ckpt.close()

    def open(self, *, step: Optional[int] = None, sub: Optional[str] = None, mesh_config=None):
        """Config, program and restored state of this run: (config, program, Restored). `sub` None: `best/` when
        the run has one, else `checkpoints/`. `mesh_config` (a dict) overrides config.mesh (e.g. one device).
        Raises FileNotFoundError when there is no config.json or no checkpoint."""
        import jax

        from xlgen import sharding
        from xlgen.train.program import build_program

        config = self.read_config()
        if config is None:
            raise FileNotFoundError(f"{self.path}: no config.json (not an xlgen workdir)")
        if mesh_config:
            with config.mesh.unlocked():
                config.mesh.update(dict(mesh_config))
        if sub is None:
            sub = "best" if self.has_checkpoints("best") else "checkpoints"
        program = build_program(config, sharding.make_mesh(config.mesh))
        with jax.set_mesh(program.mesh):
            restored = self.restore(program, step=step, sub=sub)
        if restored is None:
            raise FileNotFoundError(f"{self.checkpoint_dir(sub)}: no checkpoint")
        return config, program, restored
