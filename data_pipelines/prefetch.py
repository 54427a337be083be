"""Background prefetching: build batch(s+1..s+depth) on a worker thread while the caller trains on batch(s).

    for step, batch in data_pipelines.prefetch(pipeline, start_step=k, depth=2):
        state = train_step(state, batch)

NumPy releases the GIL in its array kernels and a jitted JAX step releases it while running, so one worker
thread overlaps most of the input work with the step. Batches are still `pipeline.batch(step)` (pure), so
resuming at k is unchanged; random generators are per thread (`rng.row_rng`).
"""

from __future__ import annotations

import concurrent.futures as futures
import itertools
from collections import deque
from typing import Iterator


def prefetch(pipeline, start_step: int = 0, num_steps: int | None = None, depth: int = 2) -> Iterator[tuple]:
    """Yields (step, pipeline.batch(step)) for step = start_step, start_step + 1, ... (num_steps of them, or up
    to `pipeline.num_steps`, or forever), keeping `depth` batches in flight on one worker thread."""
    end = None if num_steps is None else start_step + num_steps
    if getattr(pipeline, "num_steps", None) is not None:
        end = pipeline.num_steps if end is None else min(end, pipeline.num_steps)
    steps = itertools.count(start_step) if end is None else iter(range(start_step, end))
    with futures.ThreadPoolExecutor(1, thread_name_prefix="xlgen-data") as ex:
        queue = deque()
        for s in itertools.islice(steps, max(1, depth)):
            queue.append((s, ex.submit(pipeline.batch, s)))
        try:
            while queue:
                s, fut = queue.popleft()
                nxt = next(steps, None)
                if nxt is not None:
                    queue.append((nxt, ex.submit(pipeline.batch, nxt)))
                yield s, fut.result()
        finally:
            for _, fut in queue:
                fut.cancel()
