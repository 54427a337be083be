"""The `xlgen` command.

    xlgen train    --config=PATH [--config.KEY=VALUE ...] --workdir=DIR   pretrain; re-run to resume
    xlgen eval     --config=PATH [--config.KEY=VALUE ...] --workdir=DIR   evaluate the latest checkpoint
    xlgen prepare  ...    tokenizers and corpora        (data_pipelines.prepare:main)
    xlgen finetune ...    GLUE / SQuAD / RACE / ...     (xlgen.finetune:main)
    xlgen plan     ...    AOT-compile for a TPU topology (xlgen.plan:main)
    xlgen bench    ...    speed vs HF PyTorch, MFU, compile time (xlgen.bench:main)
    xlgen export   --workdir=DIR --to-hf=OUT   a Hugging Face directory (xlgen.export:main)
    xlgen generate (--workdir=DIR | --model=HF_DIR) --prompt=TEXT   sample text (xlgen.generate:main)
    xlgen analyze  rank|spectrum ... --workdir=DIR   log-prob rank, output-embedding spectrum (xlgen.analyze:main)

Common options of train/eval:
    --platform=cpu|tpu|gpu   JAX platform. Default: the JAX_PLATFORMS environment variable if set, else `tpu`/`gpu`
                             when such a device node exists (/dev/accel*, /dev/vfio/*, /dev/nvidia0), else `cpu`.
    XLGEN_COMPILATION_CACHE=DIR  persistent XLA compilation cache (default ~/.cache/xlgen/jax_cache; "off")
    --distributed=auto|on|off  call jax.distributed.initialize(). `auto`: when launched by
                             launch/local_multiprocess.sh (XLGEN_COORDINATOR/XLGEN_NUM_PROCESSES/XLGEN_PROCESS_ID), or
                             on a multi-host TPU slice / SLURM job (JAX reads the cluster environment).
Subcommands import their modules lazily so `xlgen --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from xlgen.runtime import default_platform as _default_platform
from xlgen.runtime import setup_runtime

DELEGATED = {
    "prepare": "data_pipelines.prepare:main",
    "finetune": "xlgen.finetune:main",
    "plan": "xlgen.plan:main",
    "bench": "xlgen.bench:main",
    "export": "xlgen.export:main",
    "generate": "xlgen.generate:main",
    "analyze": "xlgen.analyze:main",
}
USAGE = __doc__


def _train_eval_parser(cmd: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"xlgen {cmd}", description=f"xlgen {cmd} (config overrides: --config.KEY=VALUE)")
    p.add_argument(
        "--config",
        required=cmd == "train",
        help="config file with get_config(), e.g. configs/pretrain/txl_tiny.py"
        + (" (default: the workdir's config.json)" if cmd == "eval" else ""),
    )
    p.add_argument("--workdir", required=True, help="run directory (checkpoints/, metrics.jsonl, tensorboard/)")
    p.add_argument("--platform", default=None, help="cpu | tpu | gpu (default: autodetect, else cpu)")
    p.add_argument("--distributed", default="auto", choices=("auto", "on", "off"))
    if cmd == "train":
        p.add_argument(
            "--stop_at_step",
            type=int,
            default=None,
            help="save and stop at this step (the schedule still runs to total_steps; re-run to continue)",
        )
    return p


def _train_or_eval(cmd: str, argv: List[str]) -> int:
    from xlgen import config as config_lib

    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    args = _train_eval_parser(cmd).parse_args(rest)
    sweep = None  # `xlgen eval --config.eval.mem_len=64,128,256`: one evaluation per memory length (eval_sweep.py)
    if cmd == "eval" and "," in str(overrides.get("eval.mem_len", "")):
        from xlgen.train import eval_sweep

        try:
            sweep = eval_sweep.parse_mem_lens(overrides.pop("eval.mem_len"))
        except ValueError as e:
            print(f"xlgen eval: error: {e}", file=sys.stderr)
            return 2
    if cmd == "eval":
        from xlgen.finetune import cli as finetune_cli
        from xlgen.finetune import is_finetune_workdir

        if is_finetune_workdir(args.workdir):  # a finetune workdir: re-evaluate its best checkpoint
            return finetune_cli.run(
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
        else:  # eval: the workdir's resolved config.json
            config = config_lib.read_workdir_config(args.workdir)
            if config is None:
                raise config_lib.ConfigError(f"{args.workdir}: no config.json (not an xlgen workdir); pass --config")
            for k, v in overrides.items():
                config_lib.apply_override(config, k, v)
    except config_lib.ConfigError as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    setup_runtime(args.platform or _default_platform(), args.distributed)
    import jax

    from xlgen.train import loop

    try:
        if cmd == "train":
            summary = loop.train(config, args.workdir, stop_at=args.stop_at_step)
        elif sweep:
            out = eval_sweep.run(config, args.workdir, sweep)
            if jax.process_index() == 0:
                for r in out["results"]:
                    print("eval: " + "  ".join(f"{k} {v}" for k, v in r.items()), flush=True)
                print(f"sweep: {out['json']} and {out['json'][:-5]}.png", flush=True)
            return 0
        else:
            rec = loop.evaluate(config, args.workdir)
            if jax.process_index() == 0:
                print("eval: " + "  ".join(f"{k} {v}" for k, v in rec.items()), flush=True)
            return 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"xlgen {cmd}: error: {e}", file=sys.stderr)
        return 2
    if jax.process_index() == 0:
        wd = summary["workdir"]
        cfg_args = " ".join(
            [f"--config={args.config}"] + [f"--config.{k}={v}" for k, v in overrides.items() if k != "total_steps"]
        )
        print(
            f"\ndone: step {summary['step']}."
            + (
                "  last eval: " + "  ".join(f"{k} {v:.4f}" for k, v in summary["eval"].items() if isinstance(v, float))
                if "eval" in summary
                else ""
            )
        )
        print(f"  checkpoints  {wd}/checkpoints/   (Orbax; latest = step {summary['step']})")
        print(f"  metrics      {wd}/metrics.jsonl   tensorboard: tensorboard --logdir {wd}/tensorboard")
        print(f"  config       {wd}/config.json")
        print(f"  resume/extend: xlgen train {cfg_args} --config.total_steps=N --workdir={wd}")
        print(f"  evaluate:      xlgen eval {cfg_args} --workdir={wd}")
        print(f"  Python:        xlgen.from_pretrained('{wd}')", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("train", "eval"):
        return _train_or_eval(cmd, rest)
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


if __name__ == "__main__":
    sys.exit(main())
