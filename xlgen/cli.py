"""The `xlgen` command.

    xlgen train    --config=PATH [--config.KEY=VALUE ...] --workdir=DIR   pretrain; re-run to resume
    xlgen train    --workdir=DIR [--config.total_steps=N ...]            resume / extend with DIR/config.json
    xlgen eval     --workdir=DIR [--config=PATH] [--config.KEY=VALUE ...] evaluate the latest checkpoint
    xlgen plot     --workdir=DIR [--workdir=DIR2 ...] [--out=PNG]          training curves (xlgen.analyze.plot:main)
    xlgen config show --config=PATH [--config.KEY=VALUE ...]              every config key with its value
    xlgen --version
    xlgen prepare  ...    tokenizers and corpora        (data_pipelines.prepare:main)
    xlgen finetune ...    GLUE / SQuAD / RACE / ...     (xlgen.finetune.run:main)
    xlgen plan     ...    AOT-compile for a TPU topology (xlgen.plan:main)
    xlgen bench    ...    speed vs HF PyTorch, MFU, compile time (xlgen.bench:main)
    xlgen export   --workdir=DIR --to-hf=OUT   a Hugging Face directory (xlgen.interop.export:main)
    xlgen export   --workdir=DIR --to-onnx=OUT | --to-stablehlo=OUT   a deployed function (docs/deploy.md)
    xlgen convert  --from-tf=CKPT_PREFIX --family=xlnet|funnel|transformer_xl --config=CONFIG --out=DIR
                          an original TensorFlow checkpoint as a from_pretrained directory (xlgen.interop.convert:main)
    xlgen generate (--workdir=DIR | --model=HF_DIR) --prompt=TEXT   sample text (xlgen.generate:main)
    xlgen analyze  rank|spectrum|recl ... --workdir=DIR   log-prob rank, output-embedding spectrum, relative
                          effective context length (xlgen.analyze:main; `xlgen analyze --help`)
    xlgen analyze  textgen --generated=FILE --reference=FILE   BLEU / Self-BLEU / Inverse BLEU, FED, LCR

Common options of train/eval:
    --platform=cpu|tpu|gpu   JAX platform. Default: the JAX_PLATFORMS environment variable if set, else `tpu`/`gpu`
                             when such a device node exists (/dev/accel*, /dev/vfio/*, /dev/nvidia0), else `cpu`.
    XLGEN_COMPILATION_CACHE=DIR  persistent XLA compilation cache (default ~/.cache/xlgen/jax_cache; "off")
    XLGEN_HOST_MALLOC=default  keep glibc's malloc defaults (otherwise freed host memory is kept for reuse and the
                             heap uses transparent huge pages: xlgen/platforms.py, "Host memory")
    --distributed=auto|on|off  call jax.distributed.initialize(). `auto`: when launched by
                             launch/local_multiprocess.sh (XLGEN_COORDINATOR/XLGEN_NUM_PROCESSES/XLGEN_PROCESS_ID), or
                             on a multi-host TPU slice / SLURM job (JAX reads the cluster environment).
Subcommands import their modules lazily so `xlgen --help` is instant.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import shlex
import sys
from typing import List, Optional

from xlgen.platforms import default_platform as _default_platform
from xlgen.platforms import setup_runtime

DELEGATED = {
    "prepare": "data_pipelines.prepare:main",
    "finetune": "xlgen.finetune.run:main",
    "plan": "xlgen.plan:main",
    "bench": "xlgen.bench:main",
    "export": "xlgen.interop.export:main",
    "convert": "xlgen.interop.convert:main",
    "generate": "xlgen.generate:main",
    "plot": "xlgen.analyze.plot:main",
    "analyze": "xlgen.analyze:main",
}
USAGE = __doc__


def _train_eval_parser(cmd: str) -> argparse.ArgumentParser:
    from xlgen import domains

    p = argparse.ArgumentParser(
        prog=f"xlgen {cmd}",
        description=f"xlgen {cmd} (config overrides: --config.KEY=VALUE)",
        epilog="List every config key with its value: xlgen config show --config=PATH [--config.KEY=VALUE ...]",
    )
    p.add_argument(
        "--config",
        help="config file with get_config(), e.g. configs/pretrain/txl_tiny.py (default: the workdir's config.json"
        + ("; `xlgen train --workdir=DIR` resumes a run with its stored config)" if cmd == "train" else ")"),
    )
    p.add_argument("--workdir", required=True, help="run directory (checkpoints/, metrics.jsonl, tensorboard/)")
    p.add_argument("--platform", default=None, help="cpu | tpu | gpu (default: autodetect, else cpu)")
    p.add_argument("--distributed", default="auto", choices=("auto", "on", "off"))
    if cmd == "train":
        p.add_argument(
            "--stop_at_step",
            type=domains.flag(int, domains.Range(1, domains.INT32_MAX)),
            default=None,
            help="save and stop at this step (the schedule still runs to total_steps; re-run to continue)",
        )
        p.add_argument(
            "--restart",
            action="store_true",
            help="start again at step 0 when the workdir's checkpoints all failed or were set aside (its metric "
            "records are dropped)",
        )
        p.add_argument(
            "--max_restarts",
            type=int,
            default=None,
            help="supervise: run training as a child process and re-run it from its latest good checkpoint when it "
            "is killed, hangs or is preempted, at most N times (xlgen/train/supervisor.py)",
        )
        p.add_argument(
            "--restart_backoff",
            type=float,
            default=10.0,
            help="with --max_restarts: seconds before the first restart, doubling per restart (at most 300)",
        )
    return p


def _workdir_kind(workdir: str) -> Optional[str]:
    from xlgen.train.workdir import Workdir

    return Workdir(workdir).kind


def _train_or_eval(cmd: str, argv: List[str]) -> int:
    from xlgen import config as config_lib

    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    from xlgen.domains import reject_unknown_flags

    parser = _train_eval_parser(cmd)
    reject_unknown_flags(parser, rest)
    args = parser.parse_args(rest)
    from xlgen.train import outdir

    try:  # the workdir path first: empty, a file, under a file, too long, read-only (one line, nothing written)
        outdir.check_dir_path(args.workdir, "--workdir") if cmd == "train" else outdir.check_nonempty(args.workdir)
    except outdir.OutputPathError as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    sweep = None  # `xlgen eval --config.eval.mem_len=64,128,256`: one evaluation per memory length (eval_sweep.py)
    if cmd == "eval" and "," in str(overrides.get("eval.mem_len", "")):
        from xlgen.train import eval_sweep

        try:
            sweep = eval_sweep.parse_mem_lens(overrides.pop("eval.mem_len"))
        except ValueError as e:
            print(f"xlgen eval: error: {e}", file=sys.stderr)
            return 2
    if cmd == "eval":
        from xlgen.finetune import is_finetune_workdir
        from xlgen.finetune import run as finetune_run

        if is_finetune_workdir(args.workdir):  # a finetune workdir: re-evaluate its best checkpoint
            return finetune_run.command(
                args.config,
                overrides,
                args.workdir,
                eval_only=True,
                platform=args.platform,
                distributed=args.distributed,
                prog="xlgen eval",
            )
    try:
        if args.config:
            config = config_lib.load_config(args.config, overrides)
        else:  # the workdir's resolved config.json (eval; train: resume or extend the run as it was configured)
            config = config_lib.read_workdir_config(args.workdir)
            if config is None:
                raise config_lib.ConfigError(
                    f"{args.workdir}: no config.json (not an xlgen workdir); pass --config=PATH"
                    + (" to start a run" if cmd == "train" else "")
                )
            if cmd == "train" and _workdir_kind(args.workdir) == "finetune":
                raise config_lib.ConfigError(
                    f"{args.workdir} is a finetuning workdir: re-run its `xlgen finetune` command to resume it"
                )
            for k, v in overrides.items():
                config_lib.apply_override(config, k, v)
            config_lib.validate(config)
    except config_lib.ConfigError as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    if cmd == "train" and args.max_restarts is not None:
        if args.max_restarts < 0 or args.restart_backoff < 0:
            print("xlgen train: error: --max_restarts and --restart_backoff must be >= 0", file=sys.stderr)
            return 2
        from xlgen.train.supervisor import supervise

        return supervise(["train", *argv], args.max_restarts, args.restart_backoff)
    setup_runtime(args.platform or _default_platform(), args.distributed)
    import jax

    from xlgen.train import guards, loop
    from xlgen.train.checkpointing import CheckpointCorrupt

    try:
        if cmd == "train":
            summary = loop.train(config, args.workdir, stop_at=args.stop_at_step, restart=args.restart)
        elif sweep:
            out = eval_sweep.run(config, args.workdir, sweep)
            if jax.process_index() == 0:
                for r in out["results"]:
                    print(f"eval: mem_len {r.get('mem_len')}  {format_metrics(r)}", flush=True)
                print(f"sweep: {out['json']} and {out['json'][:-5]}.png", flush=True)
            return 0
        else:
            rec = loop.evaluate(config, args.workdir)
            if jax.process_index() == 0:
                print(f"eval: step {rec['step']}  {rec['split']}  {format_metrics(rec)}", flush=True)
            return 0
    except (ValueError, FileNotFoundError, KeyError, guards.WorkdirBusy, CheckpointCorrupt) as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        print(f"xlgen {cmd}: error: {no_space_message(e, args.workdir)}", file=sys.stderr)
        return 2
    except guards.TrainingDiverged as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        if cmd == "train":
            print(diverged_resume_command(e, config, args.config, overrides, args.workdir), file=sys.stderr)
        return 1
    except RuntimeError as e:  # a multi-process run whose peer died: status 3, one line (xlgen/train/watchdog.py)
        if cmd != "train" or jax.process_count() == 1:
            raise
        from xlgen.train.watchdog import exit_orphaned

        exit_orphaned(e, args.workdir, jax.process_index())
    if jax.process_index() == 0:
        print(end_block(summary, config), flush=True)
    return 0


def format_metrics(record) -> str:
    """`loss 1.9950  ppl 7.3522 ...`: the float metrics of a record, 4 decimals (5 significant digits when smaller);
    `step` and `split` are left out."""
    return "  ".join(
        f"{k} {v:.4f}" if abs(v) >= 1e-3 or v == 0 else f"{k} {v:.4g}"
        for k, v in record.items()
        if isinstance(v, float) and k not in ("step", "split")
    )


def user_command(name: str) -> str:
    """How to run the console script `name` (xlgen, tensorboard, python) pasted into a fresh shell in the current
    directory: the virtualenv's own executable (`.venv/bin/xlgen`; absolute if the venv lies outside the current
    directory), else `name` when it is on PATH, else None."""
    import shutil

    exe = os.path.join(sys.prefix, "bin", name)
    if sys.prefix != sys.base_prefix and os.path.exists(exe):  # a virtualenv: activation is not assumed
        return shown_path(exe)
    if name == "python":
        return sys.executable
    return name if shutil.which(name) else None


def shown_path(path: str) -> str:
    """`path` relative to the current directory when it lies inside it, else absolute (URLs unchanged)."""
    if "://" in str(path):
        return str(path)
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else os.path.abspath(path)


def end_block(summary, config) -> str:
    """The end-of-run text: where things are and commands that work pasted into a fresh shell in this directory."""
    config = summary.get("config", config)  # the config the run used (a finished run keeps its stored one)
    wd_abs = summary["workdir"]
    wd = shown_path(wd_abs)
    step, total = int(summary["step"]), int(config.total_steps)
    xlgen = user_command("xlgen") or f"{shlex.quote(sys.executable)} -m xlgen.cli"
    python = user_command("python")
    s = summary.get("summary") or {}
    last_eval = summary.get("eval") or s.get("last_eval")
    lines = [f"\ndone: step {step}." + (f"  last eval: {format_metrics(last_eval)}" if last_eval else "")]
    if s:
        from xlgen.train.report import unit

        what = unit(config)
        rate = f", {s['tokens_per_sec']:,.0f} {what}/s" if s.get("tokens_per_sec") else ""
        lines.append(
            f"  summary      {wd}/summary.json   ({s['parameters']:,} parameters, {s['tokens_seen']:,} {what} seen, "
            f"{s['wall_time_s']:.0f}s{rate})"
        )
    lines += [
        f"  checkpoints  {wd}/checkpoints/   (Orbax; latest = step {step})",
        f"  metrics      {wd}/metrics.jsonl",
        f"  config       {wd}/config.json",
        "Commands (run from this directory):",
    ]
    # Resume and extend read the workdir's own config.json (every override of the run is in it); extending
    # continues the learning-rate schedule from its current value (xlgen/train/optim.py continue_schedule).
    train = f"{xlgen} train --workdir={shlex.quote(wd)}"
    if step < total:
        lines.append(f"  resume:      {train}")
    else:
        from xlgen.train import report

        lines += report.extend_advice(config, step, train)
    lines.append(f"  evaluate:    {xlgen} eval --workdir={shlex.quote(wd)}")
    lines.append(f"  plot:        {xlgen} plot --workdir={shlex.quote(wd)}")
    if config.tensorboard:
        tb = user_command("tensorboard")
        if tb:
            lines.append(f"  tensorboard: {tb} --logdir {shlex.quote(wd + '/tensorboard')}")
        else:
            pip = f"{python} -m pip install -q -c constraints.txt -e '.[tensorboard]'"
            lines.append(
                f"  tensorboard: {pip} && {shown_path(os.path.join(sys.prefix, 'bin', 'tensorboard'))} "
                f"--logdir {shlex.quote(wd + '/tensorboard')}"
            )
    from xlgen import registry
    from xlgen.pretrained import Interop

    interop = registry.get(config.model.family).record(Interop)
    if interop is not None and interop.wrap is not None:  # systems with an HF-convention wrapper
        code = f"import xlgen; m = xlgen.from_pretrained({json.dumps(wd)}); print(type(m).__name__)"
        lines.append(f"  Python:      {python} -c {shlex.quote(code)}")
    return "\n".join(lines)


def no_space_message(e: OSError, workdir: str) -> str:
    """One line for a full disk: the path being written and the free space left there."""
    import shutil

    path = e.filename or workdir
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        free = f"{shutil.disk_usage(probe or '.').free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return f"no space left on the device writing {path} ({free}); free some space and re-run to resume"


def diverged_resume_command(e, config, config_path: str, overrides, workdir: str) -> str:
    """The command that continues a run stopped by the health guard: from its good checkpoint (the later ones
    were set aside) with the learning rate it was trained with when that was lower, else 10x lower; `--restart`
    when no checkpoint remains. A run started from the workdir alone (no --config) is continued the same way (its
    config.json), so the command runs as printed."""
    xlgen = user_command("xlgen") or f"{shlex.quote(sys.executable)} -m xlgen.cli"
    lr = float(config.optimizer.learning_rate)
    lr = e.good_lr if e.good_lr and e.good_lr < lr else lr / 10
    keep = {k: v for k, v in overrides.items() if k != "optimizer.learning_rate"}
    args = ([f"--config={config_path}"] if config_path else []) + [f"--config.{k}={v}" for k, v in keep.items()]
    args += [f"--config.optimizer.learning_rate={lr:g}", f"--workdir={shown_path(workdir)}"]
    if e.good_step is None:
        args.append("--restart")
        head = "Start again from step 0 with a lower learning rate:"
    else:
        head = f"Resume from checkpoint {e.good_step} with a lower learning rate:"
    return f"{head}\n  {xlgen} train {' '.join(shlex.quote(a) for a in args)}"


def config_show_text(config) -> str:
    """What `xlgen config show` prints for a resolved config: one `key = value!r` a line, keys sorted, less the
    sections the system does not read."""
    from xlgen.train import report

    return "".join(f"{key} = {value!r}\n" for key, value in report.shown_items(config).items())


def config_show(argv: List[str]) -> int:
    """`xlgen config show --config=PATH [--config.KEY=VALUE ...]`: the resolved config, one `key = value` a line."""
    from xlgen import config as config_lib

    usage = "usage: xlgen config show --config=PATH [--config.KEY=VALUE ...]"
    if argv and argv[0] in ("-h", "--help", "help"):
        print(f"{usage}\n\nPrints the resolved config, one `key = value` a line.")
        return 0
    if not argv or argv[0] != "show":
        print(usage, file=sys.stderr)
        return 2
    try:
        overrides, rest = config_lib.parse_overrides(argv[1:])
        p = argparse.ArgumentParser(prog="xlgen config show", description="print the resolved config")
        p.add_argument("--config", required=True, help="config file (or a workdir's config.json)")
        args = p.parse_args(rest)
        config = config_lib.load_config(args.config, overrides)
    except config_lib.ConfigError as e:
        print(f"xlgen config show: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(config_show_text(config))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("--version", "-V", "version"):
        from xlgen import __version__

        print(f"xlgen {__version__}")
        return 0
    if cmd in ("train", "eval"):
        return _train_or_eval(cmd, rest)
    if cmd == "config":
        return config_show(rest)
    if cmd in DELEGATED:
        module, fn = DELEGATED[cmd].split(":")
        try:
            target = getattr(importlib.import_module(module), fn)
        except ImportError as e:
            print(f"xlgen {cmd}: not available ({e})", file=sys.stderr)
            return 2
        return int(target(rest) or 0)
    print(f"xlgen: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


def console_main() -> int:
    """The `xlgen` executable (and `python -m xlgen.cli`): first re-executes itself with xlgen's host-malloc policy
    in the environment (`platforms.reexec_with_host_malloc`; XLGEN_HOST_MALLOC=default: off), then `main()`."""
    from xlgen import platforms

    platforms.reexec_with_host_malloc()
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
