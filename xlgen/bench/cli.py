"""`xlgen bench`: measured speed through the user paths, optionally against Hugging Face PyTorch, each side in a
process of its own.

    xlgen bench --config=PATH [--config.KEY=VALUE ...] [--steps=N] [--blocks=K] [--compare-hf] [--json=FILE]
    xlgen bench --config=PATH --eval --mem_lens=128,256,512 [--segment=64] [--compare-hf]    (Transformer-XL)
    xlgen bench --config=PATH --generate [--new_tokens=128 --gen_batch=1 --gen_mem_len=128] [--compare-hf]  (TXL sampling)
    xlgen bench --standard [--into=docs/performance.md] [--before=DIR]    the standard set (`make bench`)

Train (default): `xlgen train`'s program and loop (`xlgen.train.loop.run`, the real data pipeline) run in blocks
of `--steps` steps on a temporary workdir, each block resuming the previous one; the loop's `metrics.jsonl`
`tokens_per_sec` is the block's figure (a block's first step, which absorbs the restore, is not counted; HF's side
likewise). With `--compare-hf` the same work runs in transformers 4.34.1 (same dims, batch, the same batches from
the same pipeline, AdamW + clipping, train mode) in another process, its blocks alternating with xlgen's. The
warm-up (compilation and the first block, PyTorch's thread choice, then `--warmup` alternated rounds) is reported
and not counted; medians over `--blocks` measured blocks are the result. Compilation is taken from JAX's compile
events with the persistent compilation cache off. Model FLOP/s use the analytic count (`xlgen.models.cost`); MFU is
against the f32 matmul peak of JAX measured in xlgen's process at its start and end. `--steps=0` measures
compilation only (AOT `lower().compile()`, e.g. the 24-layer scanned XLNet-Large step). `--same-process` runs both
sides in this process (PyTorch runs slower there; labelled `hf_mode: same_process` in the JSON, never written into
docs).

Eval (`--eval`, families whose `HFBench` has a memory LM: Transformer-XL): a random-weight HF directory is loaded by
`xlgen.from_pretrained(dir, mem_len=M)` and by transformers, and both evaluate the same token stream in segments of
`--segment` tokens with memory M = l - segment for each total context l in `--mem_lens` (HF semantics: zero memory
of length M from the first segment, so shapes are fixed); ms/token and tokens/s, alternating blocks of
`--segments_per_block` segments each.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from data_pipelines import paths
from xlgen.bench import compare, measure, render, standard


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xlgen bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", help="config file with get_config()")
    p.add_argument(
        "--steps", type=int, default=6, help="train steps per block (0: compile only; the first not counted)"
    )
    p.add_argument("--blocks", type=int, default=3, help="alternated measured blocks per side (medians reported)")
    p.add_argument(
        "--warmup", type=int, default=1, help="alternated rounds after the first block, reported, not counted"
    )
    p.add_argument("--compare-hf", "--compare_hf", dest="compare_hf", action="store_true")
    p.add_argument(
        "--same-process",
        "--same_process",
        dest="same_process",
        action="store_true",
        help="--compare-hf with both sides in this process (labelled in the JSON; never written into docs)",
    )
    p.add_argument("--eval", action="store_true", help="cached evaluation (Transformer-XL) instead of training")
    p.add_argument("--mem_lens", default="128,256,512", help="total contexts l (memory = l - segment)")
    p.add_argument("--segment", type=int, default=64)
    p.add_argument("--segments_per_block", type=int, default=32, help="--eval: segments per measured block (each side)")
    p.add_argument("--generate", action="store_true", help="sampling speed (Transformer-XL, xlgen.generate)")
    p.add_argument("--new_tokens", type=int, default=128, help="--generate: tokens sampled per block")
    p.add_argument("--gen_batch", type=int, default=1, help="--generate: samples per batch")
    p.add_argument("--gen_mem_len", type=int, default=128, help="--generate: decoding memory length")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--platform", default=None)
    p.add_argument("--standard", action="store_true", help="run the standard set (make bench)")
    p.add_argument("--out_dir", default="bench_results", help="--standard: JSON results directory")
    p.add_argument("--into", default=None, help="--standard: regenerate the table in this markdown file")
    p.add_argument("--before", default=None, help="--standard: a results directory for the 'before' column")
    p.add_argument("--before_label", default=None, help="--standard: what the 'before' column is (e.g. a commit)")
    p.add_argument("--only", default=None, help="--standard: comma-separated workload keys")
    p.add_argument("--report", action="store_true", help="--standard: only re-render from --out_dir")
    return p


def _standard(args) -> int:
    if not args.report:
        only = args.only.split(",") if args.only else None
        return standard.run_standard(args.out_dir, args.into, args.before, only, args.before_label)
    after = render.load_dir(args.out_dir, standard.KEYS)
    prev = render.load_dir(args.before, standard.KEYS) if args.before else None
    print(render.render_table(after, prev))
    if args.into:
        render.write_into(args.into, after, prev, args.before_label or f"results in {args.before}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen import config as config_lib

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2
    args = _parser().parse_args(rest)
    if args.standard:
        return _standard(args)
    if not args.config:
        print("xlgen bench: error: --config is required (or --standard)", file=sys.stderr)
        return 2
    try:
        config = config_lib.load_config(args.config, overrides)
    except config_lib.ConfigError as e:
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2
    mode = compare.SAME_PROCESS if args.same_process else compare.OWN_PROCESS
    if args.same_process and args.compare_hf:
        print("[bench] --same-process: HF runs inside this process (labelled in the JSON; not for docs)", flush=True)
    run = {"config": args.config, "overrides": overrides, "platform": args.platform}
    common = dict(blocks=args.blocks, warmup_rounds=args.warmup, compare_hf=args.compare_hf, mode=mode)
    res: Dict[str, Any] = {"config": args.config, "overrides": overrides, "load_before": measure.load_average()}
    try:
        if args.generate:
            res["generate"] = compare.generate(
                config, run, mem_len=args.gen_mem_len, new_tokens=args.new_tokens, batch=args.gen_batch, **common
            )
        elif args.eval:
            lens = [int(x) for x in args.mem_lens.split(",") if x]
            res.update(
                compare.evaluate(
                    config,
                    run,
                    mem_lens=lens,
                    segment=args.segment,
                    segments_per_block=args.segments_per_block,
                    **common,
                )
            )
        else:
            res.update(compare.train(config, run, steps=args.steps, **common))
    except ValueError as e:  # hf.Unsupported, or a model with no HF equivalent (same-process mode)
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2
    except compare.SideFailed as e:
        if not e.bad_input:
            print(e.detail, file=sys.stderr)
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2 if e.bad_input else 1
    res["load_after"] = measure.load_average()
    print(
        json.dumps(
            {k: v for k, v in res.items() if not isinstance(v, (dict, list)) or k in ("load_before", "load_after")},
            indent=1,
            default=str,
        )
    )
    if args.json:
        paths.atomic_write_text(args.json, json.dumps(res, indent=1, default=str))
    return 0
