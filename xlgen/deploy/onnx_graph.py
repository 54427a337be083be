"""`xlgen export --to-onnx`: the deployed function (`xlgen.deploy.Served.fn`, the one `--to-stablehlo` exports)
as an ONNX graph, translated from its jaxpr one primitive at a time.

The function is traced with the batch and length axes symbolic (`xlgen.deploy.symbolic_args`: `jax.export`
shape polymorphism, length >= `Served.min_length`); every shape the jaxpr derives from them is a polynomial of the
two (`2*length - 1`, `floordiv(length + 1, 2)`, ...), which the graph computes from its inputs' `Shape` (`_Dims`).
Each primitive becomes the ONNX operators with its semantics (opset `OPSET`): `dot_general` -> `Einsum`,
`broadcast_in_dim` -> `Unsqueeze` + `Expand`, `gather` (one indexed axis) -> `Gather` / `GatherND` / `Slice`,
`select_n` -> `Where`, `iota` -> `Range`, reductions -> `Reduce*`, ...; `jit`, `custom_jvp_call`,
`custom_vjp_call` and `checkpoint` bodies are inlined; sharding annotations, `stop_gradient`,
`optimization_barrier` are identities. The weights are initializers. No other framework is involved.

Before anything is written, onnxruntime runs the graph at `CHECK_SIZES` (a batch size and length the trace never
saw as numbers) and its outputs must equal xlgen's within `TOLERANCE`.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

TOLERANCE = 1e-4
OPSET = 18
CHECK_SIZES = {"batch": 5, "length": 10}  # the export check's shapes (length >= min_length + 3)


class Unsupported(ValueError):
    """A primitive (or a form of it) the translator has no rule for."""


# ----------------------------------------------------------------------------------------------------------------
# The graph under construction
# ----------------------------------------------------------------------------------------------------------------


class _Graph:
    def __init__(self):
        import onnx

        self.onnx = onnx
        self.nodes: List[Any] = []
        self.initializers: List[Any] = []
        self._ids = itertools.count()
        self._consts: Dict[Tuple, str] = {}
        self._by_id: Dict[int, Tuple[str, Any]] = {}

    def name(self, hint: str = "t") -> str:
        return f"{hint}_{next(self._ids)}"

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> Any:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(self.onnx.helper.make_node(op, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.name("const")
        self.initializers.append(self.onnx.numpy_helper.from_array(arr.copy(order="C"), name))
        if key is not None:
            self._consts[key] = name
        return name

    def const_of(self, array) -> str:
        """An initializer for a jaxpr constant (the weights), one per array however often a body is inlined."""
        key = id(array)
        if key not in self._by_id:
            self._by_id[key] = (self.const(np.asarray(array)), array)
        return self._by_id[key][0]

    def i64(self, values) -> str:
        return self.const(np.asarray(values, np.int64).reshape(-1))


class _Dims:
    """Symbolic dimensions (`jax.export` `_DimExpr`) as int64 `[1]` tensors computed from the inputs' shapes."""

    def __init__(self, g: _Graph, sources: Dict[str, Tuple[str, int]]):
        self.g = g
        self.sources = sources  # dimension variable -> (graph input, axis)
        self._cache: Dict[str, str] = {}

    def __call__(self, d) -> str:
        if isinstance(d, (int, np.integer)):
            return self.g.i64([int(d)])
        key = str(d)
        if key not in self._cache:
            self._cache[key] = self._expr(d)
        return self._cache[key]

    def shape(self, dims) -> str:
        """A shape as an int64 `[rank]` tensor."""
        dims = list(dims)
        if all(isinstance(d, (int, np.integer)) for d in dims):
            return self.g.i64(dims)
        if not dims:
            return self.g.i64([])
        return self.g.node("Concat", [self(d) for d in dims], axis=0)

    def _expr(self, e) -> str:
        g = self.g
        total = None
        for term, coeff in e._sorted_terms:
            value = None
            for factor, power in term._factors:
                f = self._factor(factor)
                for _ in range(power):
                    value = f if value is None else g.node("Mul", [value, f])
            value = g.i64([1]) if value is None else value
            if coeff != 1:
                value = g.node("Mul", [value, g.i64([coeff])])
            total = value if total is None else g.node("Add", [total, value])
        return total if total is not None else g.i64([0])

    def _factor(self, f) -> str:
        g = self.g
        if f.var is not None:
            if f.var not in self.sources:
                raise Unsupported(f"dimension variable {f.var!r} is not an axis of any input")
            inp, axis = self.sources[f.var]
            return g.node("Shape", [inp], start=axis, end=axis + 1)
        a, b = (self(o) for o in f.operands)
        if f.operation == "floordiv":  # Python semantics: a - mod(a, b) is a multiple of b
            return g.node("Div", [g.node("Sub", [a, g.node("Mod", [a, b], fmod=0)]), b])
        if f.operation == "mod":
            return g.node("Mod", [a, b], fmod=0)
        if f.operation == "max":
            return g.node("Max", [a, b])
        if f.operation == "min":
            return g.node("Min", [a, b])
        raise Unsupported(f"dimension operation {f.operation!r}")  # pragma: no cover


