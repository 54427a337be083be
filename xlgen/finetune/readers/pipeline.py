"""Batches of task features, following the cross-team pipeline interface.

`FeaturePipeline.batch(step)` is a pure function of (seed, step, this process's rows): epoch e is a permutation of
all features seeded by (seed, e); the global batch at `step` is rows [step*B, (step+1)*B) of the concatenation of
epochs; process p takes its contiguous `local_batch_size` slice. Resuming at step k is calling `.batch(k)`.

`eval_batches(features, batch_size)` walks a split in order, padding the last batch by repeating row 0 and
returning `weights` (1 = real row) so metrics ignore the padding.
"""

from __future__ import annotations

from typing import Dict, Iterator

import numpy as np

Features = Dict[str, np.ndarray]


class FeaturePipeline:
    def __init__(
        self,
        features: Features,
        *,
        global_batch_size: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        keys=None,
    ):
        self.features = {k: v for k, v in features.items() if keys is None or k in keys}
        self.num_examples = len(next(iter(self.features.values())))
        if self.num_examples == 0:
            raise ValueError("no training features (empty split?)")
        if global_batch_size % process_count:
            raise ValueError(f"global_batch_size={global_batch_size} is not divisible by process_count={process_count}")
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // process_count
        self.seed, self.process_index = seed, process_index
        self._perm_cache: Dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            if len(self._perm_cache) > 4:
                self._perm_cache.clear()
            self._perm_cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
        return self._perm_cache[epoch]

    def indices(self, step: int) -> np.ndarray:
        """Feature indices of this process's rows at `step`."""
        start = step * self.global_batch_size + self.process_index * self.local_batch_size
        flat = np.arange(start, start + self.local_batch_size)
        epochs, offsets = np.divmod(flat, self.num_examples)
        return np.array([self._perm(int(e))[o] for e, o in zip(epochs, offsets)], np.int64)

    def batch(self, step: int) -> Features:
        idx = self.indices(step)
        return {k: v[idx] for k, v in self.features.items()}


def eval_batches(features: Features, batch_size: int, keys=None) -> Iterator[Features]:
    n = len(next(iter(features.values())))
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size)
        weights = (idx < n).astype(np.float32)
        idx = np.where(idx < n, idx, 0)
        b = {k: v[idx] for k, v in features.items() if keys is None or k in keys}
        b["weights"] = weights
        yield b
