"""Parameters of an NNX module as a flat {path: NumPy array} dict (the Hugging Face writers' input)."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np


def flat_params(module, sep: str = ".", scanned: Tuple[str, ...] = ()) -> Dict[str, np.ndarray]:
    """{path joined by `sep`: float32 array} of the module's nnx.Params. Paths under a prefix in `scanned`
    (e.g. "layers" of a scanned stack, leading axis = layer) are unstacked to `prefix{sep}{i}{sep}rest`."""
    from flax import nnx

    out = {}
    for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        name = sep.join(str(p) for p in path)
        value = np.asarray(var.get_value() if hasattr(var, "get_value") else var.value, np.float32)
        prefix = next((s for s in scanned if name.startswith(s + sep)), None)
        if prefix is None:
            out[name] = value
        else:
            rest = name[len(prefix) + len(sep) :]
            for i in range(value.shape[0]):
                out[f"{prefix}{sep}{i}{sep}{rest}"] = value[i]
    return out