def _is_const(d) -> bool:
    return isinstance(d, (int, np.integer))


# ----------------------------------------------------------------------------------------------------------------
# jaxpr -> ONNX
# ----------------------------------------------------------------------------------------------------------------


class _Translator:
    def __init__(self, g: _Graph, dims: _Dims):
        self.g, self.dims = g, dims

    def run(self, jaxpr, consts: Sequence[Any], args: Sequence[str]) -> List[str]:
        from jax.extend import core as jcore

        env: Dict[Any, str] = {}

        def read(v) -> str:
            if isinstance(v, jcore.Literal):
                return self.g.const(np.asarray(v.val, dtype=v.aval.dtype))
            return env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = self.g.const_of(c)
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def eqn(self, eqn, x: List[str]) -> List[str]:
        name = eqn.primitive.name
        sub = _sub_jaxpr(eqn)
        if sub is not None:
            jaxpr, consts = sub
            return self.run(jaxpr, consts, x)
        rule = getattr(self, "p_" + name, None)
        if rule is None:
            if name in _UNARY:
                return [self.g.node(_UNARY[name], x)]
            if name in _BINARY:
                return [self.g.node(_BINARY[name], x)]
            if name in _IDENTITY:
                return [self.g.node("Identity", [a]) for a in x]
            raise Unsupported(f"no ONNX rule for the JAX primitive {name!r}")
        out = rule(eqn, x)
        return out if isinstance(out, list) else [out]

    # -- helpers --------------------------------------------------------------------------------------------------

    def cast(self, x: str, dtype) -> str:
        return self.g.node("Cast", [x], to=_onnx_dtype(dtype))

    def out_aval(self, eqn, i: int = 0):
        return eqn.outvars[i].aval

    # -- elementwise ----------------------------------------------------------------------------------------------

    def p_rsqrt(self, eqn, x):
        return self.g.node("Reciprocal", [self.g.node("Sqrt", x)])

    def p_square(self, eqn, x):
        return self.g.node("Mul", [x[0], x[0]])

    def p_erfc(self, eqn, x):
        one = self.g.const(np.ones((), eqn.invars[0].aval.dtype))
        return self.g.node("Sub", [one, self.g.node("Erf", x)])

    def p_log1p(self, eqn, x):
        one = self.g.const(np.ones((), eqn.invars[0].aval.dtype))
        return self.g.node("Log", [self.g.node("Add", [x[0], one])])

    def p_expm1(self, eqn, x):
        one = self.g.const(np.ones((), eqn.invars[0].aval.dtype))
        return self.g.node("Sub", [self.g.node("Exp", x), one])

    def p_integer_pow(self, eqn, x):
        y = int(eqn.params["y"])
        if y == 0:
            return self.g.node("Expand", [self.g.const(np.ones((), eqn.invars[0].aval.dtype)), self.g.node("Shape", x)])
        out = x[0]
        for _ in range(abs(y) - 1):
            out = self.g.node("Mul", [out, x[0]])
        return self.g.node("Reciprocal", [out]) if y < 0 else out

    def p_ne(self, eqn, x):
        return self.g.node("Not", [self.g.node("Equal", x)])

    def _bitwise(self, eqn, x, logical: str, bitwise: str):
        return self.g.node(logical if eqn.invars[0].aval.dtype == np.bool_ else bitwise, x)

    def p_and(self, eqn, x):
        return self._bitwise(eqn, x, "And", "BitwiseAnd")

    def p_or(self, eqn, x):
        return self._bitwise(eqn, x, "Or", "BitwiseOr")

    def p_xor(self, eqn, x):
        return self._bitwise(eqn, x, "Xor", "BitwiseXor")

    def p_not(self, eqn, x):
        return self._bitwise(eqn, x, "Not", "BitwiseNot")

    def p_rem(self, eqn, x):  # C semantics (the sign of the dividend), as ONNX Mod with fmod=1
        return self.g.node("Mod", x, fmod=1)

    def p_clamp(self, eqn, x):
        lo, a, hi = x
        return self.g.node("Max", [self.g.node("Min", [a, hi]), lo])

    def p_is_finite(self, eqn, x):
        bad = self.g.node("Or", [self.g.node("IsInf", x), self.g.node("IsNaN", x)])
        return self.g.node("Not", [bad])

    def p_exp2(self, eqn, x):
        return self.g.node("Pow", [self.g.const(np.asarray(2, eqn.invars[0].aval.dtype)), x[0]])

    def p_sign(self, eqn, x):
        return self.g.node("Sign", x)

    def p_convert_element_type(self, eqn, x):
        return self.cast(x[0], eqn.params["new_dtype"])

    def p_select_n(self, eqn, x):
        pred, cases = x[0], x[1:]
        if eqn.invars[0].aval.dtype == np.bool_:
            return self.g.node("Where", [pred, cases[1], cases[0]])
        out = cases[0]
        for i, c in enumerate(cases[1:], 1):
            is_i = self.g.node("Equal", [pred, self.g.const(np.asarray(i, eqn.invars[0].aval.dtype))])
            out = self.g.node("Where", [is_i, c, out])
        return out

    def p_dim_as_value(self, eqn, x):
        scalar = self.g.node("Reshape", [self.dims(eqn.params["dim"]), self.g.i64([])])
        return self.cast(scalar, self.out_aval(eqn).dtype)

    # -- shapes ---------------------------------------------------------------------------------------------------

    def p_broadcast_in_dim(self, eqn, x):
        shape, bdims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
        a = x[0]
        new_axes = [i for i in range(len(shape)) if i not in bdims]
        if new_axes:
            a = self.g.node("Unsqueeze", [a, self.g.i64(new_axes)])
        if tuple(eqn.invars[0].aval.shape) == tuple(shape[i] for i in bdims) and not new_axes:
            return self.g.node("Identity", [a])
        return self.g.node("Expand", [a, self.dims.shape(shape)])

    def p_reshape(self, eqn, x):
        if eqn.params.get("dimensions"):
            raise Unsupported("reshape with dimensions")
        return self.g.node("Reshape", [x[0], self.dims.shape(eqn.params["new_sizes"])])

    def p_squeeze(self, eqn, x):
        return self.g.node("Squeeze", [x[0], self.g.i64(eqn.params["dimensions"])])

    def p_transpose(self, eqn, x):
        return self.g.node("Transpose", x, perm=list(eqn.params["permutation"]))

    def p_concatenate(self, eqn, x):
        return self.g.node("Concat", x, axis=int(eqn.params["dimension"]))

    def p_stack(self, eqn, x):
        axis = self.g.i64([int(eqn.params["axis"])])
        return self.g.node("Concat", [self.g.node("Unsqueeze", [a, axis]) for a in x], axis=int(eqn.params["axis"]))

    def p_unstack(self, eqn, x):
        axis = int(eqn.params["axis"])
        n = len(eqn.outvars)
        parts = self.g.node("Split", [x[0], self.g.i64([1] * n)], n_out=n, axis=axis) if n > 1 else [x[0]]
        parts = [parts] if isinstance(parts, str) else parts
        return [self.g.node("Squeeze", [p, self.g.i64([axis])]) for p in parts]

    def p_rev(self, eqn, x):
        axes = list(eqn.params["dimensions"])
        if not axes:
            return self.g.node("Identity", x)
        n = len(axes)
        big = np.iinfo(np.int64).min
        return self.g.node(
            "Slice", [x[0], self.g.i64([-1] * n), self.g.i64([big] * n), self.g.i64(axes), self.g.i64([-1] * n)]
        )

    def p_slice(self, eqn, x):
        start, limit = eqn.params["start_indices"], eqn.params["limit_indices"]
        strides = eqn.params["strides"] or (1,) * len(start)
        axes = list(range(len(start)))
        return self.g.node(
            "Slice", [x[0], self.dims.shape(start), self.dims.shape(limit), self.g.i64(axes), self.g.i64(strides)]
        )

    def _index_i64(self, x: str) -> str:
        return self.g.node("Reshape", [self.cast(x, np.int64), self.g.i64([1])])

    def p_dynamic_slice(self, eqn, x):
        operand, starts = x[0], x[1:]
        sizes = eqn.params["slice_sizes"]
        shape = eqn.invars[0].aval.shape
        begin = []
        for s, size, dim in zip(starts, sizes, shape):  # XLA clamps the start to [0, dim - size]
            hi = self.g.node("Sub", [self.dims(dim), self.dims(size)])
            begin.append(self.g.node("Max", [self.g.node("Min", [self._index_i64(s), hi]), self.g.i64([0])]))
        begin_t = self.g.node("Concat", begin, axis=0)
        end_t = self.g.node("Add", [begin_t, self.dims.shape(sizes)])
        return self.g.node("Slice", [operand, begin_t, end_t, self.g.i64(list(range(len(shape))))])

    def p_dynamic_update_slice(self, eqn, x):
        operand, update, starts = x[0], x[1], x[2:]
        shape, ushape = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        if len(shape) == 0:
            return self.g.node("Identity", [update])
        # indices of every update element: ScatterND over a grid of positions (clamped start + offset)
        grids = []
        for axis, (s, dim, size) in enumerate(zip(starts, shape, ushape)):
            hi = self.g.node("Sub", [self.dims(dim), self.dims(size)])
            begin = self.g.node("Max", [self.g.node("Min", [self._index_i64(s), hi]), self.g.i64([0])])
            r = self.g.node("Range", [self._scalar(0), self._scalar_of(self.dims(size)), self._scalar(1)])
            r = self.g.node("Add", [r, begin])
            view = [1] * len(ushape)
            view[axis] = -1
            r = self.g.node("Reshape", [r, self.g.i64(view)])
            grids.append(self.g.node("Expand", [r, self.dims.shape(ushape)]))
        idx = self.g.node("Concat", [self.g.node("Unsqueeze", [gr, self.g.i64([-1])]) for gr in grids], axis=-1)
        return self.g.node("ScatterND", [operand, idx, update])

    def _scalar(self, v: int) -> str:
        return self.g.const(np.asarray(v, np.int64))

    def _scalar_of(self, t1: str) -> str:
        return self.g.node("Reshape", [t1, self.g.i64([])])

    def p_pad(self, eqn, x):
        operand, value = x
        config = eqn.params["padding_config"]
        if any(not _is_const(i) or i != 0 for _, _, i in config):
            raise Unsupported("pad with interior padding")
        lo = [p for p, _, _ in config]
        hi = [p for _, p, _ in config]
        nonneg = lambda p: (not _is_const(p)) or p >= 0
        if not all(nonneg(p) for p in lo + hi):  # negative padding: crop first, then pad the rest
            shape = eqn.invars[0].aval.shape
            starts = [(-p if _is_const(p) and p < 0 else 0) for p in lo]
            ends = [(d + p if _is_const(p) and p < 0 else d) for d, p in zip(shape, hi)]
            operand = self.g.node(
                "Slice", [operand, self.dims.shape(starts), self.dims.shape(ends), self.g.i64(list(range(len(shape))))]
            )
            lo = [0 if _is_const(p) and p < 0 else p for p in lo]
            hi = [0 if _is_const(p) and p < 0 else p for p in hi]
        if all(_is_const(p) and p == 0 for p in lo + hi):
            return self.g.node("Identity", [operand])
        return self.g.node("Pad", [operand, self.dims.shape(lo + hi), value], mode="constant")

    def p_iota(self, eqn, x):
        shape, dim = eqn.params["shape"], eqn.params["dimension"]
        dtype = eqn.params["dtype"]
        n = self._scalar_of(self.dims(shape[dim]))
        r = self.g.node("Range", [self._scalar(0), n, self._scalar(1)])
        r = self.cast(r, dtype)
        view = [1] * len(shape)
        view[dim] = -1
        if len(shape) == 1:
            return r
        r = self.g.node("Reshape", [r, self.g.i64(view)])
        return self.g.node("Expand", [r, self.dims.shape(shape)])

    def p_split(self, eqn, x):
        sizes, axis = eqn.params["sizes"], eqn.params["axis"]
        return (
            list(self.g.node("Split", [x[0], self.dims.shape(sizes)], n_out=len(sizes), axis=int(axis)))
            if len(sizes) > 1
            else [self.g.node("Identity", x)]
        )

    def p_scan(self, eqn, x):
        """A scan (e.g. over stacked layers) unrolled: its length is static."""
        body = eqn.params["jaxpr"]
        n_consts, n_carry, length = eqn.params["num_consts"], eqn.params["num_carry"], eqn.params["length"]
        consts, carry, xs = x[:n_consts], x[n_consts : n_consts + n_carry], x[n_consts + n_carry :]
        ys_steps = []
        steps = range(length - 1, -1, -1) if eqn.params.get("reverse") else range(length)
        for i in steps:
            xs_i = [self.g.node("Gather", [a, self.g.const(np.asarray(i, np.int64))], axis=0) for a in xs]
            outs = self.run(body.jaxpr, body.consts, list(consts) + list(carry) + xs_i)
            carry, ys = outs[:n_carry], outs[n_carry:]
            ys_steps.append(ys)
        if eqn.params.get("reverse"):
            ys_steps = ys_steps[::-1]
        stacked = []
        for k in range(len(eqn.outvars) - n_carry):
            parts = [self.g.node("Unsqueeze", [step[k], self.g.i64([0])]) for step in ys_steps]
            stacked.append(self.g.node("Concat", parts, axis=0))
        return list(carry) + stacked

    # -- reductions -----------------------------------------------------------------------------------------------

    def _reduce(self, eqn, x, op: str):
        axes = list(eqn.params["axes"])
        if not axes:
            return self.g.node("Identity", x)
        dtype = eqn.invars[0].aval.dtype
        a = x[0]
        if dtype == np.bool_:
            a = self.cast(a, np.int32)
        out = self.g.node(op, [a, self.g.i64(axes)], keepdims=0)
        return self.cast(out, np.bool_) if dtype == np.bool_ else out

    def p_reduce_sum(self, eqn, x):
        return self._reduce(eqn, x, "ReduceSum")

    def p_reduce_max(self, eqn, x):
        return self._reduce(eqn, x, "ReduceMax")

    def p_reduce_min(self, eqn, x):
        return self._reduce(eqn, x, "ReduceMin")

    def p_reduce_prod(self, eqn, x):
        return self._reduce(eqn, x, "ReduceProd")

    def p_reduce_or(self, eqn, x):
        return self._reduce(eqn, x, "ReduceMax")

    def p_reduce_and(self, eqn, x):
        return self._reduce(eqn, x, "ReduceMin")

    def _arg(self, eqn, x, op):
        (axis,) = eqn.params["axes"]
        out = self.g.node(op, x, axis=int(axis), keepdims=0, select_last_index=0)
        return self.cast(out, eqn.params["index_dtype"])

    def p_argmax(self, eqn, x):
        return self._arg(eqn, x, "ArgMax")

    def p_argmin(self, eqn, x):
        return self._arg(eqn, x, "ArgMin")

    def p_cumsum(self, eqn, x):
        axis = self.g.const(np.asarray(eqn.params["axis"], np.int64))
        return self.g.node("CumSum", [x[0], axis], reverse=int(bool(eqn.params.get("reverse", False))))

    def p_top_k(self, eqn, x):
        k = eqn.params["k"]
        axis = int(eqn.params.get("axis", -1))
        values, index = self.g.node("TopK", [x[0], self.dims(k)], n_out=2, axis=axis, largest=1, sorted=1)
        return [values, self.cast(index, self.out_aval(eqn, 1).dtype)]

    # -- contraction and indexing ---------------------------------------------------------------------------------

    def p_dot_general(self, eqn, x):
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        ln, rn = eqn.invars[0].aval.ndim, eqn.invars[1].aval.ndim
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        lhs = [None] * ln
        rhs = [None] * rn
        for i, j in zip(lb, rb):
            lhs[i] = rhs[j] = next(letters)
        for i, j in zip(lc, rc):
            lhs[i] = rhs[j] = next(letters)
        for i in range(ln):
            lhs[i] = lhs[i] or next(letters)
        for j in range(rn):
            rhs[j] = rhs[j] or next(letters)
        out = [lhs[i] for i in lb]
        out += [lhs[i] for i in range(ln) if i not in lb and i not in lc]
        out += [rhs[j] for j in range(rn) if j not in rb and j not in rc]
        a, b = x
        out_dtype = self.out_aval(eqn).dtype
        if eqn.invars[0].aval.dtype != out_dtype:
            a = self.cast(a, out_dtype)
        if eqn.invars[1].aval.dtype != out_dtype:
            b = self.cast(b, out_dtype)
        return self.g.node("Einsum", [a, b], equation=f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}")

    def p_gather(self, eqn, x):
        """XLA gathers with one indexed operand axis (jnp indexing, take, take_along_axis, slices of symbolic
        bounds): `Gather` (a collapsed axis), `GatherND` (with batching axes) or a `Slice` (a window)."""
        operand, indices = x
        dn = eqn.params["dimension_numbers"]
        sizes = eqn.params["slice_sizes"]
        op_aval, idx_aval = eqn.invars[0].aval, eqn.invars[1].aval
        out_aval = self.out_aval(eqn)
        if len(dn.start_index_map) != 1 or idx_aval.shape[-1] != 1:
            raise Unsupported(f"gather over several axes {dn}")
        (k,) = dn.start_index_map
        obatch, ibatch = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
        nb = len(obatch)
        if obatch != tuple(range(nb)) or ibatch != tuple(range(nb)):
            raise Unsupported(f"gather with batching axes {dn}")
        full = [d for d in range(op_aval.ndim) if d != k and d not in obatch]
        for d in full:
            if not (sizes[d] is op_aval.shape[d] or sizes[d] == op_aval.shape[d]):
                raise Unsupported(f"gather with a partial window on axis {d}")
        idx = self.cast(indices, np.int64)
        if k in dn.collapsed_slice_dims:
            idx = self.g.node("Squeeze", [idx, self.g.i64([-1])])  # [batch..., rest...]
            if nb == 0:
                # Gather: operand[:k] + idx.shape + operand[k+1:]; XLA: offset dims (operand[:k], operand[k+1:]
                # minus collapsed) at `offset_dims`, index dims in order elsewhere
                dim = self._scalar_of(self.dims(op_aval.shape[k]))
                negative = self.g.node("Less", [idx, self._scalar(0)])
                idx = self.g.node("Where", [negative, self.g.node("Add", [idx, dim]), idx])
                out = self.g.node("Gather", [operand, idx], axis=int(k))
                idx_rank = idx_aval.ndim - 1
                natural = ["o%d" % d for d in range(k)] + ["i%d" % i for i in range(idx_rank)]
                natural += ["o%d" % d for d in range(k + 1, op_aval.ndim)]
            else:
                out = self.g.node(
                    "GatherND", [operand, self.g.node("Unsqueeze", [idx, self.g.i64([-1])])], batch_dims=nb
                )
                idx_rank = idx_aval.ndim - 1
                natural = ["o%d" % d for d in range(nb)] + ["i%d" % i for i in range(nb, idx_rank)]
                if k != nb:
                    raise Unsupported(f"gather with batching axes before a later indexed axis {dn}")
                natural += ["o%d" % d for d in range(k + 1, op_aval.ndim)]
            # XLA's layout: offset dims at `offset_dims` (operand order), batch dims of the indices elsewhere
            offset_names = [
                "o%d" % d for d in range(op_aval.ndim) if d not in dn.collapsed_slice_dims and d not in obatch
            ]
            batch_names = [n for n in natural if n.startswith("i") or n in ["o%d" % d for d in obatch]]
            target, oi, bi = [], iter(offset_names), iter(batch_names)
            for pos in range(out_aval.ndim):
                target.append(next(oi) if pos in dn.offset_dims else next(bi))
            perm = [natural.index(n) for n in target]
            return out if perm == list(range(len(perm))) else self.g.node("Transpose", [out], perm=perm)
        if nb or idx_aval.ndim != 1:
            raise Unsupported(f"gather of windows at several starts {dn}")
        # one window: operand[..., start:start + size, ...] with XLA's clamp of the start
        start = self.g.node("Reshape", [idx, self.g.i64([1])])
        hi = self.g.node("Sub", [self.dims(op_aval.shape[k]), self.dims(sizes[k])])
        start = self.g.node("Max", [self.g.node("Min", [start, hi]), self.g.i64([0])])
        end = self.g.node("Add", [start, self.dims(sizes[k])])
        return self.g.node("Slice", [operand, start, end, self.g.i64([k])])


