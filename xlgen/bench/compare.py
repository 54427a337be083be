"""Both sides of a benchmark, alternated A B A B ... in steady-state blocks.

Each side (`xlgen.bench.xlgen_side`, `xlgen.bench.hf`) runs in a process of its own (`xlgen.bench.worker`), as a
user runs either: xlgen with the `xlgen` command's host-malloc policy, Hugging Face with glibc's defaults (unless
the user set a malloc policy) and no JAX backend. Only one side works at a time: the other waits for its next call.
Per side: `start`, `warmup` (compilation, the first slow steps, PyTorch's thread choice: reported, not counted),
`warmup_rounds` alternated blocks more (reported, not counted), then `blocks` alternated measured blocks; every
block records its figure, the process id, the process's thread count, the load average and the matmul peak measured
right after it. Medians over the measured blocks are the result. `mode="same_process"` builds both sides inside
this process instead (PyTorch runs slower there; labelled in the JSON and never rendered into docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

from xlgen.bench import measure

OWN_PROCESS, SAME_PROCESS = "own_process", "same_process"


class SideFailed(RuntimeError):
    """A side's process failed: `message` (one line), `bad_input` (the config cannot be measured there), `detail`
    (the traceback)."""

    def __init__(self, message: str, *, bad_input: bool = False, detail: str = ""):
        super().__init__(message)
        self.bad_input, self.detail = bad_input, detail


def side_environment(side: str) -> Dict[str, str]:
    """The environment a side's process starts with: xlgen's with the `xlgen` command's host-malloc policy; HF's
    without it (glibc's defaults, as a user runs PyTorch; a user's own malloc settings are kept)."""
    from xlgen import platforms

    env = dict(os.environ)
    if side == "xlgen":
        return platforms.host_malloc_environment(env) or env
    ours = set(platforms.MALLOC_TUNABLES.split(":"))
    rest = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t not in ours]
    env.pop("GLIBC_TUNABLES", None)
    if rest:
        env["GLIBC_TUNABLES"] = ":".join(rest)
    return env


class ProcessSide:
    """A side in a child process (`python -m xlgen.bench.worker`), called by JSON lines."""

    def __init__(self, spec: Dict[str, Any]):
        self.name = spec["side"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "xlgen.bench.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=side_environment(self.name),
        )
        self.pid = self._send(spec)["pid"]

    def _send(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SideFailed(f"the {self.name} side (pid {self.proc.pid}) exited with status {self.proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise SideFailed(
                f"the {self.name} side (pid {self.proc.pid}): {reply['message']}",
                bad_input=reply["bad_input"],
                detail=reply["error"],
            )
        return reply["ok"]

    def call(self, method: str, **kwargs) -> Dict[str, Any]:
        return self._send({"method": method, **kwargs})

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class LocalSide:
    """A side built in this process (`same_process` mode)."""

    def __init__(self, spec: Dict[str, Any]):
        from xlgen.bench import worker

        self.name, self.pid, self._worker = spec["side"], os.getpid(), worker
        self.side = worker.make_side(spec)

    def call(self, method: str, **kwargs) -> Dict[str, Any]:
        return self._worker.invoke(self.side, method, kwargs)

    def close(self) -> None:
        pass


class Sides:
    """xlgen's side and (with `compare_hf`) HF's, for one benchmark kind, opened in `mode`; a context manager.
    `run`: the config file, overrides and platform; `options`: the sides' keyword arguments (`xlgen_options`: more
    for xlgen's side only)."""

    def __init__(
        self,
        kind: str,
        run: Dict[str, Any],
        options: Dict[str, Any],
        *,
        compare_hf: bool,
        mode: str,
        xlgen_options: Optional[Dict[str, Any]] = None,
    ):
        if mode not in (OWN_PROCESS, SAME_PROCESS):
            raise ValueError(f"mode {mode!r}: expected {OWN_PROCESS} or {SAME_PROCESS}")
        self.mode = mode
        self.specs = [{"side": "xlgen", "kind": kind, **run, "options": {**options, **(xlgen_options or {})}}]
        if compare_hf:
            self.specs.append({"side": "hf", "kind": kind, **run, "options": options})
        self.opened: List[Any] = []

    def __enter__(self) -> List[Any]:
        make = ProcessSide if self.mode == OWN_PROCESS else LocalSide
        try:
            for spec in self.specs:
                self.opened.append(make(spec))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.opened

    def __exit__(self, *exc) -> None:
        for side in self.opened:
            side.close()


