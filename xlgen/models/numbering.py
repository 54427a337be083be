"""Numbering parameters into layers, for layer-wise learning-rate decay (`xlgen.train.optim`).

A numbering maps {dotted parameter name: (shape, logical axes)} to ({name: None | int array}, n_layer): None for a
parameter outside the layer stack, else its layer index (an int array that broadcasts along the parameter's
`layers` axis for scanned, stacked layers: slice i is the same layer as the unscanned `layers.<i>`), and
n_layer = 1 + the largest index. Each family registers its numbering (`Family.layer_ids`); this module holds the
pieces they share.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

Meta = Dict[str, Tuple[Tuple[int, ...], Tuple]]
LayerIds = Tuple[Dict[str, Optional[np.ndarray]], int]


def stack_axis(axes) -> Optional[int]:
    """Position of the `layers` logical axis (a scanned stack), or None."""
    return list(axes).index("layers") if axes and "layers" in axes else None


def slice_ids(shape, axis, offset) -> np.ndarray:
    """Layer indices `offset + i` of a stacked parameter, shaped to broadcast along its `layers` axis."""
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    return (offset + np.arange(shape[axis])).reshape(bshape)


def with_n_layer(ids: Dict[str, Optional[np.ndarray]]) -> LayerIds:
    """(ids, n_layer = 1 + the largest index, 0 if none)."""
    found = [int(np.max(v)) for v in ids.values() if v is not None]
    return ids, (max(found) + 1 if found else 0)


def layer_stack_ids(meta: Meta) -> LayerIds:
    """Transformer-XL / XLNet (`xlnet/model_utils.py`): `layers.<l>` -> l (or the slice index of a stacked
    `layers` parameter). Embeddings, `mask_emb`, shared biases outside the layers and all heads: None."""
    ids: Dict[str, Optional[np.ndarray]] = {}
    for name, (shape, axes) in meta.items():
        parts = name.split(".")
        ids[name] = None
        if "layers" not in parts:
            continue
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            ids[name] = np.asarray(int(parts[i + 1]))
        elif stack_axis(axes) is not None:
            ids[name] = slice_ids(shape, stack_axis(axes), 0)
    return with_n_layer(ids)
