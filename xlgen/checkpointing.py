"""Orbax checkpointing facade (the only module that imports orbax, so a move to Orbax's v1 API stays local).

A checkpoint `workdir/checkpoints/<step>/` holds Composite items:
  state  parameters, optimizer state, step, RNG key      (always)
  mems   recurrent memory [n_layer, batch, mem_len, d]   (unless `checkpoint.save_mems=False`)
  meta   JSON: step, memory shape, config fingerprint
The data position is the step itself: batches are pure functions of (seed, step).

Orbax writes a step into a temporary directory and renames it when complete, so a killed process never leaves a
checkpoint that `all_steps()` reports; `restore_latest` additionally falls back to the previous checkpoint, with a
warning, if the newest one cannot be read. Restoring takes an abstract target whose leaves carry the *current*
shardings, so a checkpoint written on one mesh restores onto another.

`directory` may be a URL (`gs://bucket/run/checkpoints`): Orbax (through etils.epath and TensorStore's own GCS
driver) reads and writes it directly; the finalize-by-rename above is Orbax's commit-success marker on GCS.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import jax
import orbax.checkpoint as ocp

from data_pipelines import paths

log = logging.getLogger("xlgen")


class Checkpointer:
    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.path = paths.as_path(directory)  # an epath: local (absolute) or gs://, never abspath'ed as a URL
        self.directory = str(self.path)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=int(keep) if keep and keep > 0 else None,
            enable_async_checkpointing=bool(async_save),
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.path, options=options)

    # -- queries ---------------------------------------------------------------------------------------------
    def all_steps(self):
        return sorted(self.manager.all_steps())

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    # -- save ------------------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, mems: Optional[jax.Array], meta: Dict[str, Any]) -> bool:
        """Start an (async) save of `step`; returns False if a checkpoint of that step already exists."""
        if step in self.manager.all_steps():
            return False
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if mems is not None:
            items["mems"] = ocp.args.StandardSave({"mems": mems})
        return self.manager.save(step, args=ocp.args.Composite(**items), force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    # -- restore ---------------------------------------------------------------------------------------------
    def read_meta(self, step: int) -> Dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def has_mems(self, step: int) -> bool:
        return (self.path / str(step) / "mems").is_dir()

    def restore(
        self, step: int, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct]
    ) -> Tuple[Any, Optional[jax.Array], Dict[str, Any]]:
        items = {"state": ocp.args.StandardRestore(abstract_state), "meta": ocp.args.JsonRestore()}
        want_mems = abstract_mems is not None and self.has_mems(step)
        if want_mems:
            items["mems"] = ocp.args.StandardRestore({"mems": abstract_mems})
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        mems = out["mems"]["mems"] if want_mems else None
        return out["state"], mems, out["meta"]

    def restore_latest(self, abstract_state: Any, abstract_mems: Optional[jax.ShapeDtypeStruct]):
        """Restore the newest readable checkpoint: (state, mems or None, meta, step) or None if there is none."""
        steps = self.all_steps()
        errors = []
        for step in reversed(steps):
            try:
                state, mems, meta = self.restore(step, abstract_state, abstract_mems)
            except Exception as e:  # unreadable (truncated files, wrong structure): try the previous one
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                log.warning(
                    "checkpoint %s/%d is unreadable (%s: %s); falling back to the previous checkpoint",
                    self.directory,
                    step,
                    type(e).__name__,
                    str(e)[:300],
                )
                continue
            return state, mems, meta, step
        if steps:
            raise RuntimeError(f"{self.directory}: no readable checkpoint among steps {steps}:\n" + "\n".join(errors))
        return None
