"""Which JAX platform a command or an API call uses — chosen before anything touches a device.

With the `tpu` extra (libtpu) installed, JAX's default is to probe for a TPU: on a machine without one that prints
~6 lines of libtpu errors (`Failed to find host bounds…`, `TPU initialization failed`) and, while another process
holds `/tmp/libtpu_lockfile`, advice to delete it. xlgen never probes for an accelerator the machine does not have:

    explicit request      --platform=... (commands) or the JAX_PLATFORMS environment variable: used as given
    otherwise             `tpu` / `gpu` when such a device node exists (/dev/accel*, /dev/vfio/N, /dev/nvidia0),
                          else `cpu`

`JAX_PLATFORMS` is read by JAX when `jax` is imported, so setting the variable afterwards has no effect; `select`
therefore sets both the variable (for subprocesses) and `jax.config.jax_platforms` (for this process).
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Optional


def detect() -> str:
    """The platform of the accelerator device nodes present (`tpu`, `gpu`), else `cpu`."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return "tpu"
    if os.path.exists("/dev/nvidia0"):
        return "gpu"
    return "cpu"


def default_platform() -> str:
    """JAX_PLATFORMS if set, else `detect()`."""
    return os.environ.get("JAX_PLATFORMS") or detect()


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # pragma: no cover - depends on jax internals
        return False


def select(platform: str) -> None:
    """Use `platform` (`cpu`, `tpu`, `gpu` or a JAX_PLATFORMS list) in this process and its subprocesses."""
    os.environ["JAX_PLATFORMS"] = platform
    if "jax" in sys.modules and not _backends_initialized():
        import jax

        jax.config.update("jax_platforms", platform)


def quiet_default() -> None:
    """For Python API entry points (`xlgen.from_pretrained`, ...): when the user asked for nothing (no JAX_PLATFORMS,
    jax_platforms unset) and the machine has no accelerator, use the CPU without probing for a TPU."""
    if os.environ.get("JAX_PLATFORMS") or detect() != "cpu":
        return
    if "jax" in sys.modules:
        import jax

        if jax.config.jax_platforms or _backends_initialized():
            return  # set by the user, or too late to change
    select("cpu")


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_NEVER = -1  # mallopt's int argument, read as size_t: SIZE_MAX, i.e. no size is above the threshold


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc keep freed host memory for reuse instead of returning it to the OS (process-wide).

    XLA:CPU allocates every execution's outputs and temporaries through malloc. With glibc's defaults a buffer
    above the (dynamic, at most 32 MiB) mmap threshold, and any buffer above 64 MiB allocated by a worker thread
    (XLA executes on its own threads, each with a malloc arena of its own), is a fresh `mmap`, `munmap`ped when
    freed: each call faults its pages in again. A `[4, 4, 512, 1024]` float32 einsum output (32 MiB) cost ~9,500
    minor page faults per call (20 ms against 8 ms with its pages kept), and a Funnel seq-512 train step
    ~360,000 (its 1.3 GiB of saved activations) on this 2-core VM. Here: one malloc arena for all threads,
    no mmap'ed chunks and no trimming, so a step reuses the pages of the previous one.

    Cost: freed memory stays with the process (resident memory does not go down after a peak), and the heap can
    grow to about twice a step's largest temporary while the allocation pattern settles in the first steps.
    Called by every `xlgen` command (`runtime.setup_runtime`) and `xlgen.from_pretrained`, before XLA starts its
    threads where possible; `XLGEN_HOST_MALLOC=default` keeps glibc's defaults. No-op off glibc (macOS, musl) or
    when `MALLOC_*_` / `GLIBC_TUNABLES` variables already set a malloc policy. Returns whether it applied it.
    """
    global _kept
    if _kept is not None:
        return _kept
    _kept = _apply_keep_freed_host_memory()
    return _kept


_kept: Optional[bool] = None


def _apply_keep_freed_host_memory() -> bool:
    if os.environ.get("XLGEN_HOST_MALLOC", "").lower() == "default" or not sys.platform.startswith("linux"):
        return False
    if any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, or no libc.so.6
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_THRESHOLD, _NEVER) and mallopt(_M_TRIM_THRESHOLD, _NEVER))
