"""Runtime set-up shared by every command, before anything touches a device: the JAX platform, logging, the
persistent XLA compilation cache and `jax.distributed` (multi-process / multi-host runs).

    --platform=cpu|tpu|gpu   default: JAX_PLATFORMS if set, else `tpu`/`gpu` when such a device node exists
                             (/dev/accel*, /dev/vfio/*, /dev/nvidia0), else `cpu`.
    XLGEN_COMPILATION_CACHE=DIR  persistent XLA compilation cache (default ~/.cache/xlgen/jax_cache; "off")
    XLGEN_HOST_MALLOC=default  keep glibc's malloc defaults (xlgen/platforms.py, "Host memory")
    --distributed=auto|on|off  `auto`: when launched by launch/local_multiprocess.sh (XLGEN_COORDINATOR,
                             XLGEN_NUM_PROCESSES, XLGEN_PROCESS_ID), or on a multi-host TPU slice / SLURM job.
"""

from __future__ import annotations

import logging
import os

from xlgen import platforms


def default_platform() -> str:
    """JAX_PLATFORMS if set, else the platform of the accelerator device nodes present, else `cpu`
    (xlgen/platforms.py)."""
    return platforms.default_platform()


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
    import sys

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
    platforms.select(platform)  # env var AND jax.config: the env var alone is ignored once jax is imported
    platforms.keep_freed_host_memory()  # before XLA starts its threads (they would get malloc arenas of their own)
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
