"""xlgen's side of a benchmark: the same program and loop `xlgen train` runs, and the `from_pretrained` /
`xlgen generate` paths, driven block by block (`xlgen.bench.compare`), normally in a process of its own.

Every side has `start()`, `warmup(**kw)`, `block(**kw)`, `finish()` and `matmul_peak(reps)`, each returning plain
JSON-able values (`xlgen.bench.worker` sends them between processes)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Optional

import numpy as np

from xlgen.bench import measure


def bench_config(config, *, steps: int, rounds: int):
    """The run config of a train benchmark: logs once per block of `steps` steps, no evaluation, checkpoints only
    where a block stops (the next block resumes from it), `rounds` blocks after the compile block."""
    c = config.copy_and_resolve_references()
    c.log_every_steps = max(steps, 1)
    c.eval_every_steps = 0
    c.checkpoint.every_steps = 0
    c.checkpoint.keep = 1
    c.checkpoint.async_save = False
    c.total_steps = max(steps, 1) * (rounds + 1)
    if "tensorboard" in c:
        c.tensorboard = False
    return c


def _tokens_per_sec(workdir: str, step: int) -> Optional[float]:
    """The loop's own `tokens_per_sec` record at `step` (metrics.jsonl)."""
    val = None
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step") == step and "tokens_per_sec" in r and "split" not in r:
                val = float(r["tokens_per_sec"])
    return val


