"""What the bench records about the machine and the process it runs in: load, threads, host memory, the f32 matmul
peak (JAX's and PyTorch's), JAX's compile events, and medians."""

from __future__ import annotations

import functools
import os
import resource
import statistics
import time
from typing import Any, Dict, List, Optional


def load_average() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def peak_host_memory_gib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def os_threads() -> int:
    """Threads of this process (XLA's and PyTorch's pools, the prefetch worker, ...)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux
        import threading

        return threading.active_count()


def process_record() -> Dict[str, Any]:
    """Who measured, under what load: pid, OS threads, 1/5/15-minute load average, CPUs this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"pid": os.getpid(), "os_threads": os_threads(), "load": load_average(), "cpus": cpus}


@functools.lru_cache(maxsize=None)
def _jax_chain(k: int):
    import jax

    @jax.jit
    def chain(a, b):
        for _ in range(k):
            a = (a @ b) * 0.03
        return a

    return chain


def matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """Best f32 FLOP/s of a jitted [n,n]x[n,n] matmul chain on the default JAX device (what the model can hope for)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    k = 4
    chain = _jax_chain(k)
    chain(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        chain(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return k * 2.0 * n**3 / best


def torch_matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """The same chain in PyTorch at its current thread setting."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    k = 4

    def chain(a):
        for _ in range(k):
            a = (a @ b) * 0.03
        return a

    with torch.no_grad():
        chain(a)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            chain(a)
            best = min(best, time.perf_counter() - t)
    return k * 2.0 * n**3 / best


class CompileEvents:
    """JAX's own compile-time events (jax.monitoring) while started: tracing and XLA backend compilation."""

    def __init__(self):
        import jax

        self.on, self.records = False, []
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **kw):
        if self.on:
            self.records.append((event, float(duration), kw.get("fun_name")))

    def start(self):
        self.on = True

    def stop(self):
        self.on = False

    def summary(self) -> Dict[str, Any]:
        comp = [d for e, d, _ in self.records if e.endswith("/backend_compile_duration")]
        trace = [d for e, d, _ in self.records if e.endswith("/jaxpr_trace_duration")]
        return {
            "compile_s": round(max(comp, default=0.0), 2),
            "compile_total_s": round(sum(comp), 2),
            "num_compiles": len(comp),
            "trace_s": round(sum(trace), 2),
        }


def median(xs: List[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