def alternate(sides, *, warmup_rounds: int, blocks: int, report, **kwargs):
    """`warmup` on each side, then warmup_rounds + blocks rounds of one `block` per side in turn (A B A B ...).
    Returns ({side: warm-up record}, warm-up rounds, measured rounds); a round is {side: block record}."""
    warm = {s.name: s.call("warmup", **kwargs) for s in sides}
    rounds = []
    for r in range(warmup_rounds + blocks):
        rounds.append({s.name: s.call("block", **kwargs) for s in sides})
        report(r - warmup_rounds, rounds[-1])
    return warm, rounds[:warmup_rounds], rounds[warmup_rounds:]


def _label(k: int, blocks: int) -> str:
    return f"warm-up round {k + 1 + blocks}" if k < 0 else f"block {k + 1}/{blocks}"


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


_RUN_KEYS = (
    "family",
    "objective",
    "tokens_per_step",
    "model_flops_per_step",
    "devices",
    "jax",
    "backend",
    "host_malloc",
    "matmul_peak_flops_per_sec_start",
)


def train(
    config, run: Dict[str, Any], *, steps: int, blocks: int, warmup_rounds: int, compare_hf: bool, mode: str
) -> Dict[str, Any]:
    """Train tokens/s of xlgen's loop (and HF's), or with steps=0 the train step's AOT compile time."""
    from xlgen.bench import hf

    if compare_hf:
        hf.hooks(config, "train_model")
    if steps == 1:
        raise hf.Unsupported("--steps must be 0 (compile only) or >= 2 (a block's first step is not counted)")
    if steps <= 0:
        compare_hf = False
    rounds = {"rounds": warmup_rounds + blocks}  # xlgen's side: its total_steps
    with Sides("train", run, {"steps": steps}, compare_hf=compare_hf, mode=mode, xlgen_options=rounds) as sides:
        x = sides[0]
        info = {s.name: s.call("start") for s in sides}
        res: Dict[str, Any] = {k: info["xlgen"].get(k) for k in _RUN_KEYS}
        res["sides"] = info
        res["pids"] = {s.name: s.pid for s in sides}
        res["bench_pid"] = os.getpid()
        res["hf_mode"] = mode if compare_hf else None
        if steps <= 0:
            res.update(x.call("compile_only"))
            res.update(x.call("finish"))
            print(f"[bench] trace+lower {res['trace_lower_s']:.1f} s, compile {res['compile_s']:.1f} s", flush=True)
            return _peaks(res)

        def report(k, rnd):
            msg = f"[bench] {_label(k, blocks)}: xlgen {rnd['xlgen']['tokens_per_sec']:.1f} tok/s"
            if "hf" in rnd:
                h = rnd["hf"]["tokens_per_sec"]
                msg += f", HF {h:.1f} tok/s, ratio {rnd['xlgen']['tokens_per_sec'] / h:.2f}"
            print(msg + f"  (load {measure.load_average()[0]})", flush=True)

        warm, warm_rounds, rounds = alternate(sides, warmup_rounds=warmup_rounds, blocks=blocks, report=report)
        fin = {s.name: s.call("finish") for s in sides}
    w = warm["xlgen"]
    print(
        f"[bench] compile {w['compile_s']:.1f} s (largest program; all compiles {w['compile_total_s']:.1f} s, "
        f"tracing {w['trace_s']:.1f} s); first block {w['first_block_s']:.1f} s",
        flush=True,
    )
    for k in ("compile_s", "compile_total_s", "num_compiles", "trace_s", "first_block_s", "first_block_cpu_s"):
        res[k] = w[k]
    res["warmup"] = {"sides": warm, "rounds": warm_rounds}
    res["blocks"] = rounds
    res["matmul_peak_flops_per_sec_end"] = fin["xlgen"]["matmul_peak_flops_per_sec_end"]
    res["peak_host_memory_gib"] = fin["xlgen"]["peak_host_memory_gib"]
    ours = [r["xlgen"]["tokens_per_sec"] for r in rounds]
    tps = measure.median(ours)
    tokens = res["tokens_per_step"]
    res["xlgen_tokens_per_sec"] = tps
    res["xlgen_blocks_tokens_per_sec"] = ours
    res["xlgen_steps_per_sec"] = tps / tokens if tps else None
    res["xlgen_step_s"] = tokens / tps if tps else None
    if tps and res.get("model_flops_per_step"):
        res["model_flops_per_sec"] = res["model_flops_per_step"] * tps / tokens
    if compare_hf:
        theirs = [r["hf"]["tokens_per_sec"] for r in rounds]
        htps = measure.median(theirs)
        res["hf_tokens_per_sec"] = htps
        res["hf_blocks_tokens_per_sec"] = theirs
        res["hf_step_s"] = tokens / htps
        res["ratio_xlgen_over_hf"] = tps / htps
        res["ratio_blocks"] = [a / b for a, b in zip(ours, theirs)]
        res["hf_torch_threads"] = warm["hf"]["torch_threads"]
        res["hf"] = {**info["hf"], **fin["hf"]}
    return _peaks(res)


