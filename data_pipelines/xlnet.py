"""XLNet pretraining examples (Yang et al. 2019; zihangdai/xlnet data_utils.py), built online and exactly.

Streams: the corpus is cut into S streams of L = N // S tokens (S = B/2 with `bi_data`, else B). With `bi_data`,
global row 2s is stream s forward and row 2s+1 is the same stream reversed (the original puts the reversed half
of each core's batch after the forward half; a per-row `is_forward` flag makes any row order equivalent, and the
interleaved order keeps every process's / device's shard half forward, half backward). At step t of a pass, with
i = t * reuse_len, row r yields

    input_ids = [row[i : i+reuse_len] | A | <sep> | B | <sep> | <cls>]            (seq_len tokens)
    token_type_ids = 0 for the reuse part, A and the first <sep>; 1 for B and the second <sep>; 2 for <cls>

where A and B come from `split_a_and_b` (A/B cut at sentence boundaries; B is the true continuation, nsp_label 1,
or with probability 1/2 a random sentence-aligned span of the row, nsp_label 0). Targets: `sample_mask` spans
(n in 1..max_gram, p(n) ∝ 1/n, n·mask_alpha/mask_beta context, starting at word-initial pieces) in each half,
`num_predict - num_predict//2` in the reuse half and `num_predict//2` in the other; `<sep>`/`<cls>` are never
targets, and (exact_num_predict) random single tokens fill each half up to exactly its share. The factorisation
order (`factorization_rank`) and `perm_mask` (`perm_mask_block`) are built separately for the two halves, as the
original's `_local_perm`; the reuse half cannot see the second half.

Everything random comes from a Philox generator keyed by (seed, step, global row): `batch(step)` is pure.
"""

from __future__ import annotations

import bisect

import numpy as np

from data_pipelines import rng as rng_lib
from data_pipelines.corpus import TokenCorpus
from data_pipelines.lm import rows_of_process
from data_pipelines.vocab import visible_piece

_SCAN = 256  # window size when scanning for sentence boundaries


# ----------------------------------------------------------------------------------------------------------------
# A stream row, possibly reversed
# ----------------------------------------------------------------------------------------------------------------
class RowView:
    """Row = corpus positions [base, base + length) (mod N), read forward or reversed."""

    def __init__(self, corpus: TokenCorpus, base: int, length: int, reverse: bool):
        self.corpus, self.base, self.length, self.reverse = corpus, base, length, reverse

    def _read(self, fn, a: int, b: int) -> np.ndarray:
        if not self.reverse:
            return fn(self.base + a, b - a)
        return fn(self.base + self.length - b, b - a)[::-1]

    def tokens(self, a: int, b: int) -> np.ndarray:
        return self._read(self.corpus.tokens, a, b)

    def sent(self, a: int, b: int) -> np.ndarray:
        return self._read(self.corpus.sentence_parity, a, b)

    def next_boundary(self, pos: int, limit: int) -> int:
        """Smallest e in [pos, limit) with sent[e] != sent[e-1] (pos >= 1), else limit."""
        while pos < limit:
            hi = min(limit, pos + _SCAN)
            s = self.sent(pos - 1, hi)
            hits = np.flatnonzero(s[1:] != s[:-1])
            if len(hits):
                return pos + int(hits[0])
            pos = hi
        return limit

    def sentence_start(self, pos: int) -> int:
        """`while pos > 0 and sent[pos-1] == sent[pos]: pos -= 1`."""
        while pos > 0:
            lo = max(0, pos - _SCAN)
            s = self.sent(lo, pos + 1)
            hits = np.flatnonzero(s[1:] != s[:-1])  # boundary between lo+h and lo+h+1
            if len(hits):
                return lo + int(hits[-1]) + 1
            pos = lo
        return 0

    def sentence_end(self, pos: int, limit: int) -> int:
        """`while pos < limit and sent[pos-1] == sent[pos]: pos += 1`."""
        return self.next_boundary(pos, limit) if pos < limit else pos


def trim_to_length(la: int, lb: int, tot: int) -> tuple[int, int]:
    """Closed form of the original loop `while la + lb > tot: if la > lb: la -= 1 else: lb -= 1`."""
    excess = la + lb - tot
    if excess <= 0:
        return la, lb
    if la > lb:
        d = min(excess, la - lb)
        la, excess = la - d, excess - d
    elif lb > la:
        d = min(excess, lb - la)
        lb, excess = lb - d, excess - d
    # here equal (or done): b first, then alternate
    lb -= (excess + 1) // 2
    la -= excess // 2
    return la, lb


