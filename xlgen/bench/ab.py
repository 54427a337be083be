"""Paired A/B of the train step's speed: each arm (a source tree, optionally with a setup hook) runs `xlgen train`'s
program and loop (`xlgen.bench.xlgen_side.Train`) in a process of its own, the arms alternated A B, B A, A B ... for
`--rounds` rounds, so every arm sees the same machine load on average. A process's figure is the median of its
measured blocks (loop `tokens_per_sec`; the compile block excluded); the result is each arm's median over rounds
and the paired ratios arm / first arm per round (median, min, max). On a shared machine the ratios are the
comparable quantity, not the absolute figures.

    python -m xlgen.bench.ab --arm=before:/path/to/old/tree --arm=after:. [--rounds=3 --steps=4 --blocks=2] \\
        [--json=FILE] -- --config=configs/pretrain/funnel_tiny.py --config.model.d_model=256 ...
    --arm=NAME:TREE:MODULE:FUNC     call MODULE.FUNC() in the child before the program is built (e.g. a variant
                                    of a layer, for measuring alternatives of one code path in one tree)
    --same-process                  arms of this tree only (variants by setup hooks): one process compiles a
                                    program per arm and alternates single steps on the same batches, `--rounds`
                                    steps per arm; ratios are of step times paired within a round (tighter pairs on
                                    a busy machine, at the cost of sharing one process's heap and thread pool)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional

_TAG = "AB_RESULT "
# The child loads this file by path, so an arm's tree need not contain it.
_LOADER = (
    "import importlib.util, sys; s = importlib.util.spec_from_file_location('xlgen_ab', sys.argv[1]); "
    "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); sys.exit(m.child(sys.argv[2:]))"
)


def child(argv: List[str]) -> int:
    """One arm in this process: [setup, steps, blocks, config args...] -> a tagged JSON line on stdout."""
    import importlib

    setup, steps, blocks, *config_argv = argv
    from xlgen import config as config_lib
    from xlgen.bench import measure
    from xlgen.bench.xlgen_side import Train

    overrides, rest = config_lib.parse_overrides(config_argv)
    path = next(a.split("=", 1)[1] for a in rest if a.startswith("--config="))
    config = config_lib.load_config(path, overrides)
    if setup:
        module, func = setup.rsplit(":", 1)
        getattr(importlib.import_module(module), func)()
    side = Train(config, steps=int(steps), rounds=int(blocks))
    start = side.start()
    warm = side.warmup()
    tps = [side.block()["tokens_per_sec"] for _ in range(int(blocks))]
    end = side.finish()
    rec = {
        "tokens_per_sec": statistics.median(tps),
        "blocks": tps,
        "first_block_s": warm["first_block_s"],
        "matmul_peak": [start["matmul_peak_flops_per_sec_start"], end["matmul_peak_flops_per_sec_end"]],
        "model_flops_per_step": start["model_flops_per_step"],
        "tokens_per_step": start["tokens_per_step"],
        **measure.process_record(),
    }
    print(_TAG + json.dumps(rec), flush=True)
    return 0


def same_process(arms: List[Dict[str, str]], rounds: int, config_argv: List[str]) -> Dict[str, Any]:
    """Every arm's train step compiled in this process (its setup hook active while the step is traced, the
    modules' previous attributes restored after), then single steps alternated arm by arm (order reversed every
    other round) on two fixed batches. -> {arm: {"step_s": [...], "first_step_s": compile + first step,
    "tokens_per_step"}}."""
    import importlib
    import time

    import jax

    from xlgen import config as config_lib
    from xlgen import sharding
    from xlgen.train import loop
    from xlgen.train import program as program_lib

    overrides, rest = config_lib.parse_overrides(config_argv)
    path = next(a.split("=", 1)[1] for a in rest if a.startswith("--config="))
    runs: Dict[str, list] = {}
    for arm in arms:
        config = config_lib.load_config(path, overrides)
        saved = {n: dict(vars(m)) for n, m in list(sys.modules.items()) if n.startswith("xlgen") and m is not None}
        if arm["setup"]:
            module, func = arm["setup"].rsplit(":", 1)
            getattr(importlib.import_module(module), func)()
        program = program_lib._build_program(config, sharding.make_mesh(config.mesh))
        spec = program.objective.batch_shapes(config, "train")
        pipeline = loop.make_pipeline(config, "train")
        batches = [loop.global_batch(pipeline.batch(s), program.batch_shardings, spec) for s in range(2)]
        state, mems = program.init_state()
        t = time.perf_counter()
        state, mems, _ = program.train_step(state, batches[0], mems)  # traced (with the hook) and compiled here
        jax.block_until_ready(state)
        first = time.perf_counter() - t
        for n, d in saved.items():  # undo the hook for the next arm's trace
            vars(sys.modules[n]).update(d)
        runs[arm["name"]] = [program, state, mems, batches, [], first]
        print(f"[ab] {arm['name']}: compile and first step {first:.1f} s", flush=True)
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            program, state, mems, batches, times, _ = runs[name]
            t = time.perf_counter()
            state, mems, _ = program.train_step(state, batches[r % 2], mems)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t)
            runs[name][1:3] = [state, mems]
    return {
        name: {"step_s": run[4], "first_step_s": run[5], "tokens_per_step": run[0].tokens_per_step}
        for name, run in runs.items()
    }


def _arm(spec: str) -> Dict[str, str]:
    parts = spec.split(":")
    if len(parts) not in (2, 4) or not parts[0] or not os.path.isdir(parts[1]):
        raise SystemExit(f"xlgen.bench.ab: error: --arm={spec!r}: expected NAME:TREE or NAME:TREE:MODULE:FUNC")
    return {"name": parts[0], "tree": os.path.abspath(parts[1]), "setup": ":".join(parts[2:])}


def run_arm(arm: Dict[str, str], steps: int, blocks: int, config_argv: List[str]) -> Optional[Dict[str, Any]]:
    from xlgen import platforms

    env = dict(platforms.host_malloc_environment() or os.environ)
    env["PYTHONPATH"] = arm["tree"]
    cmd = [sys.executable, "-c", _LOADER, os.path.abspath(__file__), arm["setup"], str(steps), str(blocks)]
    out = subprocess.run(cmd + config_argv, env=env, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith(_TAG):
            return json.loads(line[len(_TAG) :])
    print(f"[ab] {arm['name']} failed (exit {out.returncode}):\n{out.stderr[-3000:]}", file=sys.stderr)
    return None


def summarize(names: List[str], rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """Per arm: median / min / max tokens/s over rounds, and the paired ratio to the first arm per round (a ratio
    > 1 = faster than the first arm)."""
    out = {}
    for name in names:
        vals = [r[name]["tokens_per_sec"] for r in rounds if r.get(name)]
        ratios = [
            r[name]["tokens_per_sec"] / r[names[0]]["tokens_per_sec"] for r in rounds if r.get(name) and r.get(names[0])
        ]
        out[name] = {
            "tokens_per_sec": statistics.median(vals) if vals else None,
            "range": [min(vals), max(vals)] if vals else None,
            "speed_ratio_to_" + names[0]: statistics.median(ratios) if ratios else None,
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "ratios": ratios,
        }
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, config_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m xlgen.bench.ab", description=__doc__)
    p.add_argument("--arm", action="append", required=True, help="NAME:TREE[:MODULE:FUNC], two or more")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="train steps per block (the first of each not counted)")
    p.add_argument("--blocks", type=int, default=2, help="measured blocks per process (after the compile block)")
    p.add_argument("--same-process", "--same_process", dest="same_process", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(own)
    arms = [_arm(a) for a in args.arm]
    names = [a["name"] for a in arms]
    if args.same_process:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if any(a["tree"] != here for a in arms):
            raise SystemExit(f"xlgen.bench.ab: error: --same-process measures this tree ({here}) only")
        res = same_process(arms, args.rounds, config_argv)
        rounds = [
            {n: {"tokens_per_sec": res[n]["tokens_per_step"] / res[n]["step_s"][r]} for n in names}
            for r in range(args.rounds)
        ]
        summary = summarize(names, rounds)
        for n in names:
            s = summary[n]
            print(
                f"[ab] {n}: median step {statistics.median(res[n]['step_s']):.3f} s; speed / {names[0]}: "
                f"{s['speed_ratio_to_' + names[0]]:.3f} (range {s['ratio_range'][0]:.3f}-{s['ratio_range'][1]:.3f})"
            )
        if args.json:
            from data_pipelines import paths

            out = {"arms": arms, "config": config_argv, "same_process": res, "summary": summary}
            paths.atomic_write_text(args.json, json.dumps(out, indent=1))
        return 0
    rounds: List[Dict[str, Dict[str, Any]]] = []
    for r in range(args.rounds):
        rec = {}
        for arm in arms if r % 2 == 0 else arms[::-1]:
            rec[arm["name"]] = run_arm(arm, args.steps, args.blocks, config_argv)
            got = rec[arm["name"]]
            if got:
                print(
                    f"[ab] round {r + 1} {arm['name']}: {got['tokens_per_sec']:.1f} tok/s (blocks {got['blocks']}, "
                    f"load {got['load'][0]}, peak {max(got['matmul_peak']) / 1e9:.0f} GFLOP/s)",
                    flush=True,
                )
        rounds.append(rec)
    summary = summarize(names, rounds)
    for name, s in summary.items():
        ratio = s["speed_ratio_to_" + names[0]]
        print(
            f"[ab] {name}: median {s['tokens_per_sec']:.1f} tok/s (range {s['range'][0]:.1f}-{s['range'][1]:.1f}); "
            f"speed / {names[0]}: {ratio:.3f} (range {s['ratio_range'][0]:.3f}-{s['ratio_range'][1]:.3f})"
            if ratio
            else f"[ab] {name}: no result"
        )
    if args.json:
        from data_pipelines import paths

        paths.atomic_write_text(
            args.json, json.dumps({"arms": arms, "config": config_argv, "rounds": rounds, "summary": summary}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
