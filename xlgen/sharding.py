"""Device mesh and logical-axis sharding rules.

Mesh axes are always `("data", "fsdp", "tensor")`, sized by `config.mesh.{data,fsdp,tensor}` (one of them may be -1 =
"all remaining devices"). Parameters carry logical axis names (`xlgen.models.layers`); a rule preset maps each
logical name to a mesh axis (or None = replicated along that dimension):

    preset    vocab   embed  heads   kv    mlp     layers | batch (activations)
    dp        -       -      -       -     -       -      | (data, fsdp)
    fsdp      -       fsdp   -       -     -       -      | (data, fsdp)
    fsdp_tp   tensor  fsdp   tensor  -     tensor  -      | (data, fsdp)

A dimension is left unsharded when its mesh axis is already used by an earlier dimension of the same parameter or
when the dimension is not divisible by the axis size (e.g. 10 heads on 4-way tensor), so every preset is valid for
every model; `describe_param_shardings` reports what happened.

Axis types: the mesh is made with `AxisType.Auto` on purpose. The three model families are written in global view
without per-op sharding annotations; in Auto mode the partitioner propagates the shardings we pin at the jit boundary
(parameters, optimizer state, batch, memory), whereas Explicit mode would make every op's output sharding part of its
type and turn ambiguous contractions (e.g. an fsdp-sharded `embed` contracted against batch-sharded activations)
into type errors inside model code that other teams own. Explicit typing buys nothing here that the jit-boundary
shardings don't already give.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch (and memory rows) are split over both data-parallel axes

RULE_PRESETS: Dict[str, Dict[str, Optional[str]]] = {
    "dp": {"vocab": None, "embed": None, "heads": None, "kv": None, "mlp": None, "layers": None},
    "fsdp": {"vocab": None, "embed": "fsdp", "heads": None, "kv": None, "mlp": None, "layers": None},
    "fsdp_tp": {"vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv": None, "mlp": "tensor", "layers": None},
}


def mesh_shape(sizes: Sequence[int], num_devices: int) -> Tuple[int, ...]:
    """Resolve a `-1` ("fill") entry of (data, fsdp, tensor) against `num_devices`; check the product."""
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices not divisible by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
            f"have {num_devices} (set one of mesh.data/fsdp/tensor to -1 to fill)"
        )
    return tuple(sizes)


def make_mesh(mesh_config, devices: Optional[Sequence] = None) -> Mesh:
    """Mesh ("data", "fsdp", "tensor") from `config.mesh` (keys data/fsdp/tensor; optional num_devices > 0 uses
    only the first N devices, e.g. to compare against a one-device run)."""
    devices = list(devices) if devices is not None else jax.devices()
    n = int(mesh_config.get("num_devices", 0) or 0) if hasattr(mesh_config, "get") else 0
    if n > 0:
        if n > len(devices):
            raise ValueError(f"mesh.num_devices={n} but only {len(devices)} devices are available")
        devices = devices[:n]
    shape = mesh_shape([mesh_config["data"], mesh_config["fsdp"], mesh_config["tensor"]], len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_to_spec(
    logical: Sequence[Optional[str]], shape: Sequence[int], rules: Dict[str, Optional[str]], mesh: Mesh
) -> P:
    """PartitionSpec for one array with logical axis names, applying the dedup / divisibility fallbacks."""
    used, out = set(), []
    for name, dim in zip(logical, shape):
        axis = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        if axis is None or axis in used or mesh.shape[axis] == 1 or dim % mesh.shape[axis]:
            out.append(None)
        else:
            out.append(axis)
            used.add(axis)
    return P(*out)


def rules_for(preset: str) -> Dict[str, Optional[str]]:
    if preset not in RULE_PRESETS:
        raise ValueError(f"mesh.rules={preset!r}: unknown preset; choose one of {sorted(RULE_PRESETS)}")
    return RULE_PRESETS[preset]


def batch_spec(ndim: int) -> P:
    """Batch-major arrays: split dim 0 over the data-parallel axes, replicate the rest."""
    return P(BATCH_AXES, *([None] * (ndim - 1)))


def mems_spec() -> P:
    """Memory [n_layer, batch, mem_len, d_model]: rows follow the batch."""
    return P(None, BATCH_AXES, None, None)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(ndim))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def process_rows(mesh: Mesh, global_batch: int) -> Tuple[int, int]:
    """The contiguous [start, stop) batch rows this process's devices hold under `batch_spec` (checks contiguity)."""
    sh = batch_sharding(mesh, 1)
    idx = sh.addressable_devices_indices_map((global_batch,))
    starts = sorted({s[0].start or 0 for s in idx.values()})
    stops = sorted({s[0].stop if s[0].stop is not None else global_batch for s in idx.values()})
    start, stop = starts[0], stops[-1]
    covered = sorted({(s[0].start or 0, s[0].stop or global_batch) for s in idx.values()})
    pos = start
    for a, b in covered:
        if a != pos:
            raise ValueError(f"process {jax.process_index()} holds non-contiguous batch rows {covered}")
        pos = b
    return start, stop


def describe_param_shardings(specs: Dict[str, P], shapes: Dict[str, Tuple[int, ...]]) -> str:
    lines = []
    for name in sorted(specs):
        lines.append(f"  {name:60s} {str(tuple(shapes[name])):24s} {specs[name]}")
    return "\n".join(lines)


def is_fully_replicated_fraction(specs: Dict[str, P], shapes: Dict[str, Tuple[int, ...]]) -> float:
    """Fraction of parameter elements that are not sharded at all (MaxText's 'sharding tolerance' figure)."""
    total = sum(int(np.prod(s)) for s in shapes.values())
    rep = sum(int(np.prod(shapes[k])) for k, sp in specs.items() if all(a is None for a in sp))
    return rep / max(total, 1)
