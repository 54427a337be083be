"""`xlgen finetune`: train a pretrained XLNet / Funnel model on GLUE, SQuAD, RACE or long-text classification.

The command line of `xlgen.finetune` (its package docstring describes the run)."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

from xlgen.finetune.config import is_finetune_workdir, load_finetune_config
from xlgen.finetune.data import _is_main
from xlgen.finetune.outputs import EVAL_RESULTS
from xlgen.finetune.run import evaluate, finetune


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen import config as config_lib

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen finetune: error: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="xlgen finetune", description=__doc__.split("\n\n")[0])
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
    args = p.parse_args(rest)
    if not args.config and not args.eval_only:
        p.error("--config is required (unless --eval_only)")
    return run(
        args.config,
        overrides,
        args.workdir,
        eval_only=args.eval_only,
        platform=args.platform,
        distributed=args.distributed,
    )


def run(
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
    from xlgen.runtime import default_platform, setup_runtime

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
        from data_pipelines import paths

        print(f"  results      {paths.join(workdir, EVAL_RESULTS)}", flush=True)
    return 0
