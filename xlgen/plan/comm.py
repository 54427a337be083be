"""Communication of a compiled, SPMD-partitioned step: collectives read from its HLO text, and the FSDP ideal.

`collectives(hlo_text, num_devices)` parses `compiled.as_text()` (the per-device program after partitioning and
optimisation) and lists every all-gather, reduce-scatter, all-reduce, all-to-all and collective-permute (sync or
async `-start` form) with the bytes ONE device sends/receives for it per step. A collective inside a `while` loop
(scanned layers, gradient accumulation) counts once per trip: the trip count is the loop's `known_trip_count` or
the constant its condition compares the induction variable against (`i < N`).

Bytes per device follow the ring algorithm on a group of g devices (the usual bandwidth-optimal schedules):

    all-gather        out · (g-1)/g          (out = gathered result)
    reduce-scatter    out · (g-1)            (= in · (g-1)/g, in = g · out)
    all-reduce        2 · buf · (g-1)/g      (reduce-scatter + all-gather)
    all-to-all        buf · (g-1)/g
    collective-permute  buf

`ideal_fsdp_bytes(...)` is the same quantity for what a textbook FSDP step of the config needs, computed from the
parameters' shapes and shardings: every fsdp-sharded parameter all-gathered for the forward, again for the backward
and once more for the rematerialised forward (remat on), its gradient reduce-scatter over `fsdp` and the all-reduce
of that shard over `data`; parameters not sharded over `fsdp` all-reduce their gradient over data × fsdp. Gathers
and reduce-scatters repeat per gradient-accumulation micro-batch; the `data` all-reduce happens once. Parameters
and gradients are float32 (the trainer keeps master weights in float32), so an implementation that gathers
bfloat16 copies can come in under the ideal.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY_RE = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_RE = re.compile(r"^\s+(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_CALLS_RE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CONST_RE = re.compile(r"^\s+(?:ROOT\s+)?%([\w.\-]+)\s*=\s*[su](?:32|64)\[\]\S*\s+constant\((-?\d+)\)")
_COMPARE_RE = re.compile(r"compare\(%([\w.\-]+),\s*%([\w.\-]+)\),\s*direction=(LT|LE|GT|GE)")


def _split_type(rest: str) -> Tuple[str, str]:
    """'(bf16[2]{0}, f32[]) all-reduce(%a), ...' -> (type text, 'all-reduce(%a), ...')."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].lstrip()
    head, _, tail = rest.partition(" ")
    return head, tail.lstrip()


def _arrays(type_text: str) -> List[Tuple[str, Tuple[int, ...]]]:
    out = []
    for dt, dims in _ARRAY_RE.findall(type_text):
        if dt in _DTYPE_BYTES or dt.startswith("f8"):
            out.append((dt, tuple(int(d) for d in dims.split(",") if d)))
    return out


def _nbytes(arr: Tuple[str, Tuple[int, ...]]) -> float:
    dt, shape = arr
    return math.prod(shape) * _DTYPE_BYTES.get(dt, 1)


def _group_size(attrs: str, num_devices: int) -> int:
    """Devices per replica group: mesh[...] {axes} form, explicit {{0,1},{2,3}} groups, or iota [G,S]<=[N]."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", attrs)
    if m:
        sizes = {k.strip("'\" "): int(v) for k, v in re.findall(r"([^,=]+)=(\d+)", m[1])}
        names = [a.strip("'\" ") for a in m[2].split(",") if a.strip()]
        return math.prod(sizes.get(a, 1) for a in names) if names else num_devices
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)
    if m:
        return int(m[1].split(",")[-1])
    m = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
    if m:
        return len([x for x in m[1].split(",") if x.strip()])
    return num_devices  # replica_groups={} : all devices


@dataclasses.dataclass
class Collective:
    kind: str  # one of KINDS
    name: str  # HLO instruction name
    computation: str
    group: int  # devices per group
    buffer_bytes: float  # the collective's result buffer on one device (all-gather: gathered; RS: scattered)
    largest_elements: int  # elements of its largest array operand/result (to spot activation-sized transfers)
    bytes_per_device: float = 0.0  # ring-model bytes one device moves, per execution
    trips: int = 1  # executions per step (product of the enclosing loops' trip counts)
    in_loop: bool = False
    op_name: str = ""  # jax op_name metadata (where in the program it comes from)


def _ring_bytes(kind: str, buf: float, g: int) -> float:
    if g <= 1:
        return 0.0 if kind != "collective-permute" else buf
    if kind == "all-gather":
        return buf * (g - 1) / g
    if kind == "reduce-scatter":
        return buf * (g - 1)
    if kind == "all-reduce":
        return 2.0 * buf * (g - 1) / g
    if kind == "all-to-all":
        return buf * (g - 1) / g
    return buf


def _users(lines: Sequence[str]) -> Dict[str, List[Tuple[str, str]]]:
    """{operand: [(user, its opcode)]} of a computation's instruction `lines`."""
    users: Dict[str, List[Tuple[str, str]]] = {}
    for line in lines:
        m = _INSTR_RE.match(line)
        if m:
            _, after = _split_type(m[2])
            op = after.split("(", 1)[0].strip()
            for operand in re.findall(r"%([\w.\-]+)", after.split(")", 1)[0]):
                users.setdefault(operand, []).append((m[1], op))
    return users


