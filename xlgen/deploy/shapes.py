"""The input shapes a deployed function is traced with, shared by both export formats: batch and length as
`jax.export` dimension variables where the function allows (`symbolic_args`)."""

from typing import Callable, Optional, Sequence

import numpy as np

SYMBOLIC = ("batch", "length")

MIN_LENGTHS = (1, 2, 4, 8, 16, 32, 64)


def _symbolic(served_, symbolic: Sequence[str], min_length: int):
    """`jax.ShapeDtypeStruct`s of the inputs with the axes `symbolic` as `jax.export` dimension variables (length
    >= min_length; length^2 >= length lets the decision procedure order the quadratic sizes of a flattened
    relative shift)."""
    import jax
    from jax import export

    syms = {}
    if symbolic:
        constraints = [f"length >= {min_length}", "length^2 >= length"] if "length" in symbolic else []
        syms = dict(zip(symbolic, export.symbolic_shape(", ".join(symbolic), constraints=constraints)))
    sizes = {**served_.trained, **syms}
    return [jax.ShapeDtypeStruct(s.concrete(sizes), np.dtype(s.dtype)) for s in served_.inputs], syms


def symbolic_args(served_, trace: Optional[Callable] = None):
    """The most symbolic input shapes `served_.fn` traces with: batch and length symbolic with the smallest
    `MIN_LENGTHS` entry whose constraint decides every comparison of sizes (set as `served_.min_length`), else batch
    symbolic and the trained length, else the trained shapes. `trace(args)` is the tracing (default
    `jax.make_jaxpr`). Returns (args, {axis: "symbolic" | size}, trace's result)."""
    import jax

    trace = trace or (lambda args: jax.make_jaxpr(served_.fn)(*args))
    errors = []
    choices = [(SYMBOLIC, m) for m in MIN_LENGTHS] + [(("batch",), 1), ((), 1)]
    for symbolic, min_length in choices:
        args, syms = _symbolic(served_, symbolic, min_length)
        try:
            result = trace(args)
        except Exception as e:  # shape polymorphism refused: a longer minimum, or fix the axis
            errors.append(f"{'/'.join(symbolic) or 'fixed'}>={min_length}: {type(e).__name__}")
            continue
        served_.min_length = min_length if "length" in syms else served_.trained["length"]
        axes = {a: ("symbolic" if a in syms else served_.trained[a]) for a in SYMBOLIC}
        return args, axes, result
    raise ValueError(f"tracing failed for every shape choice: {'; '.join(errors)}")  # pragma: no cover