def _peaks(res: Dict[str, Any]) -> Dict[str, Any]:
    """The measured peak (the better of xlgen's side's start and end measurements), MFU and the matmul-bound step."""
    ends = [res.pop("matmul_peak_flops_per_sec_start", None), res.pop("matmul_peak_flops_per_sec_end", None)]
    ends = [p for p in ends if p]
    if not ends:
        return res
    res["matmul_peak_flops_per_sec"] = peak = max(ends)
    res["matmul_peak_flops_per_sec_start_end"] = ends
    if res.get("model_flops_per_sec"):
        res["mfu_vs_measured_matmul_peak"] = res["model_flops_per_sec"] / (peak * res["devices"])
    if res.get("model_flops_per_step"):
        res["matmul_bound_step_s"] = res["model_flops_per_step"] / (peak * res["devices"])
    return res


# ----------------------------------------------------------------------------------------------------------------
# Cached evaluation and sampling (families whose HFBench has a memory LM: Transformer-XL)
# ----------------------------------------------------------------------------------------------------------------


def _memory_lm(config, root: str) -> str:
    from xlgen.bench import hf

    hooks = hf.hooks(config, "memory_lm")
    hf.require_torch()
    return hooks.memory_lm(config, root)


def evaluate(
    config,
    run: Dict[str, Any],
    *,
    mem_lens: List[int],
    segment: int,
    segments_per_block: int,
    blocks: int,
    warmup_rounds: int,
    compare_hf: bool,
    mode: str,
) -> Dict[str, Any]:
    """ms/token of cached evaluation at each total context l in `mem_lens` (memory l - segment)."""
    from xlgen.bench import hf

    for total in mem_lens:
        if total < segment:
            raise hf.Unsupported(f"--mem_lens: {total} is shorter than the segment ({segment})")
    out: Dict[str, Any] = {
        "family": config.model.family,
        "segment": segment,
        "segments_per_block": segments_per_block,
        "hf_mode": mode if compare_hf else None,
        "per_len": {},
    }
    with tempfile.TemporaryDirectory(prefix="xlgen-bench-") as root:
        options = {"path": _memory_lm(config, root), "segment": segment, "segments": segments_per_block}
        with Sides("eval", run, options, compare_hf=compare_hf, mode=mode) as sides:
            out["sides"] = {s.name: s.call("start") for s in sides}
            out["pids"] = {s.name: s.pid for s in sides}
            out["bench_pid"] = os.getpid()
            for total in mem_lens:
                warm, warm_rounds, rounds = alternate(
                    sides, warmup_rounds=warmup_rounds, blocks=blocks, report=lambda k, r: None, total=total
                )
                a = [r["xlgen"]["s_per_token"] for r in rounds]
                rec = {
                    "mem_len": total - segment,
                    "load_s": warm["xlgen"]["load_s"],
                    "first_pass_s": warm["xlgen"]["first_pass_s"],
                    "xlgen_compiles": rounds[-1]["xlgen"]["compiles"],
                    "xlgen_ms_per_token": 1e3 * measure.median(a),
                    "xlgen_tokens_per_sec": 1.0 / measure.median(a),
                    "warmup": {"sides": warm, "rounds": warm_rounds},
                    "blocks": rounds,
                }
                if compare_hf:
                    b = [r["hf"]["s_per_token"] for r in rounds]
                    rec["hf_ms_per_token"] = 1e3 * measure.median(b)
                    rec["hf_tokens_per_sec"] = 1.0 / measure.median(b)
                    rec["ratio_xlgen_over_hf"] = measure.median(b) / measure.median(a)
                    rec["ratio_blocks"] = [y / x for x, y in zip(a, b)]
                    out["hf_torch_threads"] = warm["hf"]["torch_threads"]
                out["per_len"][str(total)] = rec
                print(
                    f"[bench] l={total} (mem {rec['mem_len']}): xlgen {rec['xlgen_ms_per_token']:.3f} ms/token"
                    + (
                        f", HF {rec['hf_ms_per_token']:.3f} ms/token, ratio {rec['ratio_xlgen_over_hf']:.2f}"
                        if compare_hf
                        else ""
                    )
                    + f"  (compiles {rec['xlgen_compiles']}, load {measure.load_average()[0]})",
                    flush=True,
                )
            fin = {s.name: s.call("finish") for s in sides}
    out["peak_host_memory_gib"] = fin["xlgen"]["peak_host_memory_gib"]
    out["matmul_peak_flops_per_sec_start"] = out["sides"]["xlgen"]["matmul_peak_flops_per_sec_start"]
    out["matmul_peak_flops_per_sec_end"] = fin["xlgen"]["matmul_peak_flops_per_sec_end"]
    return _peaks(out)


