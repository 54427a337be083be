"""Sentence-set metrics of text generation (seed 004 §IV-A): BLEU, Self-BLEU, Inverse BLEU, FED and LCR.

Token-level (Texygen's definitions, nltk's BLEU with smoothing method 1, uniform weights up to n-grams):

    BLEU-n(G; T)         = mean_{g in G} sentence_bleu(refs=T, hyp=g)             fluency
    Self-BLEU-n(G)       = mean_{g in G} sentence_bleu(refs=G \\ {g}, hyp=g)       diversity (lower = more diverse)
    Inverse-BLEU-n(G; T) = mean_{t in T} sentence_bleu(refs=G, hyp=t)              fluency and diversity

Every score is nltk's `sentence_bleu` called on a small reference subset that gives it exactly the result of the
whole set (`ReferenceIndex`): nltk clips each hypothesis n-gram by its largest count in any reference and takes the
brevity penalty from the reference length closest to the hypothesis (ties: the shorter), so the subset is one
reference reaching the largest count of each n-gram of the hypothesis plus one of the closest length. This makes a
5,000 x 5,000 set a few seconds instead of nltk's quadratic pass over every reference.

Embedding-level, over any sentence encoder E (`sentence_encoders.py`):

    FED(A, B) = ||μ_A - μ_B||² + Tr(Σ_A + Σ_B - 2 (Σ_A Σ_B)^{1/2})          Fréchet distance of Gaussian fits
    S_ij      = cos(E(a_i), E(b_j))                                       (eq. 7)
    R_A(τ)    = 1/n Σ_i δ(Σ_j [S_ij ≥ τ]),   R_B(τ) = 1/m Σ_j δ(Σ_i [S_ij ≥ τ])
    LCR(τ)    = min(R_A(τ), R_B(τ))

δ(Σ_j [S_ij ≥ τ]) reads "some b_j is at least τ-similar to a_i" (the only sensible reading of the printed
δ(Σ_j S_ij ≥ τ); reference/output-layers-spectrum-initialgan.md §3.2), so R_A(τ) = mean_i [max_j S_ij ≥ τ] and one
pass over S gives every τ. A zero embedding has similarity 0 to everything.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Sequence, Tuple

import numpy as np

BLEU_ORDERS = (2, 3, 4, 5)
DEFAULT_TAU = 0.65  # the paper's COCO threshold (Figs. 10, 14); EMNLP uses 0.45 (Fig. 5)
TAU_SWEEP = tuple(round(0.05 * k, 2) for k in range(6, 20))  # 0.30 ... 0.95 (Fig. 4 sweeps τ)


def _ngrams(tokens: Sequence[str], n: int):
    return zip(*(tokens[i:] for i in range(n)))


class ReferenceIndex:
    """Per n-gram the two largest counts over the references (with the sentences holding them), and per length
    two sentences of that length: enough to pick, for any hypothesis (optionally leaving one reference out, for
    Self-BLEU), a subset of references on which nltk's sentence_bleu equals its value on all references."""

    def __init__(self, references: Sequence[Sequence[str]], max_n: int):
        self.references = [list(r) for r in references]
        self.max_n = max_n
        self.top: List[Dict[tuple, List[int]]] = [{} for _ in range(max_n + 1)]  # ngram -> [c1, i1, c2, i2]
        self.by_length: Dict[int, List[int]] = {}
        for i, ref in enumerate(self.references):
            held = self.by_length.setdefault(len(ref), [])
            if len(held) < 2:
                held.append(i)
            for n in range(1, max_n + 1):
                table = self.top[n]
                for g, c in Counter(_ngrams(ref, n)).items():
                    e = table.get(g)
                    if e is None:
                        table[g] = [c, i, 0, -1]
                    elif c > e[0]:
                        table[g] = [c, i, e[0], e[1]]
                    elif c > e[2]:
                        e[2], e[3] = c, i
        self.lengths = np.array(sorted(self.by_length), dtype=np.int64)

    def subset(self, hypothesis: Sequence[str], exclude: int = -1) -> List[List[str]]:
        """References (never `exclude`) on which nltk's clipped counts and closest length equal the full set's."""
        keep = set()
        for n in range(1, self.max_n + 1):
            table = self.top[n]
            for g in set(_ngrams(hypothesis, n)):
                e = table.get(g)
                if e is None:
                    continue
                if e[1] != exclude:
                    keep.add(e[1])
                elif e[3] >= 0:
                    keep.add(e[3])
        h = len(hypothesis)
        for length in sorted(self.lengths.tolist(), key=lambda r: (abs(r - h), r)):
            held = [i for i in self.by_length[length] if i != exclude]
            if held:
                keep.add(held[0])
                break
        return [self.references[i] for i in sorted(keep)]


