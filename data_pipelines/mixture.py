"""Weighted mixtures of prepared corpora (`config.data.sources = "DIR_A:0.75,DIR_B:0.25"`).

Which source a row reads is decided per *slot*: for the stream pipelines (`lm`, `xlnet`, which carry memory) a slot
is an episode of `mix_steps` consecutive steps of one stream (a batch row; with XLNet `bi_data` the forward and
backward rows of a stream share it); for `mlm`/`electra` a slot is one example (global example g = step·B + row).
Slots are dealt to sources by nested Bresenham counting: with weights w_1..w_N, the number of the first j slots of a
lane that go to source 1 is n_1(j) = ⌊j·p_1 + c_1⌋ with p_1 = w_1 / Σw, the remaining j − n_1(j) slots are dealt
the same way among sources 2..N (p_2 = w_2 / Σ_{k≥2} w_k), and so on; the last source takes the rest. Every
source's count stays within N slots of w_s·j at every j (so source frequencies converge as 1/j, not 1/√j as
independent draws), and n_s(j) is a closed form, so a batch stays a pure function of (seed, step, rows). The phases
c are a Weyl sequence over the lanes (streams), offset by a Philox draw keyed by the seed, so the lanes switch
source at different steps.

Reading: the k-th slot of source s in a lane reads what the source's own single-corpus pipeline gives at its k-th
slot: stream pipelines continue the source's row (episode k covers the source's steps k·mix_steps ..
(k+1)·mix_steps − 1), so a stream that stays with its source continues it exactly; a stream switching source gets
`stream_reset` (memory zeroed) — a stream never splices two sources under one memory. MLM slot k of source s is
the source pipeline's example k. A one-source mixture reads exactly the single-source pipeline.

Weights changed on resume (`data.sources_history`, filled by the trainer): the deal is a sequence of stages, each
(first step, sources with weights); a stage starts at the first slot at or after its step (a stream finishes its
current episode under the old weights), and every source's read position is its slot count summed over all stages,
so each source continues exactly where it stopped: nothing is skipped or read twice because weights changed.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from data_pipelines import rng as rng_lib

_PHI = (math.sqrt(5.0) - 1.0) / 2.0  # Weyl step of the lane phases


def parse_sources(spec: str) -> list[tuple[str, float | None]]:
    """`"DIR_A:0.75,DIR_B:0.25"` -> [(path, weight or None)]; a path may itself contain ':' (gs://...)."""
    out = []
    for item in (s.strip() for s in str(spec).split(",")):
        if not item:
            continue
        path, sep, tail = item.rpartition(":")
        weight = None
        if sep and path and "/" not in tail:
            try:
                weight = float(tail)
            except ValueError:
                path, weight = item, None
        else:
            path = item
        if weight is not None and (not math.isfinite(weight) or weight < 0):
            raise ValueError(f"data.sources: weight of {path!r} must be a number >= 0, got {tail!r}")
        out.append((path, weight))
    return out


def source_name(path: str) -> str:
    """The metric name of a source: its directory's base name (`tokens/<name>`)."""
    return os.path.basename(str(path).rstrip("/")) or str(path)


def resolve_sources(spec: str) -> tuple[list[str], list[str], np.ndarray]:
    """(paths, names, weights summing to 1) of `data.sources`. Weights all given: normalised; none given: equal
    shares; some given (fractions summing below 1): the others share the rest equally."""
    items = parse_sources(spec)
    if not items:
        raise ValueError(f"data.sources={spec!r}: no source")
    given = np.array([w for _, w in items if w is not None], np.float64)
    n_missing = sum(w is None for _, w in items)
    if n_missing and len(given) and given.sum() >= 1.0:
        raise ValueError(
            f"data.sources={spec!r}: the given weights sum to {given.sum():g} >= 1, nothing is left for the "
            f"{n_missing} source(s) without a weight"
        )
    rest = (1.0 - given.sum()) / n_missing if n_missing and len(given) else 1.0
    weights = np.array([w if w is not None else rest for _, w in items], np.float64)
    if weights.sum() <= 0:
        raise ValueError(f"data.sources={spec!r}: the weights sum to 0")
    paths_, names = [p for p, _ in items], [source_name(p) for p, _ in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"data.sources: two sources share the base name {dup[0]!r} (it names their metrics)")
    return paths_, names, weights / weights.sum()


def stage_counts(j, weights: Sequence[float], phases: np.ndarray) -> np.ndarray:
    """Slots per source among a lane's first j slots of one stage: int64 [..., N] for j [...] and phases [..., N]
    (nested Bresenham, module docstring). Non-decreasing in j; row sums = j."""
    j = np.asarray(j, np.int64)
    w = np.asarray(weights, np.float64)
    n = len(w)
    out = np.zeros(j.shape + (n,), np.int64)
    rem = j.copy()
    for k in range(n):
        rest = w[k + 1 :].sum()
        if k == n - 1 or rest <= 0:
            out[..., k] = rem
            break
        p = min(w[k] / (w[k] + rest), 1.0)
        take = np.minimum(np.floor(rem * p + phases[..., k]).astype(np.int64), rem)
        out[..., k] = take
        rem = rem - take
    return out


class Deal:
    """The source of every slot and per-source slot counts, for stages [(first step, {name: weight})] (the first
    at step 0). A stage covers its steps; its slots start at the slot of its first step (`slot_of_step`, floor), so
    an episode a resume cuts in two is dealt again by the new stage from its start."""

    def __init__(self, stages: Sequence[tuple[int, dict]], names: Sequence[str], seed: int, slot_of_step):
        self.names = list(names)
        stages = sorted((int(a), dict(w)) for a, w in stages)
        self.step0 = np.array([a for a, _ in stages], np.int64)
        self.slot0 = np.array([slot_of_step(a) for a, _ in stages], np.int64)
        self.weights = [np.array(list(w.values()), np.float64) for _, w in stages]
        self.columns = [np.array([self.names.index(n) if n in self.names else -1 for n in w]) for _, w in stages]
        self.offsets = [
            rng_lib.keyed_rng(seed, rng_lib.PURPOSE_MIX, k).random(len(w)) for k, (_, w) in enumerate(stages)
        ]

    def stage(self, step: int) -> int:
        return int(np.searchsorted(self.step0, step, side="right") - 1)

    def stage_counts(self, k: int, j, lanes) -> np.ndarray:
        """int64 [L, n_k]: stage k's slots per source among its first j ([L]) slots of each lane ([L])."""
        phases = np.mod(self.offsets[k][None, :] + np.asarray(lanes, np.float64)[:, None] * _PHI, 1.0)
        return stage_counts(np.clip(j, 0, None), self.weights[k], phases)

    def stage_source(self, k: int, slot, lanes) -> np.ndarray:
        """int [L]: column (index into names; -1 = a source not in the current list) of `slot` in each lane under stage k."""
        j = np.asarray(slot, np.int64) - self.slot0[k]
        d = self.stage_counts(k, j + 1, lanes) - self.stage_counts(k, j, lanes)
        return self.columns[k][np.argmax(d, axis=-1)]

    def source_of(self, step: int, slot, lanes) -> np.ndarray:
        return self.stage_source(self.stage(step), slot, lanes)

    def add(self, total: np.ndarray, k: int, counts: np.ndarray) -> None:
        for i, col in enumerate(self.columns[k]):
            if col >= 0:
                total[:, col] += counts[:, i]

    def counts_before(self, step: int, slot, lanes) -> np.ndarray:
        """int64 [L, len(names)]: each listed source's slots before `slot` in each lane, over all stages up to the
        one of `step`."""
        lanes = np.atleast_1d(np.asarray(lanes, np.int64))
        slot = np.broadcast_to(np.asarray(slot, np.int64), lanes.shape)
        m = self.stage(step)
        total = np.zeros((len(lanes), len(self.names)), np.int64)
        for k in range(m + 1):
            end = slot if k == m else np.full(lanes.shape, self.slot0[k + 1])
            self.add(total, k, self.stage_counts(k, end - self.slot0[k], lanes))
        return total


def stages_of(cfg, names: Sequence[str], weights: np.ndarray) -> list:
    """[(first step, {name: weight})] from `data.sources_history` ((until step, spec), ...) and the current sources."""
    stages, begin = [], 0
    for until, spec in sorted((int(u), str(s)) for u, s in (cfg.get("sources_history") or ())):
        if until > begin:
            _, n, w = resolve_sources(spec)
            stages.append((begin, dict(zip(n, w.tolist()))))
            begin = until
    stages.append((begin, dict(zip(names, weights.tolist()))))
    return stages


def continue_history(old_data, new_data, step: int) -> tuple:
    """The `data.sources_history` of a run resumed at `step` with data config `new_data` after `old_data`: the
    stages before `step` (later ones were rolled back), plus (step, the old sources) if the sources changed."""
    hist = tuple((int(u), str(s)) for u, s in (old_data.get("sources_history") or ()) if int(u) < step)
    old_spec = str(old_data.get("sources") or "") or str(old_data.get("source") or "")
    new_spec = str(new_data.get("sources") or "") or str(new_data.get("source") or "")
    if step > 0 and old_spec and _canonical(old_spec) != _canonical(new_spec):
        hist += ((int(step), old_spec),)
    return hist


def _canonical(spec: str):
    try:
        _, names, w = resolve_sources(spec)
    except ValueError:
        return spec
    return sorted(zip(names, np.round(w, 12).tolist()))


class MixturePipeline:
    """`batch(step)` of a weighted mixture of single-source pipelines (same keys and shapes): see the module
    docstring. `source_tokens(step)`: {"tokens/<name>": tokens of that source in global steps [0, step)}."""

    def __init__(
        self,
        pipelines: Sequence,
        names: Sequence[str],
        stages: Sequence[tuple[int, dict]],
        *,
        kind: str,
        mix_steps: int,
        seed: int,
        rows_per_lane: int,
        tokens_per_row: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        from data_pipelines.lm import rows_of_process

        first = pipelines[0]
        vocab = {getattr(p.tokenizer, "fingerprint", lambda: None)() for p in pipelines}
        if len(vocab) > 1:
            raise ValueError(
                f"data.sources: {', '.join(p.corpus.description for p in pipelines)} were prepared with different "
                "vocabularies; a mixture needs one"
            )
        if kind not in ("stream", "example"):
            raise ValueError(f"mixture kind {kind!r}")
        if kind == "stream" and int(mix_steps) < 1:
            raise ValueError(f"data.mix_steps={mix_steps}: must be >= 1")
        self.pipelines, self.names, self.kind = list(pipelines), list(names), kind
        self.mix_steps = int(mix_steps) if kind == "stream" else 1
        self.rows_per_lane, self.tokens_per_row = int(rows_per_lane), int(tokens_per_row)
        self.global_batch_size = first.global_batch_size
        self.row0, self.local_batch_size = rows_of_process(self.global_batch_size, process_index, process_count)
        self.tokenizer, self.vocab_size = first.tokenizer, first.vocab_size
        self.num_steps = None
        self.num_lanes = self.global_batch_size // self.rows_per_lane if kind == "stream" else 1
        B, K = self.global_batch_size, self.mix_steps
        self.deal = Deal(stages, names, seed, (lambda t: t // K) if kind == "stream" else (lambda t: t * B))

    def slot_lane(self, step: int, rows) -> tuple[np.ndarray, np.ndarray]:
        """(slot, lane) of global rows at `step`."""
        rows = np.asarray(rows, np.int64)
        if self.kind == "stream":
            return np.full(rows.shape, step // self.mix_steps), rows // self.rows_per_lane
        return step * self.global_batch_size + rows, np.zeros(rows.shape, np.int64)

    def sources(self, step: int, rows=None) -> np.ndarray:
        """Source index (into `names`) of each global row (default: this process's rows) at `step`."""
        rows = np.arange(self.row0, self.row0 + self.local_batch_size) if rows is None else np.asarray(rows)
        slot, lane = self.slot_lane(step, rows)
        return self.deal.source_of(step, slot, lane)

    def coords(self, step: int):
        """(source index [b], the source pipeline's (step [b], row [b]), memory reset [b]) of this process's rows
        at `step`: what each row reads."""
        rows = np.arange(self.row0, self.row0 + self.local_batch_size)
        slot, lane = self.slot_lane(step, rows)
        src = self.deal.source_of(step, slot, lane)
        if np.any(src < 0):  # cannot happen: the current stage deals only listed sources
            raise AssertionError("mixture dealt a slot to an unlisted source")
        k = self.deal.counts_before(step, slot, lane)[np.arange(len(rows)), src]  # the lane's earlier slots of src
        switched = np.zeros(len(rows), bool)
        if self.kind == "stream":
            vstep, vrow = k * self.mix_steps + step % self.mix_steps, rows
            if step > 0:  # a stream whose source differs from its previous step's restarts its memory
                prev_slot, _ = self.slot_lane(step - 1, rows)
                switched = self.deal.source_of(step - 1, prev_slot, lane) != src
        else:
            vstep, vrow = np.divmod(k, self.global_batch_size)
        return src, (vstep, vrow), switched

    def batch(self, step: int) -> dict:
        if step < 0:
            raise IndexError(f"step {step} out of range")
        src, (vstep, vrow), switched = self.coords(step)
        rows = src
        out = None
        for s in np.unique(src):
            idx = np.flatnonzero(src == s)
            part = self.pipelines[s].rows([(int(vstep[i]), int(vrow[i])) for i in idx])
            if out is None:
                out = {key: np.empty((len(rows),) + v.shape[1:], v.dtype) for key, v in part.items()}
            for key, v in part.items():
                out[key][idx] = v
        if "stream_reset" in out:
            out["stream_reset"] = out["stream_reset"] | switched
        return out

    def source_tokens(self, step: int) -> dict:
        """{"tokens/<name>": tokens of each source in global steps [0, step)} (all processes' rows)."""
        step, names = int(step), self.names
        if self.kind == "example":
            per = self.deal.counts_before(step, step * self.global_batch_size, [0])[0]
            return {f"tokens/{n}": int(c) * self.tokens_per_row for n, c in zip(names, per)}
        K, lanes = self.mix_steps, np.arange(self.num_lanes)
        steps = np.zeros((len(lanes), len(names)), np.int64)
        for k, a in enumerate(self.deal.step0.tolist()):
            b = min(int(self.deal.step0[k + 1]) if k + 1 < len(self.deal.step0) else step, step)
            if b <= a:
                break
            ea, eb = a // K, b // K
            full = self.deal.stage_counts(k, np.full(len(lanes), eb - self.deal.slot0[k]), lanes) * K
            if a % K:  # the stage starts inside episode ea: its steps before a belong to the previous stage
                full[lanes, self._column(k, ea, lanes)] -= a % K
            if b % K:  # and ends inside episode eb
                full[lanes, self._column(k, eb, lanes)] += b % K
            self.deal.add(steps, k, full)
        per = steps.sum(0) * self.rows_per_lane
        return {f"tokens/{n}": int(c) * self.tokens_per_row for n, c in zip(names, per)}

    def _column(self, k: int, slot: int, lanes: np.ndarray) -> np.ndarray:
        """Stage k's own source index (its dict order) of `slot` in each lane."""
        j = slot - self.deal.slot0[k]
        d = self.deal.stage_counts(k, np.full(len(lanes), j + 1), lanes) - self.deal.stage_counts(
            k, np.full(len(lanes), j), lanes
        )
        return np.argmax(d, axis=-1)

    def describe_row(self, batch: dict, row: int) -> list:
        return self.pipelines[0].describe_row(batch, row)

    def __iter__(self):
        step = 0
        while True:
            yield self.batch(step)
            step += 1