def _only_sliced(lines: Sequence[str], name: str, users: Optional[Dict[str, List[Tuple[str, str]]]] = None) -> bool:
    """Whether every use of instruction `name` in a computation's `lines` (through get-tuple-elements) is a
    dynamic-slice, and it has one. `users`: `_users(lines)` when the caller has it."""
    users = _users(lines) if users is None else users
    pending, seen = [name], 0
    while pending:
        for user, op in users.get(pending.pop(), []):
            if op == "get-tuple-element":
                pending.append(user)
            elif op == "dynamic-slice":
                seen += 1
            else:
                return False
    return seen > 0


def _parse(hlo_text: str):
    """{computation: [instruction lines]}, entry name."""
    comps: Dict[str, List[str]] = {}
    entry, cur = None, None
    for line in hlo_text.splitlines():
        if cur is None:
            m = _HEADER_RE.match(line)
            if m:
                cur = m[2]
                comps[cur] = []
                if m[1]:
                    entry = cur
            continue
        if line.startswith("}"):
            cur = None
            continue
        comps[cur].append(line)
    return comps, entry


def _trip_count(while_line: str, comps: Dict[str, List[str]], cond: str) -> Optional[int]:
    m = _TRIP_RE.search(while_line)
    if m:
        return int(m[1])
    lines = comps.get(cond, [])
    consts = {}
    for line in lines:
        c = _CONST_RE.match(line)
        if c:
            consts[c[1]] = int(c[2])
    for line in lines:
        if "ROOT" not in line:
            continue
        c = _COMPARE_RE.search(line)
        if not c:
            continue
        a, b, direction = c[1], c[2], c[3]
        if b in consts and direction in ("LT", "LE"):
            return consts[b] + (direction == "LE")
        if a in consts and direction in ("GT", "GE"):
            return consts[a] + (direction == "GE")
    return None


