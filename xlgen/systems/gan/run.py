"""Training and evaluating the adversarial systems through the one loop (`xlgen.train.loop.run`).

train(config, workdir)     the game program (xlgen.train.game) on the system's pipeline; checkpoints, exact
                           resume, metrics.jsonl, SIGTERM handling and summary.json are the loop's
evaluate(config, workdir)  the latest checkpoint -> DIR/eval_results.json (+ figures in DIR/eval/)
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import jax

from xlgen import sharding
from xlgen.systems.gan import system
from xlgen.train import guards
from xlgen.train.game import build_game_program
from xlgen.train.workdir import Workdir

_PROGRAMS: Dict[Any, Any] = {}


def program_for(config, mesh=None):
    """(dataset, program, evaluate_fn) for `config` (programs memoised per config and mesh)."""
    import json

    mesh = mesh if mesh is not None else sharding.make_mesh(config.mesh)
    key = (json.dumps(config.to_dict(), sort_keys=True, default=str), tuple(d.id for d in mesh.devices.flat))
    if key not in _PROGRAMS:
        ds, game, ev = system.build(config)
        _PROGRAMS[key] = (ds, build_game_program(config, mesh, game, str(config.model.family)), ev)
    return _PROGRAMS[key]


def train(config, workdir: str, *, stop_at: Optional[int] = None) -> Dict[str, Any]:
    from xlgen.train import loop

    t_begin = time.time()
    wd = Workdir(workdir)
    with guards.WorkdirLock(wd.path, enabled=jax.process_index() == 0):
        if jax.process_index() == 0:
            wd.write_config(config, "pretrain")
        ds, program, ev = program_for(config)
        if jax.process_index() == 0:
            system.record_labeled(wd.path, ds)
        pipeline = system.Pipeline(config, ds, program.game)

        def evaluation_fn(state, step):
            return ev(config, program, state, ds, wd.join("eval"), full=False)

        evaluation = loop.Evaluation(evaluation_fn, split=str(config.eval.split), every=int(config.eval_every_steps))
        return loop.run(config, wd, program, pipeline, evaluation=evaluation, stop_at=stop_at, t_begin=t_begin)


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """The latest checkpoint's full evaluation; writes DIR/eval_results.json and DIR/eval/*.png."""
    from xlgen.train import metrics as metrics_lib

    wd = Workdir(workdir)
    if not wd.has_checkpoints():
        raise FileNotFoundError(f"{wd.path}: no checkpoints/ directory (train first: xlgen train ... --workdir=...)")
    ds, program, ev = program_for(config)
    with jax.set_mesh(program.mesh):
        restored = wd.restore(program)
        if restored is None:
            raise FileNotFoundError(f"{wd.checkpoint_dir()}: no checkpoint to evaluate")
        state, step = restored.state, restored.step
        os.makedirs(wd.join("eval"), exist_ok=True) if not wd.path.startswith("gs://") else None
        res = ev(config, program, state, ds, wd.join("eval"), full=True)
    rec = {"step": int(step), "split": str(config.eval.split), **res}
    if jax.process_index() == 0:
        system.results_json(wd.path, rec)
        writer = metrics_lib.MetricsWriter(wd.path, tensorboard=False)
        writer.write(rec)
        writer.close()
    return rec