def generate(
    config,
    run: Dict[str, Any],
    *,
    mem_len: int,
    new_tokens: int,
    batch: int,
    blocks: int,
    warmup_rounds: int,
    compare_hf: bool,
    mode: str,
) -> Dict[str, Any]:
    """Sampling tokens/s (top-k 40, prompt of 8 tokens) of xlgen's incremental decoder and HF's `generate`."""
    out: Dict[str, Any] = {
        "mem_len": mem_len,
        "new_tokens": new_tokens,
        "batch": batch,
        "hf_mode": mode if compare_hf else None,
    }
    with tempfile.TemporaryDirectory(prefix="xlgen-bench-gen-") as root:
        options = {"path": _memory_lm(config, root), "mem_len": mem_len, "new_tokens": new_tokens, "batch": batch}
        with Sides("generate", run, options, compare_hf=compare_hf, mode=mode) as sides:
            out["sides"] = {s.name: s.call("start") for s in sides}
            out["pids"] = {s.name: s.pid for s in sides}
            warm, warm_rounds, rounds = alternate(
                sides, warmup_rounds=warmup_rounds, blocks=blocks, report=lambda k, r: None
            )
            fin = {s.name: s.call("finish") for s in sides}
    out["matmul_peak_flops_per_sec_start"] = out["sides"]["xlgen"]["matmul_peak_flops_per_sec_start"]
    out["matmul_peak_flops_per_sec_end"] = fin["xlgen"]["matmul_peak_flops_per_sec_end"]
    _peaks(out)
    a = [r["xlgen"]["s_per_token"] for r in rounds]
    out["xlgen_compile_s"] = warm["xlgen"]["compile_s"]
    out["xlgen_tokens_per_sec"] = 1.0 / measure.median(a)
    out["xlgen_step_compiles"] = rounds[-1]["xlgen"]["compiles"]
    out["warmup"] = {"sides": warm, "rounds": warm_rounds}
    out["blocks"] = rounds
    if compare_hf:
        b = [r["hf"]["s_per_token"] for r in rounds]
        out["hf_tokens_per_sec"] = 1.0 / measure.median(b)
        out["ratio_xlgen_over_hf"] = measure.median(b) / measure.median(a)
        out["hf_torch_threads"] = warm["hf"]["torch_threads"]
    print(
        f"[bench] generate {batch} x {new_tokens} tokens, mem {mem_len}: xlgen {out['xlgen_tokens_per_sec']:.0f} "
        "tokens/s"
        + (
            f", HF {out['hf_tokens_per_sec']:.0f} tokens/s, ratio {out['ratio_xlgen_over_hf']:.2f}"
            if compare_hf
            else ""
        )
        + f"  (step compiles {out['xlgen_step_compiles']}, load {measure.load_average()[0]})",
        flush=True,
    )
    return out