def collectives(hlo_text: str, num_devices: int) -> Dict[str, Any]:
    """Collectives of a compiled, partitioned HLO module (see module docstring). Returns

    {"by_kind": {kind: {"count": executions per step, "bytes": bytes per device per step}},
     "bytes_per_device": total, "list": [Collective, ...] (one per HLO instruction, with trips),
     "unknown_trip_counts": number of while loops whose trip count could not be read (counted once)}
    """
    comps, entry = _parse(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    unknown = [0]
    memo: Dict[str, List[Tuple[Collective, int, bool]]] = {}
    users: Dict[str, Dict[str, List[Tuple[str, str]]]] = {}

    def users_of(comp: str) -> Dict[str, List[Tuple[str, str]]]:
        """`_users` of a computation, built once."""
        if comp not in users:
            users[comp] = _users(comps.get(comp, []))
        return users[comp]

    def visit(comp: str, stack: Tuple[str, ...] = ()) -> List[Tuple[Collective, int, bool]]:
        """[(collective, executions per execution of comp, inside a loop of comp's callees)]"""
        if comp in memo:
            return memo[comp]
        if comp in stack:  # recursion does not occur in HLO; guard anyway
            return []
        out: List[Tuple[Collective, int, bool]] = []
        for line in comps.get(comp, []):
            m = _INSTR_RE.match(line)
            if not m:
                continue
            name, rest = m[1], m[2]
            type_text, after = _split_type(rest)
            op = after.split("(", 1)[0].strip()
            base = op.removesuffix("-start")
            if base in KINDS and not op.endswith("-done"):
                arrays = _arrays(type_text)
                if op.endswith("-start") and arrays:
                    # async forms return (operand(s), result(s)[, context]): the result is the gathered (largest)
                    # buffer for all-gather, the operand for the others
                    if base == "all-gather":
                        buf = max(_nbytes(a) for a in arrays)
                    elif base == "all-reduce":
                        buf = sum(_nbytes(a) for a in arrays)
                    else:
                        buf = _nbytes(arrays[0])
                else:
                    buf = sum(_nbytes(a) for a in arrays)
                g = 1 if base == "collective-permute" else _group_size(after, num_devices)
                if base == "all-reduce" and g > 1 and _only_sliced(comps.get(comp, []), name, users_of(comp)):
                    # XLA:TPU's all-reduce-scatter fusion (an all-reduce whose result each device only slices its
                    # own part of) runs as a reduce-scatter: each device receives its part, of buf / g
                    base, buf = "reduce-scatter", buf / g
                opn = re.search(r'op_name="([^"]*)"', after)
                col = Collective(
                    kind=base,
                    name=name,
                    computation=comp,
                    group=g,
                    buffer_bytes=buf,
                    largest_elements=max((math.prod(s) for _, s in arrays), default=0),
                    op_name=opn[1] if opn else "",
                )
                col.bytes_per_device = _ring_bytes(base, buf, g)
                out.append((col, 1, False))
                continue
            calls = _CALLS_RE.findall(after)
            if not calls and "branch_computations" not in after:
                continue
            if op == "while":
                called = dict(calls)
                trips = _trip_count(after, comps, called.get("condition", ""))
                if trips is None:
                    unknown[0] += 1
                    trips = 1
                for col, mult, _ in visit(called["body"], stack + (comp,)):
                    out.append((col, mult * trips, True))
                continue
            targets = [c for k, c in calls if k != "to_apply" or op in ("call", "async-start")]
            b = _BRANCHES_RE.search(after)
            if b:
                targets += [t.strip().lstrip("%") for t in b[1].split(",") if t.strip()]
            for t in targets:
                out.extend(visit(t, stack + (comp,)))
        memo[comp] = out
        return out

    found = visit(entry)
    by_kind = {k: {"count": 0, "bytes": 0.0} for k in KINDS}
    listed: List[Collective] = []
    for col, mult, in_loop in found:
        c = dataclasses.replace(col, trips=mult, in_loop=in_loop)
        listed.append(c)
        by_kind[c.kind]["count"] += mult
        by_kind[c.kind]["bytes"] += c.bytes_per_device * mult
    total = sum(v["bytes"] for v in by_kind.values())
    return {"by_kind": by_kind, "bytes_per_device": total, "list": listed, "unknown_trip_counts": unknown[0]}


def ideal_fsdp_bytes(
    param_shapes: Dict[str, Sequence[int]],
    param_specs: Dict[str, Any],
    mesh_shape: Dict[str, int],
    *,
    remat: bool,
    grad_accum_steps: int = 1,
    param_bytes: int = 4,
) -> Dict[str, float]:
    """Bytes per device per step of a textbook FSDP step (module docstring), split by part.

    param_specs: {name: PartitionSpec} of the parameters (as the trainer shards them); a parameter is sharded over
    `fsdp` when that mesh axis appears in its spec; `tensor`-sharded dimensions stay sharded (no gather).
    """
    data, fsdp, tensor = (int(mesh_shape.get(a, 1)) for a in ("data", "fsdp", "tensor"))
    gathers = 3 if remat else 2
    accum = max(1, int(grad_accum_steps))
    out = {"param_all_gather": 0.0, "grad_reduce_scatter": 0.0, "grad_all_reduce": 0.0}
    for name, shape in param_shapes.items():
        spec = tuple(param_specs[name]) if name in param_specs else ()
        axes = set()
        for entry in spec:
            if entry is None:
                continue
            axes.update(entry if isinstance(entry, tuple) else (entry,))
        full = math.prod(shape) * param_bytes
        local = full / (tensor if "tensor" in axes else 1)  # what one device holds after gathering fsdp
        if "fsdp" in axes and fsdp > 1:
            out["param_all_gather"] += accum * gathers * local * (fsdp - 1) / fsdp
            out["grad_reduce_scatter"] += accum * local * (fsdp - 1) / fsdp
            if data > 1:
                out["grad_all_reduce"] += 2.0 * (local / fsdp) * (data - 1) / data
        else:
            g = data * fsdp
            if g > 1:
                out["grad_all_reduce"] += 2.0 * local * (g - 1) / g
    out["total"] = sum(out.values())
    return out


def summary(found: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """JSON-ready `collectives` field: per kind, executions per step and bytes per device per step."""
    return {k: {"count": int(v["count"]), "bytes": float(v["bytes"])} for k, v in found["by_kind"].items()}


def top(found: Dict[str, Any], n: int = 10) -> List[Dict[str, Any]]:
    """The n collectives moving the most bytes per step (for the report's JSON), largest first."""
    cols = sorted(found["list"], key=lambda c: -c.bytes_per_device * c.trips)[:n]
    return [
        {
            "kind": c.kind,
            "bytes": c.bytes_per_device * c.trips,
            "trips": c.trips,
            "group": c.group,
            "buffer_bytes": c.buffer_bytes,
            "in_loop": c.in_loop,
            "op_name": c.op_name[-160:],
        }
        for c in cols
    ]


if __name__ == "__main__":  # python -m xlgen.plan.comm HLO.txt NUM_DEVICES: print the collectives of a dumped HLO
    import sys

    res = collectives(open(sys.argv[1]).read(), int(sys.argv[2]))
    print(json.dumps({"collectives": summary(res), "bytes_per_device": res["bytes_per_device"]}, indent=2))
    for row in top(res, 25):
        print(row)
