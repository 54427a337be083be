"""The memory-traffic roofline of a compiled (optimized, partitioned) HLO module: per device, per step.

Every instruction the device executes is one kernel: a fusion, a dot/convolution, a copy, a custom call, ... For
each, read from the module's text (`compiled.as_text()`):

    FLOPs   2 · (output elements) · (contracted elements) of every dot and convolution it computes (inside a fusion:
            of its fused computation; contracted: of a convolution, the kernel's input features times the window
            taps that land on input elements, one per batch dimension of the batched dots XLA:TPU writes as
            convolutions over a dilated input); element-wise work is not counted (it runs on the vector units, and
            on TPU it is bound by the bytes it moves, which are counted)
    bytes   what it reads from and writes to HBM: its operands and results, each array at its physical size (the
            layout's tiles pad the minor dimensions, e.g. bf16[8, 64]{1,0:T(8,128)(2,1)} holds 8 × 128 elements;
            arrays placed in on-chip memory, layout memory space S(n) with n > 0, move no HBM bytes). Three in-place
            forms move only the part touched: a fused operand read only through (dynamic-)slices costs the slices
            (a scanned layer's weights read from the stacked [L, ...] array; also where the slice sits in a fusion
            nested in the fusion, as XLA:TPU fuses `ws[i]` into the layer's matmul), a dynamic-update-slice
            into an operand writes only the update (a scanned layer's outputs written into the stacked array), and
            a scatter into an operand reads and writes only the rows it updates (an embedding's gradient).
            A Pallas TPU kernel (a `tpu_custom_call`) counts the matmul FLOPs and the bytes it declares
            (`pl.CostEstimate`: the kernel's contents are not HLO; the bytes of every block its pipeline copies,
            e.g. an input re-read per head), at least its operands and results.
            XLA:TPU's `AllocateBuffer` custom call (a scan's stacked outputs before the loop fills them) is an
            uninitialised allocation: no traffic
    trips   executions per step: the product of the trip counts of the `while` loops around it (`scan` over layers,
            gradient accumulation; the loop's `known_trip_count`, else the constant its condition compares with,
            as in `xlgen.plan.comm`); a `conditional` counts its costliest branch

    time = trips · max(FLOPs / peak FLOP/s, bytes / HBM bytes/s)        (one device's chip figures,
                                                                         `xlgen.plan.topology.Chip`)

summed over the module (`analyse`). Collectives are not in this sum, nor the fusions XLA:TPU builds around them (an
all-reduce whose result each device slices its part of: a reduce-scatter): they are the communication of `xlgen.plan.comm`,
added on top as before (overlapped: max; not: sum). Nothing here models overlap between kernels, the vector units'
own throughput or kernel launch overhead: a lower bound on the step time that, unlike FLOPs at peak, sees the
memory-bound work.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from xlgen.plan import comm

# instructions that update their first operand in place (XLA's buffer assignment gives the result the operand's
# buffer, copying it first where it lives on): opcode -> the operand index of the update
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}

# instructions that move no HBM bytes of their own (aliases, tuples, scalars of bookkeeping, the `-done` halves of
# async pairs whose `-start` carries the traffic)
_FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "optimization-barrier",
    "after-all",
    "partition-id",
    "replica-id",
    "add-dependency",
    "domain",
    "copy-done",
    "async-done",
    "async-update",
    "send-done",
    "recv-done",
}
_SLICES = {"dynamic-slice", "slice", "gather"}
# XLA:TPU's uninitialised buffer (a scan's stacked outputs before the loop writes them): an allocation, no traffic
_ALLOCATE = 'custom_call_target="AllocateBuffer"'
# a Mosaic (Pallas TPU) kernel's `pl.CostEstimate`, in its custom call's backend config: the matmul FLOPs and the
# HBM bytes its pipeline moves, as the kernel declares them
_KERNEL_COST_RE = re.compile(
    r'"cost_estimate":\s*\{"flops":\s*"?(\d+)"?,\s*"transcendentals":\s*"?\d+"?,\s*"bytes_accessed":\s*"?(\d+)'
)
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([^}]*)\})?")
_TILE_RE = re.compile(r"T\(([0-9,]+)\)")
_SPACE_RE = re.compile(r"S\((\d+)\)")
_OPNAME_RE = re.compile(r'op_name="([^"]*)"')
_SOURCE_RE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_KIND_RE = re.compile(r"\bkind=(k\w+)")


@dataclasses.dataclass
class Op:
    """One executed instruction: FLOPs and HBM bytes per execution, executions per step."""

    name: str
    opcode: str  # HLO opcode; fusions as fusion:kLoop / fusion:kOutput / ...
    flops: float
    bytes: float
    trips: int = 1
    op_name: str = ""  # jax op_name metadata: where in the model it comes from
    source: str = ""  # source_file:source_line of that op

    def time(self, peak: float, bandwidth: float) -> float:
        return self.trips * max(self.flops / peak, self.bytes / bandwidth)

    def bound(self, peak: float, bandwidth: float) -> str:
        return "compute" if self.flops / peak >= self.bytes / bandwidth else "memory"


# ------------------------------------------------------------------------------------------------ shapes and bytes


def array_bytes(dtype: str, dims: Tuple[int, ...], layout: Optional[str]) -> float:
    """HBM bytes of one array: its dimensions padded to the layout's first tile, 0 when it lives in a memory space
    other than HBM (S(n), n > 0)."""
    if dtype not in comm._DTYPE_BYTES and not dtype.startswith("f8"):
        return 0.0  # token[], opaque
    dims = list(dims)
    if layout:
        space = _SPACE_RE.search(layout)
        if space and int(space[1]) != 0:
            return 0.0
        minor_to_major = [int(d) for d in layout.split(":", 1)[0].split(",") if d.strip().lstrip("-").isdigit()]
        tile = _TILE_RE.search(layout)
        if tile and len(minor_to_major) == len(dims):
            sizes = [int(t) for t in tile[1].split(",")]
            for i, t in enumerate(reversed(sizes)):  # the tile's last dimension is the most minor one
                if i < len(dims):
                    d = minor_to_major[i]
                    dims[d] = -(-dims[d] // t) * t
    return math.prod(dims) * comm._DTYPE_BYTES.get(dtype, 1)


def type_bytes(type_text: str) -> float:
    """HBM bytes of every array in an HLO type (an array or a tuple of arrays)."""
    return sum(array_bytes(dt, _dims(d), lay) for dt, d, lay in _ARRAY_RE.findall(type_text))


def _dims(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _shape(type_text: str) -> Tuple[int, ...]:
    m = _ARRAY_RE.search(type_text)
    return _dims(m[2]) if m else ()


# ------------------------------------------------------------------------------------------------ the module


@dataclasses.dataclass
class _Instr:
    name: str
    type_text: str
    opcode: str
    operands: List[str]
    attrs: str
    args: str = ""  # the text between the opcode's parentheses (a parameter's index)
    root: bool = False


def _operand_text(after: str) -> Tuple[str, str]:
    """'fusion(a, b), kind=kLoop' -> ('a, b', 'kind=kLoop'): the balanced parenthesis after the opcode."""
    start = after.find("(")
    if start < 0:
        return "", after
    depth = 0
    for i in range(start, len(after)):
        depth += after[i] == "("
        depth -= after[i] == ")"
        if depth == 0:
            return after[start + 1 : i], after[i + 1 :].lstrip(", ")
    return after[start + 1 :], ""


def parse_module(hlo_text: str, lines=None) -> Tuple[Dict[str, List[_Instr]], str]:
    """{computation: [instructions]}, the entry computation's name. `lines`: `comm._parse(hlo_text)` when the caller
    has it already."""
    lines, entry = comm._parse(hlo_text) if lines is None else lines
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    comps: Dict[str, List[_Instr]] = {}
    for comp, body in lines.items():
        out = comps[comp] = []
        for line in body:
            m = comm._INSTR_RE.match(line)
            if not m:
                continue
            type_text, after = comm._split_type(m[2])
            opcode = after.split("(", 1)[0].strip()
            operands, attrs = _operand_text(after)
            names = re.findall(r"%([\w.\-]+)", operands)
            out.append(_Instr(m[1], type_text, opcode, names, attrs, operands, line.lstrip().startswith("ROOT")))
    return comps, entry


def _matmul_flops(ins: _Instr, types: Dict[str, str]) -> float:
    """2 · out · contracted of a dot or convolution, else 0."""
    out = math.prod(_shape(ins.type_text))
    if ins.opcode == "dot":
        lhs = _shape(types.get(ins.operands[0], ""))
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
        contracted = math.prod(lhs[d] for d in _dims(m[1])) if m and lhs else 1
        return 2.0 * out * contracted
    if ins.opcode == "convolution":
        return 2.0 * _convolution_macs(ins, types)
    return 0.0


def _window(attrs: str, n: int) -> Dict[str, List[Tuple[int, ...]]]:
    """A convolution's `window={size=2x16 stride=1x15 pad=0_0x15_15 lhs_dilate=2x16 ...}`: stride, pad and the
    dilations, one tuple of integers per spatial dimension (`pad`: (low, high)); absent fields are 1 (`pad` 0, 0)."""
    w = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(f.split("=", 1) for f in w[1].split()) if w else {}
    out = {k: [(1,)] * n for k in ("stride", "lhs_dilate", "rhs_dilate")}
    out["pad"] = [(0, 0)] * n
    for k, v in fields.items():
        if k in out:
            out[k] = [tuple(int(x) for x in d.split("_")) for d in v.split("x")]
    return out


def _convolution_macs(ins: _Instr, types: Dict[str, str]) -> float:
    """Multiply-adds of a convolution: (output elements over its batch and feature dimensions) × (the kernel's input
    features) × per spatial dimension the (output position, window tap) pairs whose tap lands on an input element
    (not on padding, nor between the elements of a dilated input). Exact for any window; XLA:TPU writes batched
    dots as convolutions whose batch dimensions are windows over a dilated input (one tap per output position) and
    their gradients as padded, reversed windows."""
    m = re.search(r"dim_labels=([^_]+)_([^-]+)->(\w+)", ins.attrs)
    lhs, rhs = (_shape(types.get(name, "")) for name in ins.operands[:2])
    out = _shape(ins.type_text)
    if not (m and len(m[1]) == len(lhs) and len(m[2]) == len(rhs) and len(m[3]) == len(out)):
        return 0.0
    spatial = sorted(int(c) for c in m[2] if c.isdigit())
    w = _window(ins.attrs, len(spatial))
    macs = float(rhs[m[2].index("i")]) * math.prod(d for label, d in zip(m[3], out) if not label.isdigit())
    for k in spatial:
        size, n_in, n_out = rhs[m[2].index(str(k))], lhs[m[1].index(str(k))], out[m[3].index(str(k))]
        (stride,), (lhs_dil,), (rhs_dil,), (pad_low, _) = (
            w[f][k] for f in ("stride", "lhs_dilate", "rhs_dilate", "pad")
        )
        at = np.arange(n_out)[:, None] * stride + np.arange(size)[None, :] * rhs_dil - pad_low  # in the dilated input
        macs *= int(np.count_nonzero((at >= 0) & (at <= (n_in - 1) * lhs_dil) & (at % lhs_dil == 0)))
    return macs


_FRAME_RE = re.compile(r"^(\d+)\s+\{file_location_id=(\d+)\s+parent_frame_id=(\d+)\}")
_LOCATION_RE = re.compile(r"^(\d+)\s+\{file_name_id=(\d+)\s+function_name_id=\d+\s+line=(\d+)")
_NAME_RE = re.compile(r'^(\d+)\s+"(.*)"$')
_FRAME_ID_RE = re.compile(r"stack_frame_id=(\d+)")


def stack_frames(hlo_text: str) -> Dict[int, List[str]]:
    """{stack_frame_id: ["file:line", ... innermost first]} from the module's FileNames / FileLocations / StackFrames
    tables (how newer XLA prints source locations). A frame's printed `parent_frame_id` is its parent's id + 1
    (1 = no parent)."""
    section, files, locations, frames = "", {}, {}, {}
    for line in hlo_text.splitlines():
        if line.startswith("%") or line.startswith("ENTRY"):
            break
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        if section == "FileNames" and (m := _NAME_RE.match(line)):
            files[int(m[1])] = m[2]
        elif section == "FileLocations" and (m := _LOCATION_RE.match(line)):
            locations[int(m[1])] = (int(m[2]), int(m[3]))
        elif section == "StackFrames" and (m := _FRAME_RE.match(line)):
            frames[int(m[1])] = (int(m[2]), int(m[3]) - 1)
    out: Dict[int, List[str]] = {}
    for fid in frames:
        chain, seen, cur = [], set(), fid
        while cur in frames and cur not in seen:
            seen.add(cur)
            loc, parent = frames[cur]
            if loc in locations:
                file_id, line_no = locations[loc]
                chain.append(f"{_short_path(files.get(file_id, '?'))}:{line_no}")
            cur = parent
        out[fid] = chain
    return out


def _model_source(chain: List[str]) -> str:
    """The innermost frame in xlgen's own code (the model line an op comes from), else the innermost frame."""
    return next((c for c in chain if c.startswith("xlgen/")), chain[0] if chain else "")


