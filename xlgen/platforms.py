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
