"""What the language-model families' objectives share: batch sizes per split, the memory dtype, memory rows reset at
stream starts, the loss of a uniform guess."""

from __future__ import annotations

import math
from typing import Optional


def batch_size(config, split: str) -> int:
    """The global batch size of a split: `data.batch_size` (train) or `data.eval_batch_size`."""
    return int(config.data.batch_size) if split == "train" else int(config.data.eval_batch_size)


def compute_dtype(config):
    """The memory dtype of a config's `model.dtype` (bfloat16 or float32)."""
    import jax.numpy as jnp

    return jnp.bfloat16 if config.model.get("dtype", "float32") == "bfloat16" else jnp.float32


def reset_rows(mems, stream_reset):
    """Zero the memory rows whose stream (re)starts: mems [L, b, M, d], stream_reset [b] bool."""
    keep = 1.0 - stream_reset.astype(mems.dtype)
    return mems * keep[None, :, None, None]


def log_vocab_size(config) -> Optional[float]:
    """log V (V = `config.model.vocab_size`): the cross-entropy of a uniform guess over the vocabulary, the
    `Objective.uniform_loss` of a language-modelling loss; None when the config has no vocabulary size."""
    v = config.model.get("vocab_size")
    return math.log(int(v)) if v else None