def bleu_scores(
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = BLEU_ORDERS,
    *,
    leave_one_out: bool = False,
) -> Dict[int, float]:
    """{n: mean over hypotheses of nltk's sentence_bleu(references, hypothesis, uniform weights 1..n, smoothing
    method 1)}. `leave_one_out`: hypotheses and references are the same list and hypothesis i is scored without
    reference i (Self-BLEU)."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    if leave_one_out and len(hypotheses) < 2:
        raise ValueError("Self-BLEU needs at least two sentences")
    smooth = SmoothingFunction().method1
    weights = [tuple([1.0 / n] * n) for n in orders]
    index = ReferenceIndex(references, max(orders))
    totals = np.zeros(len(orders))
    for i, hyp in enumerate(hypotheses):
        refs = index.subset(hyp, exclude=i if leave_one_out else -1)
        scores = sentence_bleu(refs, list(hyp), weights, smoothing_function=smooth)
        totals += np.asarray(scores if isinstance(scores, list) else [scores] * len(orders), np.float64)
    return {n: float(t / len(hypotheses)) for n, t in zip(orders, totals)}


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FED: Fréchet distance of Gaussians fitted to the rows of `a` `[n, d]` and `b` `[m, d]` (as FID, seed 004
    §IV-A), float64, sqrtm from scipy; clipped at 0 (round-off of identical sets)."""
    import scipy.linalg

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    covmean = scipy.linalg.sqrtm(cov_a @ cov_b)
    if not np.all(np.isfinite(covmean)):  # singular product: offset the diagonals (as the FID reference code)
        off = np.eye(cov_a.shape[0]) * 1e-6
        covmean = scipy.linalg.sqrtm((cov_a + off) @ (cov_b + off))
    covmean = np.real(covmean)
    d = float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(covmean))
    return max(d, 0.0)


def max_cosine(a: np.ndarray, b: np.ndarray, *, chunk: int = 2048) -> Tuple[np.ndarray, np.ndarray]:
    """(max_j cos(a_i, b_j) for each i, max_i cos(a_i, b_j) for each j), in float32 chunks of `chunk` rows."""

    def unit(x):
        x = np.asarray(x, np.float32)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        return np.where(norm > 0, x / np.maximum(norm, 1e-30), 0.0).astype(np.float32)

    a, b = unit(a), unit(b)
    row = np.full(a.shape[0], -np.inf, np.float32)
    col = np.full(b.shape[0], -np.inf, np.float32)
    for s in range(0, a.shape[0], chunk):
        sim = a[s : s + chunk] @ b.T
        row[s : s + chunk] = sim.max(axis=1)
        col = np.maximum(col, sim.max(axis=0))
    return row, col


def coverage(a: np.ndarray, b: np.ndarray, taus: Sequence[float]) -> Dict[float, Tuple[float, float]]:
    """{τ: (R_A(τ), R_B(τ))} of eq. 7 for embeddings `a` `[n, d]`, `b` `[m, d]`. Similarities are compared in
    float32 with a 1e-6 allowance, so a sentence's own copy (cosine 1 up to round-off) counts at τ = 1."""
    row, col = max_cosine(a, b)
    return {float(t): (float(np.mean(row >= t - 1e-6)), float(np.mean(col >= t - 1e-6))) for t in taus}


def lcr(a: np.ndarray, b: np.ndarray, tau: float = DEFAULT_TAU) -> float:
    """Least Coverage Rate (eq. 7) at threshold `tau`."""
    ra, rb = coverage(a, b, [tau])[float(tau)]
    return min(ra, rb)
