"""Finetuning and re-evaluation of a finetune workdir."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from xlgen.finetune.config import write_finetune_config
from xlgen.finetune.data import _is_main, load_tokenizer, localize_data_dir, split_examples_and_features
from xlgen.finetune.evaluation import Predictor, run_evaluation
from xlgen.finetune.init_from import load_pretrained_into, pretrained_params
from xlgen.finetune.outputs import _read_results, write_artefacts, write_test_predictions


def _better(task, new: Dict[str, float], old: Optional[Dict[str, float]]) -> bool:
    if old is None:
        return True
    return new[task.primary_metric] > old[task.primary_metric]


def finetune(config, workdir: str) -> Dict[str, Any]:
    """Train (or resume) to config.total_steps with dev evaluation; returns the best eval results."""
    import jax

    import xlgen.tasks.objective  # noqa: F401  (registers the "finetune" objective)
    from data_pipelines import paths
    from data_pipelines.tasks.pipeline import FeaturePipeline
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.tasks import get_task
    from xlgen.train import guards
    from xlgen.train import metrics as metrics_lib
    from xlgen.train.loop import global_batch
    from xlgen.train.program import build_program

    workdir = paths.display(workdir)  # absolute if local; a URL stays a URL
    task = get_task(config.task)
    is_main = _is_main()
    if is_main:
        write_finetune_config(config, workdir)
    config = localize_data_dir(config)  # after writing: config.json keeps the gs:// data_dir
    tokenizer = load_tokenizer(config)
    t0 = time.time()
    _, train_feats = split_examples_and_features(config, tokenizer, "train", workdir)
    dev = {s: split_examples_and_features(config, tokenizer, s, workdir) for s in task.eval_splits}
    if is_main:
        print(
            f"{task.name}: {len(train_feats['input_ids'])} train features, "
            + ", ".join(f"{len(v[1]['input_ids'])} {s}" for s, v in dev.items())
            + f" ({time.time() - t0:.1f}s)",
            flush=True,
        )

    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    total = int(config.total_steps)
    ckpt = Checkpointer(
        paths.join(workdir, "checkpoints"),
        keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save),
    )
    best_ckpt = Checkpointer(paths.join(workdir, "best"), keep=1, async_save=False)
    writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, tensorboard=bool(config.get("tensorboard", True)))
    best = _read_results(workdir)

    source = None
    if config.init_from and not ckpt.all_steps():
        source = pretrained_params(config.init_from)
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), None)
        if restored is not None:
            state, _, _, start = restored
            if is_main:
                metrics_lib.truncate_after(writer.path, start)
                print(f"resumed from {ckpt.directory}/{start}", flush=True)
        else:
            state, _ = program.init_state()
            start = 0
            if source is not None:
                state, report = load_pretrained_into(state, program, source, config.init_from)
                if is_main:
                    print(
                        f"init_from {config.init_from}: {report['loaded']} tensors loaded; fresh: "
                        f"{report['fresh'] or 'none'}; unused: {len(report['unused'])}",
                        flush=True,
                    )
            best = None
        bspec = program.objective.batch_shapes(config, "train")
        gb = bspec["input_ids"][0][0]
        r0, r1 = sharding.addressable_batch_rows(mesh, gb)
        keys = set(bspec)
        pipe = FeaturePipeline(train_feats, global_batch_size=gb, seed=int(config.seed), keys=keys)
        predictor = Predictor(program)
        eval_every = int(config.eval_every_steps)
        every = int(config.checkpoint.every_steps)
        log_every = max(int(config.log_every_steps), 1)
        progress = metrics_lib.Progress(total, start, enabled=is_main)
        tokens = program.tokens_per_step

        def do_eval(step):
            nonlocal best
            res, arts = run_evaluation(config, predictor, state["params"], dev, step)
            writer.write({"step": step, "split": "dev", **{k: v for k, v in res.items() if k != "step"}})
            progress.message(f"eval @ step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items() if k != "step"))
            if _better(task, res, best):
                best = res
                best_ckpt.save(step, state, None, {"step": step, "task": task.name, "results": res})
                best_ckpt.wait()
                if is_main:
                    write_artefacts(workdir, res, arts)
                    if bool(config.eval.predict_test):
                        write_test_predictions(config, predictor, state["params"], tokenizer, workdir)

        t_last, s_last = time.time(), start
        nonfinite = guards.NonFiniteGuard(int(config.get("max_nonfinite_steps", 10)))  # skipped updates (program)
        try:
            for s in range(start, total):
                local = pipe.batch(s)
                local = {k: v[r0:r1] for k, v in local.items()} if (r1 - r0) != gb else local
                batch = global_batch(local, program.batch_shardings, bspec)
                state, _, m = program.train_step(state, batch, None)
                nonfinite.add(m.pop("nonfinite"))
                step = s + 1
                if step % log_every == 0 or step == total:
                    nonfinite.check(step)
                    vals = {k: float(v) for k, v in jax.device_get(m).items()}
                    dt = max(time.time() - t_last, 1e-9)
                    rec = {"step": step, **vals, "tokens_per_sec": (step - s_last) * tokens / dt}
                    if nonfinite.total:
                        rec["nonfinite_steps"] = nonfinite.take_window()
                    writer.write(rec)
                    progress.update(step, rec)
                    t_last, s_last = time.time(), step
                else:
                    progress.update(step)
                if (every > 0 and step % every == 0) or step == total:
                    nonfinite.check(step)
                    writer.flush()  # records up to `step` are durable before its checkpoint (gs://: no append)
                    ckpt.save(step, state, None, {"step": step, "task": task.name})
                if eval_every > 0 and step % eval_every == 0 and step != total:
                    do_eval(step)
            if total > start or best is None:
                do_eval(max(total, start))
        finally:
            progress.close()
            ckpt.close()
            best_ckpt.close()
            writer.close()
    return best


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """Re-evaluate a finetune workdir: the best checkpoint (else the latest) on the dev split(s); rewrites
    eval_results.json and the prediction files; returns the results."""
    import jax

    import xlgen.tasks.objective  # noqa: F401
    from data_pipelines import paths
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.tasks import get_task
    from xlgen.train.program import build_program

    workdir = paths.display(workdir)
    task = get_task(config.task)
    config = localize_data_dir(config)
    tokenizer = load_tokenizer(config)
    dev = {s: split_examples_and_features(config, tokenizer, s, workdir) for s in task.eval_splits}
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    sub = "best" if paths.as_path(workdir).joinpath("best").is_dir() else "checkpoints"
    ckpt = Checkpointer(paths.join(workdir, sub), keep=0, async_save=False)
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), None)
        if restored is None:
            raise FileNotFoundError(f"{workdir}/{sub}: no checkpoint to evaluate")
        state, _, _, step = restored
        predictor = Predictor(program)
        res, arts = run_evaluation(config, predictor, state["params"], dev, step)
        if _is_main():
            write_artefacts(workdir, res, arts)
            if bool(config.eval.predict_test):
                write_test_predictions(config, predictor, state["params"], tokenizer, workdir)
    ckpt.close()
    return res