_UNARY = {
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "tanh": "Tanh",
    "sqrt": "Sqrt",
    "abs": "Abs",
    "floor": "Floor",
    "ceil": "Ceil",
    "erf": "Erf",
    "logistic": "Sigmoid",
    "is_nan": "IsNaN",
}
_BINARY = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "max": "Max",
    "min": "Min",
    "pow": "Pow",
    "eq": "Equal",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
    "atan2": "Atan2",
}
_IDENTITY = {
    "copy",
    "copy_p",
    "stop_gradient",
    "optimization_barrier",
    "sharding_constraint",
    "mesh_cast",
    "reduce_precision",
    "name",
    "pvary",
}


_CALLS = {
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "checkpoint",
    "remat",
    "remat2",
}


def _sub_jaxpr(eqn):
    """(jaxpr, consts) of a call-like equation (`_CALLS`) whose body is inlined, or None."""
    from jax.extend import core as jcore

    if eqn.primitive.name not in _CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if isinstance(j, jcore.ClosedJaxpr):
            return j.jaxpr, j.consts
        if isinstance(j, jcore.Jaxpr):
            return j, []
    return None


def _onnx_dtype(dtype) -> int:
    import onnx

    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


# ----------------------------------------------------------------------------------------------------------------
# The export
# ----------------------------------------------------------------------------------------------------------------


