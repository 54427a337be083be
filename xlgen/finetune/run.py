"""`xlgen finetune`: its command line (`main`, `command`), finetuning (`finetune`) and re-evaluation (`evaluate`) of
a finetune workdir. The package docstring (`xlgen.finetune`) describes the run."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional

from data_pipelines import paths
from xlgen.finetune.config import is_finetune_workdir, load_finetune_config
from xlgen.finetune.data import _is_main, load_tokenizer, localize_data_dir, split_examples_and_features
from xlgen.finetune.evaluation import Predictor, run_evaluation
from xlgen.finetune.init_from import load_pretrained_into, pretrained_params
from xlgen.finetune.outputs import EVAL_RESULTS, write_artefacts, write_test_predictions
from xlgen.train.workdir import Workdir

DESCRIPTION = "train a pretrained XLNet / Funnel model on GLUE, SQuAD, RACE or long-text classification"


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen import config as config_lib

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen finetune: error: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="xlgen finetune", description=DESCRIPTION)
    p.add_argument(
        "--config",
        default=None,
        help="configs/finetune/<task>.py (omit with --eval_only to reuse the workdir's config.json)",
    )
    p.add_argument("--workdir", required=True)
    p.add_argument(
        "--eval_only",
        action="store_true",
        help="re-evaluate the workdir's best checkpoint (with the workdir's stored config.json when it has one)",
    )
    p.add_argument("--platform", default=None)
    p.add_argument("--distributed", default="auto", choices=("auto", "on", "off"))
    from xlgen.domains import reject_unknown_flags

    reject_unknown_flags(p, rest)
    args = p.parse_args(rest)
    if not args.config and not args.eval_only and not is_finetune_workdir(args.workdir):
        p.error("--config is required (unless --workdir is a finetuning run to resume or extend, or --eval_only)")
    return command(
        args.config,
        overrides,
        args.workdir,
        eval_only=args.eval_only,
        platform=args.platform,
        distributed=args.distributed,
    )


def command(
    config_path: Optional[str],
    overrides: Dict[str, str],
    workdir: str,
    *,
    eval_only: bool = False,
    platform: Optional[str] = None,
    distributed: str = "auto",
    prog: str = "xlgen finetune",
) -> int:
    """Finetune (or, `eval_only`, re-evaluate) the run in `workdir`; prints the results; the exit status.
    `xlgen eval` on a finetune workdir calls this with `eval_only=True`."""
    from xlgen import config as config_lib
    from xlgen.platforms import default_platform, setup_runtime
    from xlgen.train import outdir

    try:  # the workdir path first: empty, a file, under a file, too long, read-only (one line, nothing written)
        outdir.check_nonempty(workdir) if eval_only else outdir.check_dir_path(workdir, "--workdir")
    except outdir.OutputPathError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if eval_only and is_finetune_workdir(workdir):
        config_path = None  # the stored, resolved config is the truth for an existing run
    try:
        config = load_finetune_config(config_path, overrides, workdir)
    except (config_lib.ConfigError, ValueError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    setup_runtime(platform or default_platform(), distributed)
    from xlgen.train.guards import TrainingDiverged

    try:
        res = evaluate(config, workdir) if eval_only else finetune(config, workdir)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    if _is_main():
        print(
            f"\n{config.task} @ step {res.get('step')}: "
            + "  ".join(f"{k} {v:.4f}" for k, v in res.items() if k != "step" and isinstance(v, float))
        )
        print(f"  results      {paths.join(workdir, EVAL_RESULTS)}", flush=True)
        hint = one_class_hint(workdir, config)
        if hint:
            print(hint, flush=True)
    return 0


def one_class_hint(workdir: str, config) -> Optional[str]:
    """A note when every dev prediction (`dev_predictions.tsv`) is one class while the labels hold several: the
    model has learnt the class prior only, typical of a paper preset's learning rate (2e-5, for a large pretrained
    model) on a small or randomly initialised one."""
    path = paths.join(workdir, "dev_predictions.tsv")
    if not paths.as_path(path).exists():
        return None
    rows = [line.split("\t") for line in paths.read_text(path).splitlines()[1:] if line.count("\t") == 2]
    preds, labels = {r[1] for r in rows}, {r[2] for r in rows}
    if len(preds) != 1 or len(labels) < 2:
        return None
    return (
        f"note: every dev prediction is {next(iter(preds))!r} (the labels hold {len(labels)} classes): the model "
        f"learnt the class prior only. At learning rate {float(config.optimizer.learning_rate):g} a small or "
        "randomly initialised model may not move; try --config.optimizer.learning_rate=1e-3 and more steps "
        '(docs/finetuning.md, "Small runs")'
    )


def finetune(config, workdir: str, stop_at: Optional[int] = None) -> Dict[str, Any]:
    """Train (or resume) to config.total_steps (or save and stop at `stop_at`, the schedule unchanged) with dev
    evaluation; returns the best eval results.

    Finetuning supplies the pieces, the trainer's loop (`xlgen.train.loop.run`) runs them: the task objective
    (`build_program`), a pipeline of tokenized features, the initialisation from `init_from` (fresh runs only), and
    the dev evaluation with the best checkpoint (`best/`, by the task's primary metric) whose results and
    prediction files are written when it improves."""
    from xlgen.train import outdir

    t_begin = time.time()
    if not str(workdir).strip():
        raise outdir.OutputPathError("--workdir is empty: give the run directory")
    wd = Workdir(workdir)
    wd.require_kind("finetune")  # a pretraining workdir stays untouched
    check_finetune_workdir(config, wd)  # another task's or model's run stays untouched
    # a second live run on the workdir fails at once; a workdir this call found absent or empty is removed again
    # if it fails before the run started (nothing half-made)
    with outdir.writing_workdir(wd.path, enabled=_is_main()):
        return _finetune(config, wd, t_begin, stop_at)


def check_finetune_workdir(config, wd: Workdir) -> None:
    """A finetune workdir holding checkpoints of another task, or of a model with other shapes, is an error raised
    before anything in it changes (re-running the same task resumes or extends it)."""
    from data_pipelines import paths as paths_lib
    from xlgen.train import loop, outdir

    old = wd.read_config()
    if old is None:
        return
    if not paths_lib.is_remote(wd.path):
        has = outdir.committed_steps(wd.checkpoint_dir()) or outdir.committed_steps(wd.checkpoint_dir("best"))
        if not has:
            return
    if old.get("task") != config.get("task"):
        raise ValueError(
            f"{wd.path} holds a finetune run of task {old.get('task')!r}, not {config.get('task')!r}; "
            f"use another --workdir"
        )
    loop.check_workdir_compatible(config, wd.path)


def _finetune(config, wd: Workdir, t_begin: float, stop_at: Optional[int] = None) -> Dict[str, Any]:
    from xlgen import sharding
    from xlgen.finetune.readers.pipeline import FeaturePipeline
    from xlgen.finetune.tasks import get_task
    from xlgen.train import loop, tokenizer_store
    from xlgen.train.program import build_program

    workdir = wd.path  # absolute if local; a URL stays a URL
    task = get_task(config.task)
    is_main = _is_main()
    config, done_at, notes = loop.resume_config(config, wd)  # resume / extend as `xlgen train` does
    if done_at is not None:
        stop_at = done_at if stop_at is None else min(int(stop_at), done_at)
    if is_main:
        for note in notes:
            print(f"note: {note}", flush=True)
    stored = config  # config.json keeps a gs:// data_dir
    config = localize_data_dir(config)
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

    program = build_program(config, sharding.make_mesh(config.mesh))
    if is_main:  # the data read and the model built: the run's config is written
        from xlgen.train import metrics as metrics_lib

        metrics_lib.check_trackers(config)
        tokenizer_store.check_can_save(workdir, tokenizer)
        if done_at is None:  # a finished run keeps its config.json
            wd.write_config(stored, "finetune")
        tokenizer_store.save(workdir, tokenizer)  # DIR/tokenizer/, named in config.json: the workdir is enough
    bspec = program.objective.batch_shapes(config, "train")
    if "pack_ids" in bspec:  # finetune.packing: several examples per row
        from xlgen.finetune import packing
        from xlgen.finetune.objective import pack_size
        from xlgen.finetune.readers.features import cls_last

        packer = packing.Packer(
            train_feats,
            cls_last=cls_last(tokenizer),
            stride=packing.pack_stride(config),
            max_examples=pack_size(config),
            pad_id=int(tokenizer.pad_id),
            kind=task.kind,
        )
        pipe = packing.PackedFeaturePipeline(packer, global_batch_size=bspec["input_ids"][0][0], seed=int(config.seed))
        if is_main:
            print(f"packing: {pipe.examples_per_row():.2f} examples per row", flush=True)
    else:
        pipe = FeaturePipeline(
            train_feats, global_batch_size=bspec["input_ids"][0][0], seed=int(config.seed), keys=set(bspec)
        )

    initialize = None
    if config.init_from and wd.latest_step() is None:
        source = pretrained_params(config.init_from)  # read outside any jax.set_mesh context

        def initialize(state):
            state, report = load_pretrained_into(state, program, source, config.init_from)
            if is_main:
                print(
                    f"init_from {config.init_from}: {report['loaded']} tensors loaded; fresh: "
                    f"{report['fresh'] or 'none'}; unused: {_named_tensors(report['unused'])}",
                    flush=True,
                )
            return state

    predictor = Predictor(program)
    artefacts: Dict[str, Any] = {}

    def dev_eval(state, step):
        res, arts = run_evaluation(config, predictor, program.params_of(state), dev, step)
        artefacts.update(results=res, files=arts)
        return {k: v for k, v in res.items() if k != "step"}

    def on_new_best(step, state, metrics):
        if is_main:
            write_artefacts(workdir, artefacts["results"], artefacts["files"])
            if bool(config.eval.predict_test):
                write_test_predictions(config, predictor, program.params_of(state), tokenizer, workdir)

    best = loop.BestCheckpoint(wd, task.primary_metric, "max", on_new_best)
    evaluation = loop.Evaluation(
        dev_eval, split="dev", every=int(config.eval_every_steps), always_at_end=True, best=best
    )
    try:
        loop.run(
            config,
            wd,
            program,
            pipe,
            evaluation=evaluation,
            initialize=initialize,
            stop_at=stop_at,
            meta={"task": task.name},
            t_begin=t_begin,
        )
        return best.best()
    finally:
        best.close()


def _named_tensors(names, shown: int = 6) -> str:
    """`2 (lm_loss.bias, mask_emb)`: how many, and the first `shown` names."""
    names = sorted(names)
    if not names:
        return "none"
    more = f", ... {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} ({', '.join(names[:shown])}{more})"


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """Re-evaluate a finetune workdir: the best checkpoint (else the latest) on the dev split(s); rewrites
    eval_results.json and the prediction files; returns the results."""
    import jax

    from xlgen import sharding
    from xlgen.finetune.tasks import get_task
    from xlgen.train.program import build_program

    wd = Workdir(workdir)
    workdir = wd.path
    task = get_task(config.task)
    config = localize_data_dir(config)
    tokenizer = load_tokenizer(config)
    dev = {s: split_examples_and_features(config, tokenizer, s, workdir) for s in task.eval_splits}
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    sub = "best" if wd.has_checkpoints("best") else "checkpoints"
    with jax.set_mesh(mesh):
        restored = wd.restore(program, sub=sub)
        if restored is None:
            raise FileNotFoundError(f"{wd.checkpoint_dir(sub)}: no checkpoint to evaluate")
        state, _, _, step = restored
        predictor = Predictor(program)
        res, arts = run_evaluation(config, predictor, program.params_of(state), dev, step)
        if _is_main():
            write_artefacts(workdir, res, arts)
            if bool(config.eval.predict_test):
                write_test_predictions(config, predictor, program.params_of(state), tokenizer, workdir)
    return res
