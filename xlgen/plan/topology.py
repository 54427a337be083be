"""TPU chip facts and compile-only device lists for TPU topologies (no hardware needed).

`topology_devices("v3:16x32")` returns the 1024 compile-only devices of a v3-1024 pod (512 chips × 2 cores), built
with `jax.experimental.topologies.get_topology_desc` from `libtpu` (the `tpu` extra). Programs jitted over a mesh of
these devices can be lowered and compiled (`.lower(...).compile()`) on a CPU-only machine; they cannot be run.

Topology names are `<generation>:<chips per dimension>` as understood by libtpu: `v3:4x4`, `v4:4x4x8`,
`v5e:16x16`, `v5p:8x8x16`, `v6e:16x16`. Several slices (multislice over DCN) are `num_slices=N`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    """Public per-chip figures (Cloud TPU system-architecture pages)."""

    generation: str
    hbm_bytes: int  # HBM per chip
    peak_bf16_flops: float  # dense bf16 FLOP/s per chip
    accelerator_prefix: str  # as in `gcloud ... --accelerator-type=<prefix>-<cores or chips>`
    chip_config: str = "default"  # "megacore": both TensorCores of a chip form one JAX device (v4, v5p)
    chips_per_host: tuple[int, ...] | None = None
    # ICI bandwidth one chip has for a collective along ONE mesh axis laid on a torus ring: one link each way
    # (the bidirectional bandwidth of one link), bytes/s. Conservative: an axis spanning several torus dimensions
    # gets more links, and DCN between slices is slower (not modelled).
    ici_axis_bytes_per_s: float = 0.0
    # HBM bandwidth per chip, bytes/s (shared by the chip's TensorCores on v2/v3): the memory side of the roofline
    # (`xlgen.plan.roofline`)
    hbm_bytes_per_s: float = 0.0


# ICI bandwidth per link, bidirectional, bytes/s (`ici_axis_bytes_per_s`), from "How to Scale Your Model", part
# "How to Think About TPUs" (jax-ml.github.io/scaling-book/tpus), table "ICI BW/link (one-way)/(bidi)": v3 1e11/2e11,
# v4p 4.5e10/9e10, v5p 9e10/1.8e11, v5e 4.5e10/9e10, v6e 9e10/1.8e11. For scale, Cloud TPU's pages give per chip
# (all ports): v5p 1200 GB/s bidirectional over 6 ports (cloud.google.com/tpu/docs/v5p), v5e 1600 Gbps and v6e
# 3584 Gbps over 4 ports (cloud.google.com/tpu/docs/v6e). v2 is not listed there: taken as v3's (same ICI
# generation). These are peak link rates; achieved collective bandwidth is lower, so comm times are lower bounds.
#
# HBM bandwidth per chip (`hbm_bytes_per_s`), Cloud TPU system-architecture pages, "HBM2 capacity and bandwidth": v3
# 900 GBps (cloud.google.com/tpu/docs/v3), v4 1200 GBps (cloud.google.com/tpu/docs/v4), v5e 819 GBps
# (cloud.google.com/tpu/docs/v5e), v5p 2765 GBps (cloud.google.com/tpu/docs/v5p), v6e 1638 GBps
# (cloud.google.com/tpu/docs/v6e, "HBM bandwidth per chip"); v2 700 GB/s from Jouppi et al., "A Domain-Specific
# Supercomputer for Training Deep Neural Networks", CACM 63(7), 2020 (its TPUv2/TPUv3 feature table; v3 900 GB/s).
# Peak rates: achieved bandwidth is lower, so roofline times are lower bounds.


CHIPS = {
    "v2": Chip("v2", 16 * GiB, 45e12, "v2", ici_axis_bytes_per_s=2e11, hbm_bytes_per_s=7e11),
    "v3": Chip("v3", 32 * GiB, 123e12, "v3", ici_axis_bytes_per_s=2e11, hbm_bytes_per_s=9e11),  # 2 TensorCores x 16 GiB
    "v4": Chip("v4", 32 * GiB, 275e12, "v4", "megacore", (2, 2, 1), ici_axis_bytes_per_s=9e10, hbm_bytes_per_s=1.2e12),
    "v5e": Chip(
        "v5e", 16 * GiB, 197e12, "v5litepod", "default", (2, 2, 1), ici_axis_bytes_per_s=9e10, hbm_bytes_per_s=8.19e11
    ),
    "v5p": Chip(
        "v5p", 95 * GiB, 459e12, "v5p", "megacore", (2, 2, 1), ici_axis_bytes_per_s=1.8e11, hbm_bytes_per_s=2.765e12
    ),
    "v6e": Chip(
        "v6e", 32 * GiB, 918e12, "v6e", "default", (2, 2, 1), ici_axis_bytes_per_s=1.8e11, hbm_bytes_per_s=1.638e12
    ),
}
_ALIASES = {"v5lite": "v5e", "v5litepod": "v5e", "trillium": "v6e"}
_TOPOLOGY_RE = re.compile(r"^(?P<gen>[a-zA-Z0-9]+)[:=_](?P<dims>\d+(?:x\d+)*)$")


@dataclasses.dataclass(frozen=True)
class Topology:
    """A parsed topology string, e.g. `v3:16x32` -> generation v3, chips (16, 32)."""

    name: str
    chip: Chip
    chip_dims: tuple[int, ...]
    num_slices: int = 1

    @property
    def num_chips(self) -> int:
        n = 1
        for d in self.chip_dims:
            n *= d
        return n * self.num_slices


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """`v3:16x32` -> Topology. Raises ValueError naming the known generations on bad input."""
    m = _TOPOLOGY_RE.match(name.strip())
    if not m:
        raise ValueError(f"--topology={name!r}: expected <generation>:<chips per dim>, e.g. v3:16x32 or v4:4x4x8")
    gen = m["gen"].lower()
    gen = _ALIASES.get(gen, gen)
    if gen not in CHIPS:
        raise ValueError(f"--topology={name!r}: unknown TPU generation {gen!r}; known: {sorted(CHIPS)}")
    if num_slices < 1:
        raise ValueError(f"--num_slices={num_slices}: must be >= 1")
    dims = tuple(int(d) for d in m["dims"].split("x"))
    return Topology(f"{gen}:{m['dims']}", CHIPS[gen], dims, num_slices)


def _quiet_libtpu_env(topology: Topology) -> None:
    """Off a TPU VM libtpu queries the GCE metadata server and logs warnings; give it what it asks for instead.

    Only defaults are set (a real TPU VM's environment wins), and they only affect libtpu's host discovery, not the
    compile target, which comes from the topology description.
    """
    if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"):
        return  # a real TPU host: leave discovery alone
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no chip to guard with the lockfile
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{topology.chip.accelerator_prefix}-8")


def libtpu_available() -> bool:
    """True when the `tpu` extra (libtpu) is importable, i.e. TPU topologies can be compiled for."""
    try:
        from jax._src import xla_bridge

        return xla_bridge.get_tpu_library_path() is not None
    except Exception:  # pragma: no cover - depends on jax internals
        return False


def topology_devices(topology: Topology | str, num_slices: int = 1) -> list:
    """Compile-only TPU devices of `topology` (all slices), in libtpu's order.

    Works with `JAX_PLATFORMS=cpu`: the TPU plugin is loaded for compilation only; `jax.devices()` stays CPU.
    """
    if isinstance(topology, str):
        topology = parse_topology(topology, num_slices)
    if not libtpu_available():
        raise RuntimeError(
            "libtpu is not installed: `pip install -e '.[tpu]'` (or `pip install libtpu`) to plan for TPU topologies"
        )
    _quiet_libtpu_env(topology)
    from jax.experimental import topologies

    kwargs = {"chip_config_name": topology.chip.chip_config}
    if topology.chip.chips_per_host is not None and len(topology.chip_dims) == len(topology.chip.chips_per_host):
        kwargs["chips_per_host_bounds"] = topology.chip.chips_per_host
    if topology.num_slices > 1:
        kwargs["num_slices"] = topology.num_slices
    dims = "x".join(str(d) for d in topology.chip_dims)
    desc = topologies.get_topology_desc(f"{topology.chip.generation}:{dims}", "tpu", **kwargs)
    return list(desc.devices)


def devices_per_chip(devices: Sequence) -> int:
    """How many JAX devices share a chip (2 on v2/v3, 1 on v4/v5p in megacore mode and on v5e/v6e)."""
    first_slice = [d for d in devices if getattr(d, "slice_index", 0) in (0, None)]
    coords = {tuple(getattr(d, "coords", (d.id,))) for d in first_slice}
    return max(1, len(first_slice) // max(1, len(coords)))


def per_device(topology: Topology, devices: Sequence) -> tuple[int, float]:
    """(HBM bytes, peak bf16 FLOP/s) of ONE JAX device of this topology."""
    k = devices_per_chip(devices)
    return topology.chip.hbm_bytes // k, topology.chip.peak_bf16_flops / k


def ici_bytes_per_s_per_device(topology: Topology, devices: Sequence) -> float:
    """ICI bandwidth (bytes/s) one JAX device has for a collective along one mesh axis: the chip's
    (`Chip.ici_axis_bytes_per_s`) shared by the devices on the chip (the two v2/v3 TensorCores)."""
    return topology.chip.ici_axis_bytes_per_s / devices_per_chip(devices)


def slice_index(device) -> int:
    return int(getattr(device, "slice_index", 0) or 0)


def hbm_bytes_per_s_per_device(topology: Topology, devices: Sequence) -> float:
    """HBM bandwidth (bytes/s) of ONE JAX device: the chip's (`Chip.hbm_bytes_per_s`) shared by the devices on the
    chip (each v2/v3 TensorCore has its own half of the chip's HBM)."""
    return topology.chip.hbm_bytes_per_s / devices_per_chip(devices)