def runtime_record() -> Dict[str, Any]:
    import jax

    from xlgen import platforms

    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "host_malloc": platforms.host_malloc_policy(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


class Side:
    """What every xlgen side shares: the runtime and JAX's matmul peak at the start; the peak again and the
    process's peak host memory at the end."""

    def start(self) -> Dict[str, Any]:
        return {**runtime_record(), "matmul_peak_flops_per_sec_start": measure.matmul_peak()}

    def matmul_peak(self, reps: int) -> float:
        return measure.matmul_peak(reps=reps)

    def finish(self) -> Dict[str, Any]:
        return {
            "matmul_peak_flops_per_sec_end": measure.matmul_peak(),
            "peak_host_memory_gib": round(measure.peak_host_memory_gib(), 2),
        }


class Train(Side):
    """`xlgen train`'s program and loop (`xlgen.train.loop.run`, the real data pipeline, prefetching and metrics)
    on a temporary workdir. The program is built once; each block is one `loop.run` to `stop_at` = the block's last
    step, resuming the previous block's checkpoint, and its figure is the loop's own `metrics.jsonl`
    `tokens_per_sec` (the loop does not count a run's first step, which absorbs the restore)."""

    def __init__(self, config, *, steps: int, rounds: int):
        self.steps = int(steps)
        self.config = bench_config(config, steps=self.steps, rounds=rounds)
        self.step = 0

    def start(self) -> Dict[str, Any]:
        from xlgen import sharding
        from xlgen.train import loop
        from xlgen.train.program import build_program
        from xlgen.train.workdir import Workdir

        self.events = measure.CompileEvents()
        c = self.config
        self.mesh = sharding.make_mesh(c.mesh)
        t = time.perf_counter()
        self.events.start()
        self.program = build_program(c, self.mesh)
        self.events.stop()
        self.build_s = time.perf_counter() - t
        self.pipeline = loop.make_pipeline(c, "train") if self.steps > 0 else None
        self.root = tempfile.mkdtemp(prefix="xlgen-bench-")
        self.wd = Workdir(self.root)
        return {
            **super().start(),
            "family": c.model.family,
            "objective": c.get("objective"),
            "tokens_per_step": self.program.tokens_per_step,
            "model_flops_per_step": self.program.analytic_flops_per_step,
            "devices": len(self.mesh.devices.flat),
        }

    def _run_to(self, end: int) -> Optional[float]:
        from xlgen.train import loop

        loop.run(
            self.config,
            self.wd,
            self.program,
            self.pipeline,
            stop_at=end,
            save_mems=bool(self.config.checkpoint.save_mems),
        )
        self.step = end
        return _tokens_per_sec(self.root, end)

    def warmup(self) -> Dict[str, Any]:
        """The first block: tracing, XLA compilation of the train step, the first steps."""
        t, cpu = time.perf_counter(), time.process_time()
        self.events.start()
        tps = self._run_to(self.steps)
        self.events.stop()
        return {
            "first_block_s": round(time.perf_counter() - t, 2),
            "first_block_cpu_s": round(time.process_time() - cpu, 2),
            "tokens_per_sec": tps,
            **self.events.summary(),
        }

    def block(self) -> Dict[str, Any]:
        return {"tokens_per_sec": self._run_to(self.step + self.steps)}

    def compile_only(self) -> Dict[str, Any]:
        """AOT lower + compile of the train step (`--steps=0`, e.g. the 24-layer scanned XLNet-Large step)."""
        import jax

        t = time.perf_counter()
        with jax.set_mesh(self.mesh):
            lowered = self.program.train_step.lower(*self.program.abstract_args())
            res = {"trace_lower_s": round(time.perf_counter() - t, 2)}
            t, cpu = time.perf_counter(), time.process_time()
            lowered.compile()
        res["compile_s"] = round(time.perf_counter() - t, 2)
        res["compile_cpu_s"] = round(time.process_time() - cpu, 2)
        return res

    def finish(self) -> Dict[str, Any]:
        shutil.rmtree(self.root, ignore_errors=True)
        return super().finish()


def stream(config, total: int, segment: int, segments: int) -> np.ndarray:
    """The token stream both sides evaluate at context `total`: [1, segment * segments] ids."""
    rng = np.random.default_rng(total)
    return rng.integers(0, int(config.model.vocab_size), size=(1, segment * segments)).astype(np.int64)


class Eval(Side):
    """Cached evaluation through `xlgen.from_pretrained(dir, mem_len=l - segment)` of the family's random-weight HF
    directory: segments of `segment` tokens with the memory carried; a block is `segments` segments, s/token."""

    def __init__(self, config, *, path: str, segment: int, segments: int):
        self.config, self.path, self.segment, self.segments = config, path, segment, segments
        self.models = {}

    def _run(self, total: int) -> float:
        import jax

        model = self.models[total]
        ids = stream(self.config, total, self.segment, self.segments)
        mems = None
        t = time.perf_counter()
        for i in range(self.segments):
            mems = model(input_ids=ids[:, i * self.segment : (i + 1) * self.segment], mems=mems).mems
        jax.block_until_ready(mems)
        return (time.perf_counter() - t) / ids.size

    def warmup(self, total: int) -> Dict[str, Any]:
        from xlgen.pretrained import from_pretrained

        t = time.perf_counter()
        self.models[total] = from_pretrained(self.path, mem_len=total - self.segment)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        self._run(total)  # compiles
        return {"load_s": round(load_s, 2), "first_pass_s": round(time.perf_counter() - t, 2)}

    def block(self, total: int) -> Dict[str, Any]:
        s = self._run(total)
        forward = getattr(self.models[total], "_forward", None)  # the wrapper's jitted forward, where it has one
        return {"s_per_token": s, "compiles": forward._cache_size() if hasattr(forward, "_cache_size") else None}


PROMPT_TOKENS = 8


def prompt(config):
    return [int(x) for x in np.random.default_rng(0).integers(0, int(config.model.vocab_size), PROMPT_TOKENS)]


class Generate(Side):
    """Sampling through `xlgen generate`'s incremental decoder (top-k 40) from the family's random-weight HF
    directory; a block is one generation of `new_tokens` x `batch`, s/token (prompt included, compile excluded)."""

    def __init__(self, config, *, path: str, mem_len: int, new_tokens: int, batch: int):
        self.config, self.path, self.mem_len, self.new_tokens, self.batch = config, path, mem_len, new_tokens, batch
        self.i = 0

    def _run(self) -> float:
        self.i += 1
        t = time.perf_counter()
        self.decoder.generate(
            prompt(self.config), seed=self.i, max_new_tokens=self.new_tokens, num_samples=self.batch, top_k=40
        )
        return (time.perf_counter() - t) / (self.new_tokens * self.batch)

    def warmup(self) -> Dict[str, Any]:
        from xlgen.generate import decoder_for
        from xlgen.interop.export import unwrap
        from xlgen.pretrained import from_pretrained

        self.decoder = decoder_for(unwrap(from_pretrained(self.path)), self.mem_len)
        first = self.decoder.generate(
            prompt(self.config), seed=0, max_new_tokens=self.new_tokens, num_samples=self.batch, top_k=40
        )
        return {"compile_s": round(first["prefill_s"] + first["compile_s"], 2)}

    def block(self) -> Dict[str, Any]:
        return {"s_per_token": self._run(), "compiles": self.decoder.step_compilations()}