def split_a_and_b(row: RowView, rng: np.random.Generator, begin: int, tot_len: int):
    """The original `_split_a_and_b(..., extend_target=True)`: returns (a_tokens, b_tokens, nsp_label)."""
    data_len = row.length
    assert begin + tot_len < data_len
    s = row.sent(begin, begin + tot_len)
    cut_points = (begin + 1 + np.flatnonzero(s[1:] != s[:-1])).tolist()
    end_idx = row.next_boundary(begin + tot_len, data_len)
    a_begin = begin
    if not cut_points or rng.random() < 0.5:
        label = 0
        a_end = end_idx if not cut_points else cut_points[int(rng.integers(len(cut_points)))]
        b_len = max(1, tot_len - (a_end - a_begin))
        b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))  # random.randint(0, data_len - 1 - b_len)
        b_end = b_begin + b_len
        b_begin = row.sentence_start(b_begin)
        b_end = row.sentence_end(b_end, data_len - 1)
    else:
        label = 1
        a_end = cut_points[int(rng.integers(len(cut_points)))]
        b_begin, b_end = a_end, end_idx
    la, lb = trim_to_length(a_end - a_begin, b_end - b_begin, tot_len)
    return row.tokens(a_begin, a_begin + la), row.tokens(b_begin, b_begin + lb), label


# ----------------------------------------------------------------------------------------------------------------
# Span targets
# ----------------------------------------------------------------------------------------------------------------
def sample_mask(
    rng: np.random.Generator,
    is_start: np.ndarray,
    *,
    goal: int | None,
    mask_alpha: int = 6,
    mask_beta: int = 1,
    max_gram: int = 5,
    reverse: bool = False,
    span_unit: str = "word",
    functional: np.ndarray | None = None,
    return_spans: bool = False,
):
    """Span targets over one segment (the original `_sample_mask`); bool [n] (True = predict).

    Both modes draw n in 1..max_gram with p(n) ∝ 1/n and a context of ctx = n·mask_alpha // mask_beta.
    span_unit="piece" reproduces the original exactly: the span starts at the first word-initial piece after a
    uniform left context l in [0, ctx) and — because the original's end loop tests seg[beg] instead of seg[end]
    (zihangdai/xlnet#220) — covers n PIECES; the cursor then skips ctx - l more pieces, so a span of n takes
    n + ctx pieces and the predicted fraction before fill-up is beta/(alpha+beta) (1/7 for 6/1), not 1/6.
    span_unit="word" is the paper's rule ("a span of L tokens within a context of K·L tokens"), counted in words:
    the span is n whole words inside a context of ctx words (l uniform in [0, ctx - n]), so the predicted word
    fraction is mask_beta/mask_alpha; a span is cut at the goal.
    functional: bool [n] positions (<sep>, <cls>) that must not be targets: removed after span sampling and skipped
    by the fill-up, so the result has exactly `goal` targets (the original could lose some to them).
    The fill-up picks uniformly among free positions (same law as the original's rejection loop).
    Returns mask (and the span lengths in units when return_spans).
    """
    n_len = len(is_start)
    if reverse:
        is_start = is_start[::-1]
        functional = None if functional is None else functional[::-1]
    starts = np.flatnonzero(is_start).tolist()
    n_starts = len(starts)
    bounds = starts + [n_len]
    mask = np.zeros(n_len, dtype=bool)
    cdf = np.cumsum(1.0 / np.arange(1, max_gram + 1))
    cdf /= cdf[-1]
    spans = []
    num, cur, k, grams, unif = 0, 0, 0, (), ()
    while True:
        if goal is not None and num >= goal:
            break
        if k == len(grams):  # draw in blocks (one Generator call per 64 spans)
            u2 = rng.random(128)
            grams, unif, k = (1 + np.searchsorted(cdf, u2[:64], side="right")).tolist(), u2[64:].tolist(), 0
        n, u = grams[k], unif[k]
        k += 1
        if goal is not None:
            n = min(n, goal - num)
        ctx = (n * mask_alpha) // mask_beta
        if span_unit == "piece":  # cur, l_ctx, spans in pieces
            if cur >= n_len:
                break
            l_ctx = int(u * ctx)
            si = bisect.bisect_left(starts, cur + l_ctx)
            if si >= n_starts:
                break
            beg = starts[si]
            end = beg + n
            if end >= n_len:
                break
            cur = end + (ctx - l_ctx)
            spans.append(n)
        else:  # cur, l_ctx, spans in words
            l_ctx = int(u * (ctx - n + 1))
            w = cur + l_ctx
            if w + n > n_starts:
                break
            beg, end = bounds[w], bounds[w + n]
            if goal is not None:
                end = min(end, beg + goal - num)
            cur = w + n + (ctx - n - l_ctx)
            spans.append(n)
        mask[beg:end] = True
        num += end - beg
    if functional is not None:
        mask &= ~functional
    if goal is not None:
        num = int(mask.sum())
        if num < goal:
            free = np.flatnonzero(~mask if functional is None else ~(mask | functional))
            if len(free) < goal - num:
                raise ValueError(f"cannot place {goal} targets in a segment of {n_len} tokens")
            # a uniform (goal - num)-subset of the free positions (the law of the original's rejection loop)
            mask[free[np.argpartition(rng.random(len(free)), goal - num - 1)[: goal - num]]] = True
    if reverse:
        mask = mask[::-1]
    return (mask, spans) if return_spans else mask


