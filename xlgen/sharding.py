"""Device mesh and logical-axis sharding rules.

Mesh axes are always `("data", "fsdp", "tensor")`, sized by `config.mesh.{data,fsdp,tensor}` (one of them may be -1 =
"all remaining devices"). Parameters carry logical axis names (`xlgen.models.layers`); a rule preset maps each
logical name to a mesh axis (or None = replicated along that dimension):

    preset    vocab   embed  heads   kv    mlp     layers | batch (activations)
    dp        -       -      -       -     -       -      | (data, fsdp)
    fsdp      -       fsdp   -       -     -       -      | (data, fsdp)
    fsdp_tp   tensor  fsdp   tensor  -     tensor  -      | (data, fsdp)

Activations are constrained the same way, MaxText-style: a model names an activation's dimensions with logical
activation axes (`constrain(x, ("activation_batch", "activation_length", "activation_embed"))`) and the preset
maps them (the rules, never the model files, name mesh axes):

    preset    activation_batch  _length  _kv_length  _embed  _heads  _kv   _mlp    _vocab
    dp        (data, fsdp)      -        -           -       -       -     -       -
    fsdp      (data, fsdp)      -        -           -       -       -     -       -
    fsdp_tp   (data, fsdp)      -        -           -       tensor  -     tensor  tensor

`constrain` is a no-op outside a mesh (one CPU device, `xlgen.from_pretrained`); under a mesh it uses the rules of
the enclosing `activation_rules(preset)` (the trainer sets the config's preset around its step) or, without one,
the batch-only mapping of `dp`.

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

import contextlib
import contextvars
import math
from typing import Dict, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch (and memory rows) are split over both data-parallel axes

_ACT_BATCH_ONLY = {
    "activation_batch": BATCH_AXES,
    # rows computed once for the whole batch (the position encodings' keys): split over the batch's devices to
    # project, then gathered
    "activation_positions": BATCH_AXES,
    "activation_length": None,
    "activation_kv_length": None,
    "activation_embed": None,
    "activation_heads": None,
    "activation_kv": None,
    "activation_mlp": None,
    "activation_vocab": None,
}
_ACT_TENSOR = {
    **_ACT_BATCH_ONLY,
    "activation_heads": "tensor",
    "activation_mlp": "tensor",
    "activation_vocab": "tensor",
}

RULE_PRESETS: Dict[str, Dict[str, Union[None, str, Tuple[str, ...]]]] = {
    "dp": {"vocab": None, "embed": None, "heads": None, "kv": None, "mlp": None, "layers": None, **_ACT_BATCH_ONLY},
    "fsdp": {"vocab": None, "embed": "fsdp", "heads": None, "kv": None, "mlp": None, "layers": None, **_ACT_BATCH_ONLY},
    "fsdp_tp": {
        "vocab": "tensor",
        "embed": "fsdp",
        "heads": "tensor",
        "kv": None,
        "mlp": "tensor",
        "layers": None,
        **_ACT_TENSOR,
    },
}
UNCONSTRAINED = "unconstrained"  # a logical name for `constrain`: leave this dimension to the partitioner
_ACTIVE_RULES: contextvars.ContextVar = contextvars.ContextVar("xlgen_activation_rules", default=None)


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


def make_mesh(mesh_config, devices: Optional[Sequence] = None, num_slices: Optional[int] = None) -> Mesh:
    """Mesh ("data", "fsdp", "tensor") from `config.mesh` (keys data/fsdp/tensor; optional num_devices > 0 uses
    only the first N devices, e.g. to compare against a one-device run). The one mesh builder of `xlgen train` and
    `xlgen plan`.

    Several slices (`mesh.num_slices`, or `num_slices` given: `xlgen plan --num_slices`): the `data` axis is laid
    over the slices (DCN: data parallelism across slices, the only traffic between them is the gradient reduction)
    and within each slice over its devices (ICI), `fsdp` and `tensor` stay inside a slice; the logical rules are
    unchanged. A slice is the devices of one `slice_index` (TPU multislice: `mesh_utils.create_hybrid_device_mesh`);
    devices that do not come in `num_slices` slice indices (CPU processes standing in for slices) are split into
    `num_slices` equal groups in (process, id) order, so one process per slice is one group per process."""
    devices = list(devices) if devices is not None else jax.devices()
    get = mesh_config.get if hasattr(mesh_config, "get") else (lambda k, d=None: d)
    n = int(get("num_devices", 0) or 0)
    if n > 0:
        if n > len(devices):
            raise ValueError(f"mesh.num_devices={n} but only {len(devices)} devices are available")
        devices = devices[:n]
    slices = int(num_slices if num_slices is not None else get("num_slices", 1) or 1)
    shape = mesh_shape([mesh_config["data"], mesh_config["fsdp"], mesh_config["tensor"]], len(devices))
    if slices == 1:
        # `jax.make_mesh` splits a physical axis (e.g. 2 x 16 over a v6e 4x8 torus) only on v5e; any axis that divides
        # the slice is a valid mesh on every chip, the unsplit assignment is kept whenever one exists.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices[: int(np.prod(shape))], allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    return Mesh(hybrid_device_grid(shape, slices, devices), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def hybrid_device_grid(shape: Sequence[int], num_slices: int, devices: Sequence) -> np.ndarray:
    """Devices as a (data, fsdp, tensor) grid with `data` = num_slices (DCN) x shape[0] // num_slices (ICI)."""
    if num_slices < 1 or shape[0] % num_slices or len(devices) % num_slices:
        raise ValueError(
            f"mesh.data={shape[0]} must be a multiple of num_slices={num_slices} (data parallelism spans slices "
            f"over DCN; fsdp and tensor stay inside a slice; {len(devices)} devices)"
        )
    ici = (shape[0] // num_slices, shape[1], shape[2])
    if len({getattr(d, "slice_index", None) for d in devices} - {None}) == num_slices:  # TPU multislice
        from jax.experimental import mesh_utils

        return mesh_utils.create_hybrid_device_mesh(ici, (num_slices, 1, 1), devices=devices)
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    per = len(ordered) // num_slices
    return np.concatenate(
        [np.asarray(ordered[i * per : (i + 1) * per], dtype=object).reshape(ici) for i in range(num_slices)]
    )


def tiled_size(shape: Sequence[int]) -> int:
    """Elements of an array in TPU HBM: its two minor dimensions padded to the (8, 128) tiles (float32)."""
    dims = [1, 1] + list(shape)
    dims[-1], dims[-2] = -(-dims[-1] // 128) * 128, -(-dims[-2] // 8) * 8
    return math.prod(dims)


def logical_to_spec(
    logical: Sequence[Optional[str]], shape: Sequence[int], rules: Dict[str, Optional[str]], mesh: Mesh
) -> P:
    """PartitionSpec for one parameter with logical axis names, applying the dedup / divisibility fallbacks.

    The `fsdp` axis only splits a parameter's storage (it is gathered whole for use), so its dimension is free: it
    goes where each device's slice pads least in TPU's tiles (`tiled_size`), the rules' dimension on a tie, never
    the scanned `layers` axis. E.g. a `[160000, 64]` embedding cluster over 64 devices is split into `[2500, 64]`
    rows, not `[160000, 1]` columns padded 128-fold (WikiText-103's adaptive input), and `[mlp, embed]` by its
    rows where `embed` would leave fewer than 128 columns per device. A parameter whose rules' dimension does not
    divide by fsdp takes another that does (a `[68096, 16]` cluster by its rows); one with none stays whole."""
    used, out = set(), []
    fsdp = mesh.shape.get("fsdp", 1)
    wants_fsdp = fsdp > 1 and any(rules.get(name) == "fsdp" for name in logical if name is not None)
    for name, dim in zip(logical, shape):
        axis = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        if axis is None or axis in used or mesh.shape[axis] == 1 or dim % mesh.shape[axis]:
            out.append(None)
        else:
            out.append(axis)
            used.add(axis)
    if wants_fsdp:
        here = out.index("fsdp") if "fsdp" in out else None
        others = [1 if a in (None, "fsdp") else mesh.shape[a] for a in out]

        def tiles(j):  # a device's slice with fsdp on dimension j
            return tiled_size([d // (fsdp if i == j else k) for i, (d, k) in enumerate(zip(shape, others))])

        free = [j for j, (a, name) in enumerate(zip(out, logical)) if a in (None, "fsdp") and name != "layers"]
        dividing = [j for j in free if shape[j] % fsdp == 0]
        if dividing:
            best = min(dividing, key=lambda j: (tiles(j), j != here))
            if here is not None:
                out[here] = None
            out[best] = "fsdp"
    return P(*out)


def rules_for(preset: str) -> Dict[str, Optional[str]]:
    if preset not in RULE_PRESETS:
        raise ValueError(f"mesh.rules={preset!r}: unknown preset; choose one of {sorted(RULE_PRESETS)}")
    return RULE_PRESETS[preset]


@contextlib.contextmanager
def activation_rules(preset: Union[str, Dict[str, object], None]):
    """Within this context (at trace time), `constrain` maps logical activation names with `preset`'s rules."""
    token = _ACTIVE_RULES.set(rules_for(preset) if isinstance(preset, str) else preset)
    try:
        yield
    finally:
        _ACTIVE_RULES.reset(token)


def activation_spec(logical: Sequence[Optional[str]], shape: Sequence[int], rules: Dict[str, object], mesh) -> P:
    """PartitionSpec of an activation with logical names: each name's mesh axes (one or a tuple), keeping only axes
    of this mesh with size > 1 not used by an earlier dimension, dropping trailing axes until the dimension divides;
    `None` = replicated dimension, `UNCONSTRAINED` = left to the partitioner."""
    used, out = set(), []
    for name, dim in zip(logical, shape):
        if name is None:
            out.append(None)
            continue
        if name == UNCONSTRAINED:
            out.append(P.UNCONSTRAINED)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        axes = rules[name]
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        axes = [a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1 and a not in used]
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return P(*out)


def constrain(x: jax.Array, logical: Sequence[Optional[str]]) -> jax.Array:
    """`x` constrained to the sharding its logical axis names get under the active rules (`activation_rules`, else
    the batch-only `dp` mapping); a no-op outside a mesh. E.g. the residual stream of a layer:
    `constrain(h, ("activation_batch", "activation_length", "activation_embed"))`."""
    if len(logical) != x.ndim:
        raise ValueError(f"logical axes {tuple(logical)} do not match the shape {tuple(x.shape)}")
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, activation_spec(logical, x.shape, active_rules(), mesh))


def active_rules() -> Dict[str, object]:
    """The logical-to-mesh rules in effect (`activation_rules`), else the data-parallel preset."""
    return _ACTIVE_RULES.get() or RULE_PRESETS["dp"]


def take_rows(
    table: jax.Array, ids: jax.Array, dtype=None, table_logical: Sequence[str] = ("vocab", "embed")
) -> jax.Array:
    """table[ids] `[*ids.shape, d]` in `dtype` (default the table's) for a table `[V, d]` stored under
    `table_logical` and ids split over the batch.

    Where the active rules store the table's rows split over `fsdp` (and nothing else) and the ids' leading axis is
    split over the batch axes ending in `fsdp`, the lookup is vocabulary-parallel, as Megatron's embedding: each
    device looks up, for all of its fsdp group's ids, the rows it holds (zeros for the others), and the group sums
    these into each device's own ids (`psum_scatter`; one device holds each row, so the sum is exact). Its gradient
    is the group's cotangent rows gathered and scattered into each device's own rows, where the gathered-table
    lookup's is a table-sized buffer on every device before its reduce-scatter; so it is taken where the group has
    fewer ids than the table has rows (WikiText-103's 160K- and 68K-row clusters at 24,576 ids per group, not its
    20K-row ones). Elsewhere (one device, other shardings, more ids) `jnp.take`."""
    dtype = table.dtype if dtype is None else dtype
    mesh = jax.sharding.get_abstract_mesh()
    fsdp = 1 if mesh.empty else mesh.shape.get("fsdp", 1)
    if fsdp == 1 or mesh.manual_axes:
        return jnp.take(table, ids, axis=0).astype(dtype)
    rules = active_rules()
    table_spec = logical_to_spec(table_logical, table.shape, rules, mesh)
    ids_spec = activation_spec(("activation_batch",) + (None,) * (ids.ndim - 1), ids.shape, rules, mesh)
    batch = ids_spec[0] if isinstance(ids_spec[0], tuple) else (ids_spec[0],)
    group_ids = ids.size * fsdp // math.prod(mesh.shape[a] for a in batch if a is not None)
    if tuple(table_spec) != ("fsdp",) + (None,) * (table.ndim - 1) or batch[-1] != "fsdp" or group_ids >= len(table):
        return jnp.take(table, ids, axis=0).astype(dtype)
    rows = table.shape[0] // fsdp

    def lookup(block, own_ids):
        group_ids = jax.lax.all_gather(own_ids, "fsdp", axis=0, tiled=True)
        local = group_ids - jax.lax.axis_index("fsdp") * rows
        held = ((local >= 0) & (local < rows))[..., None]
        found = jnp.take(block, jnp.clip(local, 0, rows - 1), axis=0).astype(dtype)
        found = jnp.where(held, found, jnp.zeros((), dtype))  # summed in `dtype`: one term is not zero
        return jax.lax.psum_scatter(found, "fsdp", scatter_dimension=0, tiled=True)

    out_spec = P(*ids_spec, *([None] * (table.ndim - 1)))
    return jax.shard_map(lookup, mesh=mesh, in_specs=(table_spec, ids_spec), out_specs=out_spec)(table, ids)


def per_shard(fn, in_logical: Sequence, out_logical: Sequence[Optional[str]], check_vma: bool = True):
    """`fn` run by every device on its own block of the arguments (`jax.shard_map`), the blocks given by logical
    names under the active rules; a plain call outside a mesh (or on a one-device mesh).

    `in_logical` has one entry per positional argument: a tuple of logical names for an array, or None for an
    argument (any pytree, e.g. weights) that every device gets whole, gathered before the call. `out_logical`
    names the (single array) output's axes; its sizes are taken from the first argument's leading axes. For
    token-wise computations whose data-dependent control flow (sorting tokens by cluster, per-chunk `switch`)
    the partitioner cannot split: each device then works on its own tokens, as a data-parallel worker does.
    `check_vma=False` for Pallas kernels run through their interpreter (`tpu_attention.per_device` says why)."""

    def call(*args):
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty or all(n == 1 for n in mesh.shape.values()):
            return fn(*args)
        rules = active_rules()
        in_specs = tuple(
            P() if names is None else activation_spec(names, a.shape, rules, mesh) for names, a in zip(in_logical, args)
        )
        out_spec = activation_spec(out_logical, args[0].shape[: len(out_logical)], rules, mesh)
        split = tuple(
            a
            for spec in in_specs
            for entry in spec
            if entry is not None
            for a in (entry if isinstance(entry, tuple) else (entry,))
        )

        def body(*blocks):
            # whole arguments enter as varying over the split axes here, once: the transpose (their gradient's sum
            # over devices) then happens once per call, not per iteration of a loop inside `fn`
            if split:
                blocks = [
                    jax.tree.map(lambda w: jax.lax.pcast(w, split, to="varying"), b) if names is None else b
                    for names, b in zip(in_logical, blocks)
                ]
            return fn(*blocks)

        return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=check_vma)(*args)

    return call


def batch_partition_spec(ndim: int) -> P:
    """Batch-major arrays: split dim 0 over the data-parallel axes, replicate the rest."""
    return P(BATCH_AXES, *([None] * (ndim - 1)))


def mems_spec() -> P:
    """Memory [n_layer, batch, mem_len, d_model]: rows follow the batch."""
    return P(None, BATCH_AXES, None, None)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    return NamedSharding(mesh, batch_partition_spec(ndim))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def addressable_batch_rows(mesh: Mesh, global_batch: int) -> Tuple[int, int]:
    """The contiguous [start, stop) batch rows this process's devices hold under `batch_partition_spec` (checks contiguity)."""
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


def opt_state_shardings(abstract_opt, param_shardings, param_shapes, mesh: Mesh):
    """Each optimizer-state leaf that mirrors a parameter (same dict key, same shape) takes its sharding; a leaf
    shaped like its parameter with one dimension dropped (Adafactor's factored row / column moments: `v_row`
    drops the larger of the two largest dimensions, `v_col` the other, optax's rule) takes the parameter's spec
    without that dimension; the rest (counts, scalars) is replicated."""
    rep = replicated(mesh)

    def dropped_dim(path, shape, leaf_shape):
        fields = {getattr(p, "name", None) for p in path}
        which = -1 if "v_row" in fields else -2 if "v_col" in fields else 0
        if not which or len(leaf_shape) != len(shape) - 1:
            return None
        # optax's `_factored_dims` on the whole parameter, or on each layer of a stack (state batched on axis 0)
        for offset, dims in ((0, shape), (1, shape[1:])):
            if len(dims) >= 2 and (offset == 0 or leaf_shape[0] == shape[0]):
                d = offset + int(np.argsort(dims, kind="stable")[which])
                if tuple(np.delete(shape, d)) == leaf_shape:
                    return d
        return None

    def pick(path, leaf):
        for p in reversed(path):
            k = getattr(p, "key", None)
            if not (isinstance(k, str) and k in param_shardings):
                continue
            shape, leaf_shape = tuple(param_shapes[k]), tuple(leaf.shape)
            if leaf_shape == shape:
                return param_shardings[k]
            # a scanned stack's per-layer state is batched on axis 0 (`xlgen.train.optim.per_layer_slices`)
            d = dropped_dim(path, shape, leaf_shape)
            if d is not None:
                spec = list(param_shardings[k].spec) + [None] * (len(shape) - len(param_shardings[k].spec))
                del spec[d]
                return NamedSharding(mesh, P(*spec))
        return rep

    return jax.tree_util.tree_map_with_path(pick, abstract_opt)
