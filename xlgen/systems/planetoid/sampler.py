"""Planetoid's batches as pure functions of (seed, step): Algorithm 2 (context triples), labeled batches, and the
alternating schedule of Algorithm 3.

Algorithm 2, sampling one (i, c, gamma) given the graph A, labels y_1:L and r1, r2, q, d:

    gamma = +1 with probability r1, else -1
    with probability r2 (graph context):
        S = a random walk of length q: S_1 uniform over the nodes, P(S_k = j | S_{k-1} = i) = a_ij / sum_j' a_ij'
        (S_j, S_k) uniform over the ordered position pairs with 0 < |j - k| < d;  i = S_j, c = S_k
        if gamma = -1: c uniform over the nodes (negative sampling)
    otherwise (label context, labeled nodes only):
        gamma = +1: (i, c) uniform over the ordered pairs of distinct labeled nodes with y_i = y_c
        gamma = -1: (i, c) uniform over the ordered pairs of labeled nodes with y_i != y_c

Reading choices (the thesis leaves them open): a pair never pairs a walk position with itself (j != k); a walk
that reaches a node with no edges stays there; "the nodes" are `nodes` (every node for -T/-G; for -I the training
nodes only, test nodes removed from the graph, since inductive methods are trained on labeled and unlabeled data).

Randomness: step s of stream k draws from numpy's PCG64 seeded by (seed, k, s), so batch s is the same whenever and
wherever it is built (exact resume) and independent of every other step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

SUPERVISED, CONTEXT = 0, 1
_STREAM_LABELED, _STREAM_CONTEXT = 0, 1


def rng_for(seed: int, stream: int, step: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(stream), int(step)])


def window_pairs(q: int, d: int) -> np.ndarray:
    """[P, 2] ordered walk positions (j, k), 0 <= j, k < q, 0 < |j - k| < d."""
    j, k = np.meshgrid(np.arange(q), np.arange(q), indexing="ij")
    keep = (np.abs(j - k) < d) & (j != k)
    return np.stack([j[keep], k[keep]], 1)


@dataclasses.dataclass(frozen=True)
class ContextSampler:
    """Algorithm 2 over a fixed graph and label set.

    adj      [N, N] CSR, nonnegative (the walk graph; rows outside `nodes` are never visited)
    nodes    [M] the node ids walks start from and negatives are drawn from
    labeled  [L] labeled node ids, labels [L] their classes
    """

    adj: sp.csr_matrix
    nodes: np.ndarray
    labeled: np.ndarray
    labels: np.ndarray
    r1: float = 5 / 6
    r2: float = 0.5
    q: int = 10
    d: int = 3

    @classmethod
    def build(cls, adj, labeled, labels, *, nodes=None, **kw) -> "ContextSampler":
        """Restricts the graph to `nodes` (default: all) and checks the label contexts can be drawn."""
        adj = sp.csr_matrix(adj, dtype=np.float64)
        n = adj.shape[0]
        nodes = np.arange(n) if nodes is None else np.sort(np.asarray(nodes, np.int64))
        if len(nodes) < n:
            keep = sp.diags(np.isin(np.arange(n), nodes).astype(np.float64))
            adj = (keep @ adj @ keep).tocsr()
            adj.eliminate_zeros()
        labeled = np.asarray(labeled, np.int64)
        labels = np.asarray(labels, np.int64)
        order = np.argsort(labels, kind="stable")
        s = cls(adj, nodes, labeled[order], labels[order], **kw)
        if s.r2 < 1:
            counts = np.bincount(s.labels)
            if (counts * (counts - 1)).sum() == 0 or (counts > 0).sum() < 2:
                raise ValueError(
                    "label contexts (r2 < 1) need a class with two labeled nodes and two classes; "
                    f"labeled per class: {counts.tolist()}"
                )
        if int(s.d) < 2 or int(s.q) < 2:
            raise ValueError(f"q={s.q}, d={s.d}: a walk window needs q >= 2 and d >= 2")
        return s

    # -- graph contexts -----------------------------------------------------------------------------------------
    def walks(self, starts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[n, q] random walks from `starts`: next node j of i with probability a_ij / sum_j' a_ij'."""
        indptr, indices, w = self.adj.indptr, self.adj.indices, self.adj.data
        cum = np.cumsum(w)
        before = np.r_[0.0, cum][indptr[:-1]]  # cumulative weight before each row
        rowsum = np.r_[0.0, cum][indptr[1:]] - before
        cur = np.asarray(starts, np.int64)
        if not len(indices):  # no edges among the sampler's nodes: every walk stays where it starts
            return np.repeat(cur[:, None], self.q, 1)
        out = np.empty((len(starts), self.q), np.int64)
        out[:, 0] = cur
        for t in range(1, self.q):
            u = rng.random(len(cur))
            target = before[cur] + u * rowsum[cur]
            pos = np.searchsorted(cum, target, side="right")
            pos = np.clip(pos, indptr[cur], np.maximum(indptr[cur + 1] - 1, indptr[cur]))
            cur = np.where(rowsum[cur] > 0, indices[np.minimum(pos, len(indices) - 1)], cur)
            out[:, t] = cur
        return out

    def graph_pairs(self, n: int, rng: np.random.Generator):
        """n positive graph-context pairs (i, c): one walk and one window pair each."""
        walks = self.walks(self.nodes[rng.integers(0, len(self.nodes), n)], rng)
        pairs = window_pairs(self.q, self.d)[rng.integers(0, len(window_pairs(self.q, self.d)), n)]
        rows = np.arange(n)
        return walks[rows, pairs[:, 0]], walks[rows, pairs[:, 1]]

    # -- label contexts ------------------------------------------------------------------------------------------
    def label_pairs(self, positive: np.ndarray, rng: np.random.Generator):
        """Pairs uniform over {(i, c): i != c, y_i = y_c} where `positive`, else over {(i, c): y_i != y_c}. Sampled
        as i with probability proportional to its number of partners, then c uniform among them."""
        L = len(self.labeled)
        counts = np.bincount(self.labels)
        offset = np.r_[0, np.cumsum(counts)][self.labels]  # class start of each (class-sorted) labeled node
        size = counts[self.labels]
        n = len(positive)
        i_pos = np.empty(n, np.int64)
        c_pos = np.empty(n, np.int64)
        for want, partners in ((True, size - 1), (False, L - size)):
            sel = np.flatnonzero(positive == want)
            if not len(sel):
                continue
            p = partners / partners.sum()
            i = rng.choice(L, len(sel), p=p)
            u = (rng.random(len(sel)) * partners[i]).astype(np.int64)
            if want:  # same class, skipping i itself
                rank = i - offset[i]
                c = offset[i] + u + (u >= rank)
            else:  # another class: skip i's class block
                c = u + size[i] * (u >= offset[i])
            i_pos[sel], c_pos[sel] = i, c
        return self.labeled[i_pos], self.labeled[c_pos]

    # -- Algorithm 2 ---------------------------------------------------------------------------------------------
    def sample(self, n: int, rng: np.random.Generator):
        """n triples (i [n], c [n], gamma [n] in {+1, -1}) of Algorithm 2."""
        gamma = np.where(rng.random(n) < self.r1, 1, -1)
        from_graph = rng.random(n) < self.r2
        i = np.empty(n, np.int64)
        c = np.empty(n, np.int64)
        g = np.flatnonzero(from_graph)
        if len(g):
            gi, gc = self.graph_pairs(len(g), rng)
            neg = gamma[g] < 0
            gc[neg] = self.nodes[rng.integers(0, len(self.nodes), int(neg.sum()))]
            i[g], c[g] = gi, gc
        lab = np.flatnonzero(~from_graph)
        if len(lab):
            i[lab], c[lab] = self.label_pairs(gamma[lab] > 0, rng)
        return i, c, gamma.astype(np.int32)

    def batch(self, seed: int, step: int, n: int):
        return self.sample(n, rng_for(seed, _STREAM_CONTEXT, step))


def labeled_batch(labeled: np.ndarray, seed: int, step: int, n: int) -> np.ndarray:
    """N1 labeled node ids for step `step`: the labeled set in a fresh random order per pass, read n at a time
    (every labeled node once per ceil(L / n) ... steps, as an epoch-based SGD does)."""
    L = len(labeled)
    start = step * n
    out = np.empty(n, np.int64)
    for k in range(n):
        epoch, pos = divmod(start + k, L)
        if k == 0 or pos == 0:
            perm = rng_for(seed, _STREAM_LABELED, epoch).permutation(L)
        out[k] = labeled[perm[pos]]
    return out


def phase(step: int, pretrain_steps: int, t1: int, t2: int) -> int:
    """Algorithm 3's schedule: CONTEXT for the first `pretrain_steps` steps (L_u alone, the pre-training that
    initialises the embeddings), then repeatedly t1 SUPERVISED steps (L_s) and t2 CONTEXT steps (L_u)."""
    if step < pretrain_steps:
        return CONTEXT
    return SUPERVISED if (step - pretrain_steps) % (t1 + t2) < t1 else CONTEXT
