"""Which JAX platform a command or an API call uses, and a command's runtime set-up (`setup_runtime`: logging, the
persistent compilation cache, `jax.distributed`) — both before anything touches a device.

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
import logging
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


# ----------------------------------------------------------------------------------------------------------------
# The platform a program is lowered for
# ----------------------------------------------------------------------------------------------------------------


def lowering_platform() -> str:
    """The platform (`cpu`, `tpu`, `gpu`) of the program being traced: that of the devices of the mesh in context
    (`xlgen train`, `xlgen plan` and the finetuning loop trace their steps under `jax.set_mesh(mesh)`; a plan made
    on a CPU host traces under a mesh of TPU compile-only devices), else JAX's default backend. For code whose
    choice changes shapes or layouts at trace time (`xlgen.models.operands`); a choice between values of one
    shape uses `jax.lax.platform_dependent`, which follows the lowering even without a mesh."""
    import jax

    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def lowering_device_kind() -> str:
    """The `device_kind` (e.g. "TPU v3") of the devices `lowering_platform` reads, else of JAX's first device."""
    import jax

    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.device_kind if device is not None else jax.devices()[0].device_kind


# ----------------------------------------------------------------------------------------------------------------
# Host memory (glibc malloc)
# ----------------------------------------------------------------------------------------------------------------
#
# XLA:CPU allocates every execution's outputs and temporaries through malloc. With glibc's defaults a buffer above
# the (dynamic, at most 32 MiB) mmap threshold, and any buffer above 64 MiB allocated by a worker thread (XLA runs
# executables on its own threads, each with a malloc arena of its own), is a fresh `mmap`, `munmap`ped when freed:
# every call faults its pages in again: a `[4, 4, 512, 1024]` float32 einsum output (32 MiB) takes ~9,000 minor
# page faults per call, a Funnel seq-512 or XLNet 6L train step some 400,000 (docs/performance.md, "What the code
# does for speed"). The policy below keeps freed memory for reuse: one malloc arena for all threads, no mmap'ed
# chunks, no trimming, and (as a process start-up setting) transparent huge pages for the heap where the kernel
# offers them on request (THP "madvise" mode), so the heap's growth while a run's allocation pattern settles costs
# one fault per 2 MiB. Cost: freed memory stays with the process (resident
# memory does not go down after a peak). `XLGEN_HOST_MALLOC=default` keeps glibc's defaults; a malloc policy the
# user set (GLIBC_TUNABLES glibc.malloc.*, MALLOC_*_ variables) is left alone.

_SIZE_MAX = "18446744073709551615"
MALLOC_TUNABLES = (
    f"glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold={_SIZE_MAX}"
    f":glibc.malloc.trim_threshold={_SIZE_MAX}"
)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt parameters (malloc.h)
_NEVER = -1  # mallopt's int argument, read as size_t: SIZE_MAX, i.e. no size is above the threshold


def _user_malloc_policy(environ) -> bool:
    return any(k.startswith("MALLOC_") for k in environ) or "glibc.malloc" in environ.get("GLIBC_TUNABLES", "")


def _host_malloc_wanted(environ) -> bool:
    return (
        sys.platform.startswith("linux")
        and environ.get("XLGEN_HOST_MALLOC", "").lower() != "default"
        and not _user_malloc_policy(environ)
    )


def host_malloc_environment(environ=None) -> Optional[dict]:
    """The environment for a new process with xlgen's host-malloc policy (`MALLOC_TUNABLES` added to
    GLIBC_TUNABLES), or None when it does not apply (opted out, a user malloc policy, not Linux)."""
    environ = dict(os.environ if environ is None else environ)
    if not _host_malloc_wanted(environ):
        return None
    other = environ.get("GLIBC_TUNABLES", "")
    environ["GLIBC_TUNABLES"] = f"{other}:{MALLOC_TUNABLES}" if other else MALLOC_TUNABLES
    return environ


def reexec_with_host_malloc() -> None:
    """For the `xlgen` command at its start (nothing done yet): re-execute this very command line (same PID) with
    `host_malloc_environment()`, since glibc reads its tunables at process start only. No-op when the policy does
    not apply or is already in place."""
    env = host_malloc_environment()
    if env is None or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:  # pragma: no cover - e.g. a frozen executable: keep going with keep_freed_host_memory
        pass


def keep_freed_host_memory() -> bool:
    """The in-process part of the policy (process-wide; no huge pages: those need `reexec_with_host_malloc`):
    for `xlgen.from_pretrained` and commands run in an existing process. Applied once, before XLA starts its
    threads where possible (threads that already have an arena keep it). Returns whether it applied."""
    global _kept
    if _kept is None:
        _kept = _host_malloc_wanted(os.environ) and _apply_mallopt()
    return _kept


_kept: Optional[bool] = None