def output_names(served_) -> List[str]:
    """The graph's output names: the function's, with "new_" before a name that is also an input's (the memory
    a language model returns: `new_mems`, `new_mem_valid`; ONNX names every value once)."""
    inputs = {s.name for s in served_.inputs}
    return [f"new_{n}" if n in inputs else n for n in served_.outputs]


def _dim_name(d) -> Any:
    return int(d) if _is_const(d) else str(d)


def translate(served_) -> Tuple[bytes, Dict[str, Any]]:
    """(model.onnx bytes, the symbolic axes `{"batch": "symbolic", "length": "symbolic" | size}`) of `served_.fn`."""
    import onnx

    from xlgen import deploy

    args, axes, closed = deploy.symbolic_args(served_)
    g = _Graph()
    sources: Dict[str, Tuple[str, int]] = {}
    graph_inputs = []
    for spec, a in zip(served_.inputs, args):
        for axis, d in enumerate(a.shape):
            if not _is_const(d) and str(d) not in sources:
                sources[str(d)] = (spec.name, axis)
        graph_inputs.append(
            onnx.helper.make_tensor_value_info(spec.name, _onnx_dtype(a.dtype), [_dim_name(d) for d in a.shape])
        )
    dims = _Dims(g, sources)
    outs = _Translator(g, dims).run(closed.jaxpr, closed.consts, [s.name for s in served_.inputs])
    graph_outputs = []
    for name, o, aval in zip(output_names(served_), outs, closed.out_avals):
        g.nodes.append(onnx.helper.make_node("Identity", [o], [name]))
        graph_outputs.append(
            onnx.helper.make_tensor_value_info(name, _onnx_dtype(aval.dtype), [_dim_name(d) for d in aval.shape])
        )
    graph = onnx.helper.make_graph(
        g.nodes, f"xlgen_{served_.family}_{served_.kind}", graph_inputs, graph_outputs, g.initializers
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="xlgen")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=False)
    return model.SerializeToString(), axes