# ----------------------------------------------------------------------------------------------------------------
# Permutation masks
# ----------------------------------------------------------------------------------------------------------------
def factorization_rank(pi: np.ndarray, m: int) -> np.ndarray:
    """Rank of each position in the factorisation order: `range(m)` reshaped [-1, perm_size], transposed, rows
    shuffled by π, transposed back (the original `_local_perm`) = p - p % ps + π(p % ps). pi: [..., ps] -> [..., m]."""
    ps = pi.shape[-1]
    if m % ps:
        raise ValueError(f"segment length {m} is not a multiple of perm_size {ps}")
    return (np.arange(m) // ps) * ps + np.tile(pi, m // ps)


def perm_mask_block(rank: np.ndarray, target: np.ndarray, masked_or_func: np.ndarray) -> np.ndarray:
    """bool [..., m, m]: 1 = i may NOT attend to j (the original rule, batched over leading axes).

    Non-target non-functional tokens get rank -1 (visible to all, blind to targets); self_rank = rank for targets
    (they cannot see themselves) and rank + 1 otherwise; blocked iff self_rank(i) <= rank(j) and j is a target or
    <sep>/<cls>.
    """
    rev = np.where(masked_or_func, rank, -1)
    self_rev = np.where(target, rev, rev + 1)
    return (self_rev[..., :, None] <= rev[..., None, :]) & masked_or_func[..., None, :]


# ----------------------------------------------------------------------------------------------------------------
# The pipeline
# ----------------------------------------------------------------------------------------------------------------
class XLNetPipeline:
    """`batch(step)` -> input_ids, token_type_ids, perm_mask, target_mapping, target_ids, target_mask, is_forward,
    stream_reset, nsp_label (shapes in docs/data.md)."""

    def __init__(
        self,
        corpus: TokenCorpus,
        *,
        global_batch_size: int,
        seq_len: int = 512,
        reuse_len: int = 256,
        perm_size: int | None = None,
        num_predict: int = 85,
        mask_alpha: int = 6,
        mask_beta: int = 1,
        max_gram: int = 5,
        bi_data: bool = True,
        span_unit: str = "word",
        exact_num_predict: bool = True,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        rotate_passes: bool = True,
        num_steps: int | None = None,
        finite: bool = False,
    ):
        self.corpus, self.seed = corpus, int(seed)
        self.seq_len, self.reuse_len = int(seq_len), int(reuse_len)
        self.perm_size = int(perm_size or reuse_len)
        self.num_predict, self.mask_alpha, self.mask_beta = int(num_predict), int(mask_alpha), int(mask_beta)
        self.max_gram, self.bi_data, self.span_unit = int(max_gram), bool(bi_data), span_unit
        self.exact_num_predict = bool(exact_num_predict)
        self.rotate_passes = rotate_passes and not finite
        self.global_batch_size = int(global_batch_size)
        if span_unit not in ("word", "piece"):
            raise ValueError(f"data.span_unit={span_unit!r}: expected 'word' or 'piece'")
        if self.mask_alpha < self.mask_beta or self.mask_beta < 1:
            raise ValueError(f"need mask_alpha >= mask_beta >= 1, got {mask_alpha}, {mask_beta}")
        if not 0 < self.reuse_len < self.seq_len - 3:
            raise ValueError(f"need 0 < reuse_len ({reuse_len}) < seq_len - 3 ({seq_len - 3})")
        non_reuse = self.seq_len - self.reuse_len
        if self.perm_size > self.reuse_len or self.perm_size > non_reuse:
            raise ValueError(
                f"perm_size={self.perm_size} must be <= reuse_len={reuse_len} and <= seq_len - reuse_len "
                f"= {non_reuse} (else information leaks)"
            )
        if self.reuse_len % self.perm_size or non_reuse % self.perm_size:
            raise ValueError(f"perm_size={self.perm_size} must divide reuse_len and seq_len - reuse_len")
        if (
            not 0 < self.num_predict
            or self.num_predict - self.num_predict // 2 > self.reuse_len
            or self.num_predict // 2 > non_reuse - 3
        ):
            raise ValueError(
                f"num_predict={num_predict} does not fit: {self.num_predict - self.num_predict // 2} targets "
                f"in the reuse half ({reuse_len} tokens), {self.num_predict // 2} in the other "
                f"({non_reuse - 3} non-functional tokens)"
            )
        if self.bi_data and self.global_batch_size % 2:
            raise ValueError(f"bi_data needs an even batch size, got {self.global_batch_size}")
        self.row0, self.local_batch_size = rows_of_process(self.global_batch_size, process_index, process_count)
        if self.bi_data and (self.row0 % 2 or self.local_batch_size % 2):
            raise ValueError("bi_data needs an even number of rows per process")
        tok = corpus.tokenizer
        self.tokenizer, self.vocab_size = tok, tok.vocab_size
        self.sep_id, self.cls_id = tok.special_ids.get("sep"), tok.special_ids.get("cls")
        if self.sep_id is None or self.cls_id is None:
            raise ValueError(
                f"{corpus.description}: tokenizer {tok.kind} has no <sep>/<cls> symbols (XLNet needs them)"
            )
        self.is_start = tok.is_start_table()
        self.num_streams = self.global_batch_size // 2 if self.bi_data else self.global_batch_size
        self.row_len = corpus.num_tokens // self.num_streams
        if self.row_len < self.seq_len + 1:
            raise ValueError(
                f"{corpus.description}: corpus too small: {corpus.num_tokens} tokens give "
                f"{self.num_streams} streams of {self.row_len} tokens, fewer than seq_len + 1 = "
                f"{self.seq_len + 1} (one global batch of {self.global_batch_size} rows)"
            )
        self.steps_per_pass = (self.row_len - self.seq_len) // self.reuse_len + 1
        self.num_steps = (min(num_steps, self.steps_per_pass) if num_steps else self.steps_per_pass) if finite else None
        self.finite = finite
        self._offsets = {}

    def pass_offset(self, p: int) -> int:
        if p == 0 or not self.rotate_passes:
            return 0
        if p not in self._offsets:
            self._offsets[p] = int(
                rng_lib.keyed_rng(self.seed, rng_lib.PURPOSE_PASS, p).integers(self.corpus.num_tokens)
            )
        return self._offsets[p]

    def row_view(self, step: int, row: int) -> RowView:
        p = step // self.steps_per_pass
        stream, forward = (row // 2, row % 2 == 0) if self.bi_data else (row, True)
        return RowView(self.corpus, self.pass_offset(p) + stream * self.row_len, self.row_len, not forward)

    def example(self, step: int, row: int):
        """One row: (input_ids [S], token_type_ids [S], is_masked [S], nsp_label, its rng, is_forward)."""
        rng = rng_lib.row_rng(self.seed, rng_lib.PURPOSE_XLNET, step, row)
        view = self.row_view(step, row)
        i = (step % self.steps_per_pass) * self.reuse_len
        r = self.reuse_len
        inp = view.tokens(i, i + r)
        a, b, label = split_a_and_b(view, rng, i + r, self.seq_len - r - 3)
        ids = np.concatenate([inp, a, [self.sep_id], b, [self.sep_id], [self.cls_id]]).astype(np.int32)
        seg = np.zeros(self.seq_len, np.int32)
        seg[r + len(a) + 1 :] = 1
        seg[-1] = 2
        reverse = view.reverse
        start = self.is_start[ids]
        func = (ids == self.sep_id) | (ids == self.cls_id)
        np1 = self.num_predict // 2
        np0 = self.num_predict - np1
        kw = dict(
            mask_alpha=self.mask_alpha,
            mask_beta=self.mask_beta,
            max_gram=self.max_gram,
            reverse=reverse,
            span_unit=self.span_unit,
        )
        if not self.exact_num_predict:  # the original: <sep>/<cls> may take target slots and are then dropped
            func = np.zeros_like(func)
        m0 = sample_mask(rng, start[:r], goal=np0, functional=func[:r], **kw)
        m1 = sample_mask(rng, start[r:], goal=np1, functional=func[r:], **kw)
        return ids, seg, np.concatenate([m0, m1]), label, rng, not reverse

    def describe_row(self, batch: dict, row: int) -> list:
        """Row `row` of a batch as text lines (`xlgen prepare show`): its flags, then its segments with the
        prediction targets in [brackets]."""
        tgt = batch["target_mapping"][row].sum(0).astype(bool)
        seg, ids = batch["token_type_ids"][row], batch["input_ids"][row]
        lines = [
            f"forward={bool(batch['is_forward'][row])} reset={bool(batch['stream_reset'][row])} "
            f"nsp_label={int(batch['nsp_label'][row])} targets={int(tgt.sum())}"
        ]
        for s_id, name in ((0, "reuse+A"), (1, "B"), (2, "cls")):
            pieces = ((visible_piece(self.tokenizer, ids[i]), tgt[i]) for i in np.flatnonzero(seg == s_id))
            lines.append(f"  [{name}] " + " ".join(f"[{p}]" if is_target else p for p, is_target in pieces))
        return lines

    def batch(self, step: int) -> dict:
        if step < 0 or (self.num_steps is not None and step >= self.num_steps):
            raise IndexError(f"step {step} out of range (this pipeline has {self.num_steps} steps)")
        return self.rows([(step, self.row0 + j) for j in range(self.local_batch_size)])

    def rows(self, coords) -> dict:
        """The batch made of the rows `coords` = [(step, global row), ...] (steps may differ: a mixture's rows)."""
        bsz, S, R, P, ps = len(coords), self.seq_len, self.reuse_len, self.num_predict, self.perm_size
        ids = np.empty((bsz, S), np.int32)
        seg = np.empty((bsz, S), np.int32)
        masked = np.empty((bsz, S), bool)
        rank = np.empty((bsz, S), np.int64)
        forward = np.empty((bsz,), bool)
        nsp = np.empty((bsz,), np.int32)
        for j, (step, row) in enumerate(coords):
            ids[j], seg[j], masked[j], nsp[j], rng, forward[j] = self.example(step, row)
            rank[j, :R] = factorization_rank(rng.permutation(ps), R)  # one π per half, as the original's `_local_perm`
            rank[j, R:] = factorization_rank(rng.permutation(ps), S - R)
        func = (ids == self.sep_id) | (ids == self.cls_id)
        target = masked & ~func
        mof = masked | func
        perm_mask = np.empty((bsz, S, S), np.float32)
        perm_mask[:, :R, R:] = 1.0  # the reuse half never sees the second half
        perm_mask[:, R:, :R] = 0.0  # the second half sees all of the reuse half
        perm_mask[:, :R, :R] = perm_mask_block(rank[:, :R], target[:, :R], mof[:, :R])
        perm_mask[:, R:, R:] = perm_mask_block(rank[:, R:], target[:, R:], mof[:, R:])
        rows, cols = np.nonzero(target)
        k = (np.cumsum(target, axis=1) - 1)[rows, cols]
        keep = k < P
        rows, cols, k = rows[keep], cols[keep], k[keep]
        target_mapping = np.zeros((bsz, P, S), np.float32)
        target_mapping[rows, k, cols] = 1.0
        target_ids = np.zeros((bsz, P), np.int32)
        target_ids[rows, k] = ids[rows, cols]  # the PLM target is the token itself
        target_mask = np.zeros((bsz, P), np.float32)
        target_mask[rows, k] = 1.0
        return {
            "input_ids": ids,
            "token_type_ids": seg,
            "perm_mask": perm_mask,
            "target_mapping": target_mapping,
            "target_ids": target_ids,
            "target_mask": target_mask,
            "is_forward": forward,
            "stream_reset": np.array([step % self.steps_per_pass == 0 for step, _ in coords], bool).reshape(bsz),
            "nsp_label": nsp,
        }

    def __iter__(self):
        step = 0
        while self.num_steps is None or step < self.num_steps:
            yield self.batch(step)
            step += 1
