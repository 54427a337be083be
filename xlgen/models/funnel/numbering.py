"""Funnel's numbering of parameters into layers for layer-wise LR decay (`tensorflow/optimization.py`).

The input layer (`embeddings`, `encoder.input_projection`) is layer 0, the encoder's parameter layers follow block
by block, `blocks.<b>.<j>` -> 1 + sum(sizes[:b]) + j (a shared "3x2" layer counts once, as its variable scope does),
then the decoder, `decoder.layers.<k>` -> 1 + sum(sizes) + k. Heads (MLM/ELECTRA/classifier/QA) get None. Each tower
is numbered on its own (ELECTRA's generator and discriminator both start at 0, as the original regex matches both).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from xlgen.models.numbering import LayerIds, Meta, slice_ids, stack_axis, with_n_layer


def _position(parts):
    """(tower, kind, block, index) of a Funnel parameter name split on '.', or None outside the layers.
    kind: "input" | "block" | "decoder"; index None for a stacked (scanned) block/decoder."""
    for i, p in enumerate(parts):
        tower = ".".join(parts[:i])
        nxt = parts[i + 1 :]
        if p == "embeddings" or (p == "encoder" and nxt[:1] == ["input_projection"]):
            return tower, "input", None, None
        if p == "encoder" and nxt[:1] == ["blocks"] and len(nxt) > 1 and nxt[1].isdigit():
            b = int(nxt[1])
            j = int(nxt[2]) if len(nxt) > 2 and nxt[2].isdigit() else None
            return tower, "block", b, j
        if p == "decoder" and nxt[:1] == ["layers"]:
            k = int(nxt[1]) if len(nxt) > 1 and nxt[1].isdigit() else None
            return tower, "decoder", None, k
    return None


def layer_ids(meta: Meta) -> LayerIds:
    """{name: None | layer index (array)} and n_layer of a Funnel model's parameters (see the module docstring)."""
    ids: Dict[str, Optional[np.ndarray]] = {}
    pos = {name: _position(name.split(".")) for name in meta}
    # parameter layers per (tower, block), from the unscanned indices or the stacked axis length
    sizes: Dict[Tuple[str, int], int] = {}
    for name, where in pos.items():
        if where is None or where[1] != "block":
            continue
        tower, _, b, j = where
        shape, axes = meta[name]
        n = j + 1 if j is not None else (shape[stack_axis(axes)] if stack_axis(axes) is not None else 1)
        sizes[(tower, b)] = max(sizes.get((tower, b), 0), n)
    n_blocks: Dict[str, int] = {}
    for tower, b in sizes:
        n_blocks[tower] = max(n_blocks.get(tower, 0), b + 1)
    for tower, b in [(t, b) for t, n in n_blocks.items() for b in range(n)]:
        if (tower, b) not in sizes:
            raise ValueError(f"layer_ids: Funnel tower {tower!r} has no parameters for encoder block {b}")

    def offset(tower, b):
        return 1 + sum(sizes[(tower, c)] for c in range(b))

    for name, where in pos.items():
        shape, axes = meta[name]
        ids[name] = None
        if where is None:
            continue
        tower, kind, b, j = where
        if kind == "input":
            ids[name] = np.asarray(0)
            continue
        base = offset(tower, b) if kind == "block" else offset(tower, n_blocks.get(tower, 0))
        if j is not None:
            ids[name] = np.asarray(base + j)
        elif stack_axis(axes) is not None:
            ids[name] = slice_ids(shape, stack_axis(axes), base)
        else:
            raise ValueError(f"layer_ids: cannot tell which Funnel layer {name!r} belongs to")
    return with_n_layer(ids)