def export_onnx(served_, verify: bool = True) -> Tuple[bytes, Dict[str, Any], List[Tuple[list, str]]]:
    """(model.onnx bytes, {axis: "symbolic" | size}, [(output shape, dtype)]); with `verify`, ValueError when
    onnxruntime's outputs differ from xlgen's at `check_sizes` (then nothing is written)."""
    try:
        payload, axes = translate(served_)
    except Unsupported as e:
        raise ValueError(f"--to-onnx: the {served_.family} {served_.kind} function: {e}") from None
    if verify:
        check(served_, payload, axes)
    return payload, axes, output_shapes(payload)


def check_sizes(axes: Dict[str, Any], min_length: int = 1) -> Dict[str, int]:
    length = max(CHECK_SIZES["length"], min_length + 3) if axes.get("length") == "symbolic" else axes["length"]
    return {"batch": CHECK_SIZES["batch"], "length": length}


def check(served_, payload: bytes, axes: Dict[str, Any]) -> None:
    """Run the graph with onnxruntime at `check_sizes` against xlgen's function (`Served.fn` under `jax.jit`)."""
    import jax
    import onnxruntime as ort

    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    sizes = check_sizes(axes, served_.min_length)
    arrays = served_.example(sizes, seed=1)
    got = session.run(None, {s.name: a for s, a in zip(served_.inputs, arrays)})
    want = [np.asarray(x) for x in jax.jit(served_.fn)(*arrays)]
    for name, gv, w in zip(output_names(served_), got, want):
        if gv.shape != w.shape:
            err = np.inf
        elif name.endswith("_index") or w.dtype.kind in "iub":
            err = 0.0 if np.array_equal(gv, w) else np.inf
        else:
            err = float(np.max(np.abs(gv.astype(np.float64) - w))) if w.size else 0.0
        if not err <= TOLERANCE:
            raise ValueError(
                f"--to-onnx: the {served_.family} {served_.kind} graph differs from xlgen in {name!r} by {err:.2g} "
                f"at batch {sizes['batch']}, length {sizes['length']}: not written"
            )


def output_shapes(payload: bytes) -> List[Tuple[list, str]]:
    """The graph outputs' shapes (symbolic axes by name) and dtypes."""
    import onnx

    outputs = onnx.load_from_string(payload).graph.output
    return [([d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim], _elem_dtype(o)) for o in outputs]


def _elem_dtype(value_info) -> str:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)).name