def host_malloc_policy() -> str:
    """What this process runs with, for reports: the GLIBC_TUNABLES malloc policy, the in-process (`mallopt`) one,
    or glibc's defaults."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc" in tunables:
        return "GLIBC_TUNABLES=" + tunables
    return "mallopt (keep freed memory)" if keep_freed_host_memory() else "glibc default"


def _apply_mallopt() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, or no libc.so.6
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_THRESHOLD, _NEVER) and mallopt(_M_TRIM_THRESHOLD, _NEVER))


# ----------------------------------------------------------------------------------------------------------------
# Compiler options for programs of small ops
# ----------------------------------------------------------------------------------------------------------------

_YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"


def small_op_compiler_options() -> dict:
    """`jax.jit(..., compiler_options=...)` for programs made of many small ops on XLA:CPU, such as a batch-1
    segment of Transformer-XL cached evaluation: YNNPACK fusions off, so XLA's own emitters run them.

    Each YNNPACK fusion call has a fixed cost (up to 0.3 ms for a `[1, 64]` LayerNorm reduction) that exceeds such
    ops' work: without them a Transformer-XL evaluation segment (64 tokens, 4L d256) takes 0.935x the time. Training
    steps keep the defaults (a Funnel 12L step takes 1.09x the time without YNNPACK). Empty off the CPU backend, or
    when the user's XLA_FLAGS choose the YNNPACK fusion types themselves."""
    import jax

    if jax.default_backend() != "cpu" or _YNN_OPTION in os.environ.get("XLA_FLAGS", ""):
        return {}
    return {_YNN_OPTION: ""}


# ----------------------------------------------------------------------------------------------------------------
# Runtime set-up of a command: platform, logging, compilation cache, jax.distributed
# ----------------------------------------------------------------------------------------------------------------
#
#     --platform=cpu|tpu|gpu   default: JAX_PLATFORMS if set, else `tpu`/`gpu` when such a device node exists
#                              (/dev/accel*, /dev/vfio/*, /dev/nvidia0), else `cpu`.
#     XLGEN_COMPILATION_CACHE=DIR  persistent XLA compilation cache (default ~/.cache/xlgen/jax_cache; "off")
#     XLGEN_HOST_MALLOC=default  keep glibc's malloc defaults ("Host memory" above)
#     --distributed=auto|on|off  `auto`: when launched by launch/local_multiprocess.sh (XLGEN_COORDINATOR,
#                              XLGEN_NUM_PROCESSES, XLGEN_PROCESS_ID), or on a multi-host TPU slice / SLURM job.


def want_distributed(mode: str) -> bool:
    if mode == "on":
        return True
    if mode == "off":
        return False
    if os.environ.get("XLGEN_NUM_PROCESSES") and int(os.environ["XLGEN_NUM_PROCESSES"]) > 1:
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts:
        return True
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1


PLATFORMS = ("cpu", "tpu", "gpu", "cuda", "rocm")


def _platform_error(text: str) -> SystemExit:
    """`--platform` names no platform JAX can use: one line (`xlgen: error: --platform=...`), exit 2."""
    print(f"xlgen: error: {text}", file=sys.stderr)
    return SystemExit(2)


def check_platform(platform: str) -> None:
    """Exit 2 with one line when `platform` (a JAX_PLATFORMS list) names an unknown platform, or one without a
    device here (`--platform=gpu` on a machine without a GPU). Initialises JAX's backends: call it after
    `jax.distributed.initialize`."""
    unknown = [p for p in platform.split(",") if p.strip() not in PLATFORMS]
    if unknown:
        raise _platform_error(f"--platform={platform}: unknown platform {unknown[0]!r}; expected one of cpu, tpu, gpu")
    import jax

    try:
        jax.devices()
    except RuntimeError as e:
        raise _platform_error(
            f"--platform={platform}: no {platform} device is available here ({str(e).split(':')[0]}); "
            "use --platform=cpu or omit --platform to autodetect"
        ) from None


def setup_runtime(platform: str, distributed: str) -> None:
    """Platform, CPU collectives and jax.distributed — before anything touches a device."""
    unknown = [p for p in platform.split(",") if p.strip() not in PLATFORMS]
    if unknown:  # before JAX_PLATFORMS is set: the message, not JAX's traceback
        raise _platform_error(f"--platform={platform}: unknown platform {unknown[0]!r}; expected one of cpu, tpu, gpu")
    select(platform)  # env var AND jax.config: the env var alone is ignored once jax is imported
    keep_freed_host_memory()  # before XLA starts its threads (they would get malloc arenas of their own)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax is chatty at INFO
    except ImportError:  # pragma: no cover
        pass
    import jax

    cache = os.environ.get("XLGEN_COMPILATION_CACHE", os.path.expanduser("~/.cache/xlgen/jax_cache"))
    if cache and cache.lower() not in ("0", "off", "none"):
        # Re-running a job (resume after preemption, eval) loads its executables instead of recompiling.
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs",
            float(os.environ.get("XLGEN_COMPILATION_CACHE_MIN_SECS", "1.0")),
        )

    if want_distributed(distributed):
        if platform == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if os.environ.get("XLGEN_COORDINATOR"):
            jax.distributed.initialize(
                coordinator_address=os.environ["XLGEN_COORDINATOR"],
                num_processes=int(os.environ["XLGEN_NUM_PROCESSES"]),
                process_id=int(os.environ["XLGEN_PROCESS_ID"]),
            )
        else:
            jax.distributed.initialize()
    check_platform(platform)