class _Module:
    """A parsed module (`parse`): walked for its executed instructions (`walk`) as often as needed."""

    def __init__(self, hlo_text: str, peak: float = 1.0, bandwidth: float = 1.0):
        self.peak, self.bandwidth = peak, bandwidth  # to pick a conditional's costliest branch
        self.raw, entry = comm._parse(hlo_text)
        self.comps, self.entry = parse_module(hlo_text, (self.raw, entry))
        # per computation: {instruction name: its type} (names are looked up where they are defined)
        self.types = {c: {i.name: i.type_text for i in body} for c, body in self.comps.items()}
        self.frames = stack_frames(hlo_text)
        # whether the chip figures matter to the walk: they pick a conditional's costliest branch
        self.has_conditional = any(i.opcode == "conditional" for body in self.comps.values() for i in body)
        self.unknown_trip_counts = 0
        self._flops_memo: Dict[str, float] = {}

    def walk(self, peak: float = 1.0, bandwidth: float = 1.0) -> Tuple[List[Op], int]:
        """(every executed instruction with its trips, number of while loops of unknown trip count) for one
        device's `peak` FLOP/s and HBM `bandwidth` (they choose a conditional's costliest branch)."""
        self.peak, self.bandwidth = peak, bandwidth
        self.unknown_trip_counts = 0
        ops = self.ops(self.entry)
        return ops, self.unknown_trip_counts

    # FLOPs of a fused (or called) computation, nested fusions included
    def computation_flops(self, comp: str) -> float:
        if comp not in self._flops_memo:
            total = 0.0
            for ins in self.comps.get(comp, []):
                total += _matmul_flops(ins, self.types.get(comp, {}))
                for _, called in comm._CALLS_RE.findall(ins.attrs):
                    if ins.opcode == "fusion":
                        total += self.computation_flops(called)
            self._flops_memo[comp] = total
        return self._flops_memo[comp]

    def _params(self, comp: str) -> Dict[int, str]:
        return {
            int(f.args): f.name
            for f in self.comps.get(comp, [])
            if f.opcode == "parameter" and f.args.strip().isdigit()
        }

    def _collective(self, comp: str) -> bool:
        """Whether fused computation `comp` (or one nested in it) runs a collective."""
        memo = self.__dict__.setdefault("_collective_memo", {})
        if comp not in memo:
            memo[comp] = False  # (a computation does not call itself)
            for f in self.comps.get(comp, []):
                nested = dict(comm._CALLS_RE.findall(f.attrs)).get("calls") if f.opcode == "fusion" else None
                if f.opcode.removesuffix("-start") in comm.KINDS or (nested and self._collective(nested)):
                    memo[comp] = True
                    break
        return memo[comp]

    def _updated_in_place(self, ins: _Instr, local: Dict[str, _Instr], comp: str) -> Optional[Tuple[str, float, str]]:
        """(the operand `ins` updates in place, the update's bytes, the updating opcode) when `ins` is a
        dynamic-update-slice or scatter, or a fusion whose root is one into its own parameter (XLA:TPU nests a
        scatter in a fusion of its own); else None."""
        if ins.opcode in _IN_PLACE and len(ins.operands) > _IN_PLACE[ins.opcode]:
            size = lambda name: type_bytes(local[name].type_text if name in local else "")
            touched = min(size(ins.operands[_IN_PLACE[ins.opcode]]), size(ins.operands[0]))  # at most the operand
            return ins.operands[0], touched, ins.opcode
        nested = dict(comm._CALLS_RE.findall(ins.attrs)).get("calls") if ins.opcode == "fusion" else None
        body = self.comps.get(nested, []) if nested else []
        root = next((f for f in body if f.root), None)
        found = None if root is None else self._updated_in_place(root, {f.name: f for f in body}, nested)
        if found is None:
            return None
        index = {name: i for i, name in self._params(nested).items()}.get(found[0])
        return None if index is None or index >= len(ins.operands) else (ins.operands[index],) + found[1:]

    def sliced_read(self, comp: str, name: str) -> Optional[float]:
        """Bytes read of `name` (an instruction of fused computation `comp`) when it is read only through slices, else
        None: looking through bitcasts and into nested fusions (XLA:TPU fuses a layer's `ws[i]` as a fusion of a
        dynamic-slice inside the matmul's fusion)."""
        body = self.comps.get(comp, [])
        readers = [u for u in body if name in u.operands]
        if not readers:
            return None
        total = 0.0
        for u in readers:
            if u.opcode == "bitcast":
                part = self.sliced_read(comp, u.name)
            elif u.opcode in _SLICES and u.operands[0] == name and name not in u.operands[1:]:
                part = type_bytes(u.type_text)
            elif u.opcode == "fusion" and "calls" in (called := dict(comm._CALLS_RE.findall(u.attrs))):
                inner = self._params(called["calls"])
                parts = [
                    self.sliced_read(called["calls"], inner.get(i, "")) for i, o in enumerate(u.operands) if o == name
                ]
                part = None if None in parts else sum(parts)
            else:
                part = None
            if part is None:
                return None
            total += part
        return total

    def fusion_bytes(self, ins: _Instr, outer: Dict[str, str], comp: str) -> float:
        """Operands read + results written by a fusion, with the in-place reads/writes of the module docstring.
        `outer`: the types of the calling computation's instructions."""
        body = self.comps.get(comp, [])
        local = {f.name: f for f in body}
        params = self._params(comp)
        users: Dict[str, List[_Instr]] = {}
        for f in body:
            for o in f.operands:
                users.setdefault(o, []).append(f)

        def uses(name: str) -> List[Tuple[_Instr, str]]:
            """(user, the name it reads) of `name`, looking through bitcasts."""
            out = []
            for u in users.get(name, []):
                out += uses(u.name) if u.opcode == "bitcast" else [(u, name)]
            return out

        def source(name: str) -> str:
            """`name` with the bitcasts that produce it looked through."""
            while name in local and local[name].opcode == "bitcast" and local[name].operands:
                name = local[name].operands[0]
            return name

        root = next((f for f in body if f.root), body[-1] if body else None)
        if root is None:
            return type_bytes(ins.type_text) + sum(type_bytes(outer.get(o, "")) for o in ins.operands)
        outputs = [local[o] for o in root.operands if o in local] if root.opcode == "tuple" else [root]
        in_place, written = {}, 0.0  # operand updated in place -> (the bytes of it read in place, the updater)
        for r in outputs:
            base = local.get(source(r.name), r)
            updated = self._updated_in_place(base, local, comp)
            if updated is not None:
                target, size, opcode = updated
                target = source(target)
                if target in params.values():  # updated in place: only the update is written
                    in_place[target] = (size if opcode == "scatter" else 0.0, base.name)  # a scatter adds to the rows
                    written += size
                    continue
            written += type_bytes(r.type_text)
        read = 0.0
        for i, operand in enumerate(ins.operands):
            full = type_bytes(outer.get(operand, ""))
            p = params.get(i)
            if p is None:
                read += full
                continue
            if p in in_place:
                touched, updater = in_place[p]
                readers = [(u, n) for u, n in uses(p) if not (u.name == updater and u.operands[0] == n)]
                if not readers:
                    read += touched  # written in place, read only where updated
                    continue
                if all(u.opcode in _SLICES and u.operands[0] == n for u, n in readers):
                    read += min(full, sum(type_bytes(u.type_text) for u, _ in readers))
                else:
                    read += full
                continue
            sliced = self.sliced_read(comp, p)
            read += full if sliced is None else min(full, sliced)
        return read + written

    def ops(self, comp: str, trips: int = 1, stack: Tuple[str, ...] = ()) -> List[Op]:
        """The executed instructions of `comp` (and of the computations it runs) with their executions per step."""
        out: List[Op] = []
        for ins in self.comps.get(comp, []):
            op = ins.opcode
            base = op.removesuffix("-start")
            if op in _FREE or base in comm.KINDS or op.endswith("-done") or _ALLOCATE in ins.attrs:
                continue
            called = dict(comm._CALLS_RE.findall(ins.attrs))
            if op == "fusion" and self._collective(called.get("calls", "")):
                continue  # XLA:TPU's collective fusions (e.g. all-reduce-scatter): communication, as their collective
            if op == "while":
                body = called.get("body", "")
                n = comm._trip_count(ins.attrs, self.raw, called.get("condition", ""))
                if n is None:
                    self.unknown_trip_counts += 1
                    n = 1
                if body not in stack:
                    out += self.ops(body, trips * n, stack + (comp,))
                continue
            branches = [c for k, c in called.items() if k in ("true_computation", "false_computation")]
            b = comm._BRANCHES_RE.search(ins.attrs)
            if b:
                branches += [t.strip().lstrip("%") for t in b[1].split(",") if t.strip()]
            if op == "conditional" and branches:
                options = [self.ops(c, trips, stack + (comp,)) for c in branches if c not in stack]
                if options:
                    out += max(options, key=lambda ops: sum(o.time(self.peak, self.bandwidth) for o in ops))
                continue
            if op in ("call", "async-start") and called:
                for c in called.values():
                    if c not in stack:
                        out += self.ops(c, trips, stack + (comp,))
                continue
            out.append(self._op(ins, trips, self.types[comp]))
        return out

    def _op(self, ins: _Instr, trips: int, types: Dict[str, str]) -> Op:
        op = ins.opcode
        called = dict(comm._CALLS_RE.findall(ins.attrs))
        flops = _matmul_flops(ins, types)
        result = type_bytes(ins.type_text)
        if op == "fusion" and "calls" in called:
            flops += self.computation_flops(called["calls"])
            nbytes = self.fusion_bytes(ins, types, called["calls"])
            kind = _KIND_RE.search(ins.attrs)
            op = f"fusion:{kind[1]}" if kind else op
        elif op == "dynamic-slice":
            nbytes = 2.0 * result
        elif op == "custom-call" and _KERNEL_COST_RE.search(ins.attrs):  # a Pallas kernel's declared cost
            declared = _KERNEL_COST_RE.search(ins.attrs)
            flops += float(declared[1])
            nbytes = max(result + sum(type_bytes(types.get(o, "")) for o in ins.operands), float(declared[2]))
        elif op == "dynamic-update-slice":
            nbytes = 2.0 * type_bytes(types.get(ins.operands[1], "")) if len(ins.operands) > 1 else result
        elif op == "scatter" and len(ins.operands) == 3:  # in place: indices and updates read, rows read and written
            nbytes = type_bytes(types.get(ins.operands[1], "")) + 3.0 * type_bytes(types.get(ins.operands[2], ""))
        elif op == "copy-start":  # (destination, source, context): the source is read, the destination written
            arrays = _ARRAY_RE.findall(ins.type_text)
            dest = array_bytes(arrays[0][0], _dims(arrays[0][1]), arrays[0][2]) if arrays else 0.0
            nbytes = dest + sum(type_bytes(types.get(o, "")) for o in ins.operands)
        else:
            nbytes = result + sum(type_bytes(types.get(o, "")) for o in ins.operands)
        opn = _OPNAME_RE.search(ins.attrs)
        src = _SOURCE_RE.search(ins.attrs)
        frame = _FRAME_ID_RE.search(ins.attrs)
        if src:
            source = f"{_short_path(src[1])}:{src[2]}"
        else:
            source = _model_source(self.frames.get(int(frame[1]), [])) if frame else ""
        return Op(
            name=ins.name,
            opcode=op,
            flops=flops,
            bytes=nbytes,
            trips=trips,
            op_name=opn[1] if opn else "",
            source=source,
        )


def _short_path(path: str) -> str:
    """A source file relative to the package root it belongs to (xlgen/..., jax/..., flax/...)."""
    for root in ("xlgen/", "data_pipelines/", "flax/", "optax/", "jax/"):
        i = path.rfind("/" + root)
        if i >= 0:
            return path[i + 1 :]
    return path.rsplit("/", 1)[-1]


def parse(hlo_text: str) -> _Module:
    """The module of `compiled.as_text()`, parsed once for `module_ops` / `analyse`."""
    return _Module(hlo_text)


def module_ops(hlo, peak: float = 1.0, bandwidth: float = 1.0) -> Tuple[List[Op], int]:
    """(every executed instruction of the module with its trips, number of while loops of unknown trip count).
    `hlo`: the module's text or its `parse`."""
    m = hlo if isinstance(hlo, _Module) else _Module(hlo)
    return m.walk(peak, bandwidth)


def analyse(
    hlo, peak_flops: float, hbm_bytes_per_s: float, *, top: int = 12, walked: Optional[Tuple[List[Op], int]] = None
) -> Dict[str, Any]:
    """The roofline of a compiled module on one device (module docstring; `hlo`: its text or its `parse`;
    `walked`: its `module_ops` at these figures when the caller has them): per step

    roofline_time_s   Σ trips · max(FLOPs / peak, bytes / bandwidth)
    compute_time_s    Σ trips · FLOPs / peak (the matmuls at peak: the FLOP-only bound of the same program)
    memory_time_s     Σ trips · bytes / bandwidth
    memory_bound_time_s  the part of roofline_time_s spent in ops whose bytes take longer than their FLOPs
    flops, hbm_bytes  totals; top_ops: the `top` instructions by time; by_source: time per model source line
    """
    ops, unknown = module_ops(hlo, peak_flops, hbm_bytes_per_s) if walked is None else walked
    times = [o.time(peak_flops, hbm_bytes_per_s) for o in ops]
    bound = [o.bound(peak_flops, hbm_bytes_per_s) for o in ops]
    total = sum(times)
    by_source: Dict[str, List[float]] = {}
    for o, t, b in zip(ops, times, bound):
        key = o.source or "(no source)"
        row = by_source.setdefault(key, [0.0, 0.0])
        row[0] += t
        row[1] += t if b == "memory" else 0.0
    order = sorted(range(len(ops)), key=lambda i: -times[i])
    return {
        "roofline_time_s": total,
        "compute_time_s": sum(o.trips * o.flops for o in ops) / peak_flops,
        "memory_time_s": sum(o.trips * o.bytes for o in ops) / hbm_bytes_per_s,
        "memory_bound_time_s": sum(t for t, b in zip(times, bound) if b == "memory"),
        "flops": sum(o.trips * o.flops for o in ops),
        "hbm_bytes": sum(o.trips * o.bytes for o in ops),
        "num_ops": len(ops),
        "unknown_trip_counts": unknown,
        "peak_flops_per_s": peak_flops,
        "hbm_bytes_per_s": hbm_bytes_per_s,
        "top_ops": [
            {
                "name": ops[i].name,
                "op": ops[i].opcode,
                "time_s": times[i],
                "share": times[i] / total if total else 0.0,
                "bound": bound[i],
                "trips": ops[i].trips,
                "flops": ops[i].flops * ops[i].trips,
                "bytes": ops[i].bytes * ops[i].trips,
                "op_name": ops[i].op_name[-200:],
                "source": ops[i].source,
            }
            for i in order[:top]
        ],
        "by_source": [
            {"source": k, "time_s": v[0], "memory_bound_time_s": v[1]}
            for k, v in sorted(by_source.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    }
