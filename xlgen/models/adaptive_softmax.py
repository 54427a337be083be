"""Adaptive input embeddings (Baevski & Auli, 2019) and the projected adaptive softmax (Grave et al., 2017).

The vocabulary [0, V) is split by `cutoffs` c_1 < ... < c_K into a head [0, c_1) and K tail clusters
[c_k, c_{k+1}) (c_{K+1} = V). With `div_val` > 1, cluster k has its own table `[V_k, d_embed // div_val**k]` and a
projection to the model width d_proj; with `div_val` == 1 there is one table `[V, d_embed]` (sliced per cluster)
and a projection only if d_embed != d_proj. This matches the original Transformer-XL code and HF's
`AdaptiveEmbedding` / `ProjectedAdaptiveLogSoftmax`.

Input:  e(x) = sqrt(d_proj) · P_k^T E_k[x - c_k]                      (x in cluster k)
Output: log p(x) = log softmax_head(h)[x]                             (x in the head)
        log p(x) = log softmax_head(h)[c_1 + k - 1] + log softmax_k(h)[x - c_k]   (x in tail cluster k)
with softmax_head over [E_0 P_0 h + b_0 ; W_c h + b_c] (the shortlist plus one logit per tail cluster) and
softmax_k over E_k P_k h + b_k. Output tables/projections may be tied to the input ones (`tie_weights`, and
`tie_projs[k]`, HF's `proj_share_all_but_first`).

Stored rows: with `rows_multiple` > 1 (div_val > 1 only) every table and output bias keeps its rows rounded up to
that multiple, so that a sharded dimension divides (WikiText-103's 67,735-row tail over 64 cores; Megatron pads its
vocabulary the same way). The padding rows start at zero, are never looked up, and their logits are masked to a
finite -inf through the bias, so they get probability 0 and no gradient; loaders pad and exporters slice
(`pad_rows`).

Layouts (ours; the HF loader transposes): tables `[V_k, d_k]` ("vocab", "embed"), projections `[d_k, d_proj]`
(None, "embed"): the input side computes `E[x] @ P`, the output side `h @ P^T`. Output log-probs and NLLs are
float32. `nll` never materialises `[..., V]`: it gathers the target rows, computes log-normalisers in vocabulary
blocks (an online logsumexp under `jax.checkpoint`), and runs each tail cluster only on the tokens whose label is
in it (sorted into fixed-size chunks), so memory is O(tokens x block) and compute is the adaptive softmax's.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xlgen.models import operands
from xlgen.models.layers import normal, param, zeros
from xlgen.sharding import per_shard, take_rows

TOKENS = ("activation_batch", "activation_embed")  # hidden states of the flattened tokens [N, d]

_NEG = -1e30  # finite "minus infinity" for padded vocabulary rows


def cluster_bounds(vocab_size: int, cutoffs: Sequence[int]) -> list:
    """[(start, end)] for the head and every tail cluster. Raises on non-increasing or out-of-range cutoffs."""
    cuts = list(cutoffs)
    if any(c <= 0 or c >= vocab_size for c in cuts) or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"cutoffs {cuts} must be strictly increasing and inside (0, vocab_size={vocab_size})")
    ends = [0] + cuts + [vocab_size]
    return list(zip(ends[:-1], ends[1:]))


def cluster_dims(d_embed: int, n_clusters: int, div_val: int) -> list:
    """Embedding width per cluster (head first): d_embed // div_val**k; one table when div_val == 1."""
    if div_val == 1:
        return [d_embed]
    dims = [d_embed // (div_val**k) for k in range(n_clusters + 1)]
    if min(dims) < 1:
        raise ValueError(f"div_val={div_val} leaves a cluster with width 0 (d_embed={d_embed}, {n_clusters} tails)")
    return dims


def stored_rows(rows: int, multiple: int) -> int:
    """`rows` rounded up to a multiple of `multiple`: a table's stored rows (see the module doc)."""
    if multiple < 1:
        raise ValueError(f"rows_multiple must be >= 1, got {multiple}")
    return -(-rows // multiple) * multiple


def pad_rows(array, rows: int):
    """`array` (NumPy) with its leading dimension padded by zero rows to `rows` (a loader's view of a stored table
    or bias); an array that already has `rows` rows is returned as it is."""
    short = rows - array.shape[0]
    if short < 0:
        raise ValueError(f"array of {array.shape[0]} rows does not fit {rows} stored rows")
    return array if short == 0 else np.concatenate([array, np.zeros((short,) + array.shape[1:], array.dtype)])


def _zero_rows_from(init, rows: int):
    """`init` with the rows from `rows` on set to zero (a table's padding rows)."""

    def padded_init(key, shape, dtype):
        value = init(key, shape, dtype)
        return value if shape[0] == rows else value.at[rows:].set(0)

    return padded_init


def vocab_blocks(vocab: int, block: int) -> tuple:
    """(number of blocks, rows per block) splitting `vocab` rows into the fewest equal blocks of <= `block` rows,
    each rounded up to a multiple of 128 (TPU lanes) when `block` >= 128: the padding is < 128 rows per block."""
    if block < 1:
        raise ValueError(f"softmax block size must be positive, got {block}")
    align = 128 if block >= 128 else 1
    cap = block // align * align
    n_blocks = -(-vocab // cap)
    rows = -(-vocab // n_blocks)
    return n_blocks, -(-rows // align) * align


def logsumexp_rows(h: jax.Array, table: jax.Array, bias: jax.Array, *, block: int) -> jax.Array:
    """logsumexp_v (h · table[v] + bias[v]) in float32 for h `[N, d]`, table `[V, d]`, bias `[V]` -> `[N]`.

    V <= block: one matmul (the backward pass keeps the `[N, V]` softmax). V > block: `vocab_blocks` equal blocks
    with an online logsumexp inside a checkpointed scan, so neither pass holds more than `[N, block]` logits (at
    the price of recomputing each block's logits in the backward pass). Lowered for TPU (`operands.
    fused_logsumexp_rows`): Pallas kernels that keep the logits in VMEM (`tpu_logsumexp`).
    """
    fused = operands.fused_logsumexp_rows(h, table, bias)
    if fused is not None:
        return fused
    vocab, width = table.shape
    if vocab <= block:
        logits = jnp.einsum("nd,vd->nv", h, table.astype(h.dtype), preferred_element_type=jnp.float32)
        return jax.nn.logsumexp(logits + bias.astype(jnp.float32), axis=-1)
    n_blocks, rows = vocab_blocks(vocab, block)
    pad = n_blocks * rows - vocab
    table = jnp.pad(table, ((0, pad), (0, 0))).reshape(n_blocks, rows, width)
    bias = jnp.pad(bias.astype(jnp.float32), (0, pad), constant_values=_NEG).reshape(n_blocks, rows)

    @jax.checkpoint
    def step(carry, xs):
        m, s = carry
        t, b = xs
        logits = jnp.einsum("nd,vd->nv", h, t.astype(h.dtype), preferred_element_type=jnp.float32) + b
        m_new = jnp.maximum(m, logits.max(-1))
        s = s * jnp.exp(m - m_new) + jnp.exp(logits - m_new[:, None]).sum(-1)
        return (m_new, s), None

    zeros = h[:, 0].astype(jnp.float32) * 0.0  # (typed like h: varying per device under shard_map)
    init = (zeros + _NEG, zeros)
    (m, s), _ = jax.lax.scan(step, init, (table, bias))
    return m + jnp.log(s)


def table_rows(vocab_size: int, cutoffs: Sequence[int], div_val: int) -> list:
    """Rows of each table (head first) before padding: one `[V]` table when div_val == 1, else one per cluster."""
    bounds = cluster_bounds(vocab_size, cutoffs)
    return [vocab_size] if div_val == 1 else [e - s for s, e in bounds]


def _stored_table_rows(vocab_size, cutoffs, div_val, rows_multiple) -> list:
    """(real rows, stored rows) of each table (head first)."""
    if rows_multiple > 1 and div_val == 1:
        raise ValueError(f"rows_multiple={rows_multiple} needs div_val > 1 (one table per cluster)")
    return [(v, stored_rows(v, rows_multiple)) for v in table_rows(vocab_size, cutoffs, div_val)]


def _tables(rngs, rows, dims, init_std) -> nnx.List:
    """The tables `[R_k, d_k]` ("vocab", "embed"): N(0, init_std) real rows, zero padding rows."""
    return nnx.List(
        [param(rngs, _zero_rows_from(normal(init_std), v), (r, d), ("vocab", "embed")) for (v, r), d in zip(rows, dims)]
    )


def target_log_probs(h: jax.Array, table: jax.Array, bias: jax.Array, idx: jax.Array, *, block: int) -> jax.Array:
    """log softmax_v (h · table[v] + bias[v])[idx] `[N]` (float32) for h `[N, d]`, idx `[N]`: the target logit minus
    `logsumexp_rows`. Lowered for TPU, one pair of kernels (`operands.fused_nll_rows`) whose backward takes the
    target's one-hot off the softmax; a table of at most `block` rows, from its one logits matmul; a larger one, by
    gathering the target rows. In the first two the table's gradient has no scatter of the target rows."""
    fused = operands.fused_nll_rows(h, table, bias, idx)
    if fused is not None:
        return -fused
    if table.shape[0] <= block:  # one `[N, V]` logits matmul: the target logit taken from it (the gradient's
        # one-hot joins the softmax's, where a row gather's gradient is a table-sized scatter on each device)
        logits = jnp.einsum("nd,vd->nv", h, table.astype(h.dtype), preferred_element_type=jnp.float32)
        logits = logits + bias.astype(jnp.float32)
        picked = jnp.take_along_axis(logits, idx[:, None], axis=1)[:, 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)
    return _target_logit(h, table, bias, idx) - logsumexp_rows(h, table, bias, block=block)


class AdaptiveEmbedding(nnx.Module):
    """Adaptive input representation: ids `[...]` -> `[..., d_proj]` scaled by sqrt(d_proj) (see module doc)."""

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_proj: int,
        cutoffs: Sequence[int] = (),
        div_val: int = 1,
        *,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        rows_multiple: int = 1,
        rngs: nnx.Rngs,
    ):
        self.vocab_size, self.d_embed, self.d_proj, self.div_val = vocab_size, d_embed, d_proj, div_val
        self.bounds = tuple(cluster_bounds(vocab_size, cutoffs))
        self.dims = tuple(cluster_dims(d_embed, len(self.bounds) - 1, div_val))
        rows = _stored_table_rows(vocab_size, cutoffs, div_val, rows_multiple)
        self.tables = _tables(rngs, rows, self.dims, init_std)
        needs_proj = [d != d_proj for d in self.dims] if div_val == 1 else [True] * len(self.dims)
        self.projs = nnx.List(
            [
                param(rngs, normal(proj_init_std), (d, d_proj), (None, "embed")) if p else None
                for d, p in zip(self.dims, needs_proj)
            ]
        )

    def output_table(self, t: int) -> jax.Array:
        """Table t `[V_t, d_t]` (what a tied output layer reads; `SpectralEmbedding` has the same method)."""
        return self.tables[t][...]

    def output_proj(self, t: int) -> Optional[jax.Array]:
        """Projection t `[d_t, d_proj]` or None (what a tied output layer reads)."""
        proj = self.projs[t]
        return None if proj is None else proj[...]

    def cluster_weights(self, k: int):
        """(table rows `[V_k, d_k]`, projection `[d_k, d_proj]` or None) of cluster k (head = 0)."""
        if self.div_val == 1:
            s, e = self.bounds[k]
            proj = self.projs[0]
            return self.tables[0][s:e], (None if proj is None else proj[...])
        proj = self.projs[k]
        return self.tables[k][...], proj[...]

    def __call__(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        scale = math.sqrt(self.d_proj)
        if self.div_val == 1:
            emb = jnp.take(self.tables[0][...], ids, axis=0, mode="clip").astype(dtype)
            if self.projs[0] is not None:
                emb = emb @ self.projs[0][...].astype(dtype)
            return emb * jnp.asarray(scale, dtype)
        out = jnp.zeros(ids.shape + (self.d_proj,), dtype)
        for k, (s, e) in enumerate(self.bounds):
            local = jnp.clip(ids - s, 0, e - s - 1)
            emb_k = take_rows(self.tables[k][...], local, dtype) @ self.projs[k][...].astype(dtype)
            out = jnp.where(((ids >= s) & (ids < e))[..., None], emb_k, out)
        return out * jnp.asarray(scale, dtype)


class AdaptiveLogSoftmax(nnx.Module):
    """Projected adaptive log-softmax over `vocab_size` classes (see module doc).

    Own parameters: output biases (one `[V]` vector when div_val == 1, else one per cluster), the tail-cluster
    logits `cluster_weight [K, d_embed]` / `cluster_bias [K]`, and output tables / projections that are not tied
    to `embedding` (`tie_weights=False`, or `tie_projs[k]` False). Call `log_probs(h, embedding)` or
    `nll(h, labels, embedding)`, passing the model's `AdaptiveEmbedding` (tied weights are read from it).
    """

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_proj: int,
        cutoffs: Sequence[int] = (),
        div_val: int = 1,
        *,
        tie_weights: bool = True,
        tie_projs: Optional[Sequence[bool]] = None,
        init_std: float = 0.02,
        proj_init_std: float = 0.01,
        block_size: int = 32768,
        chunk_size: int = 256,
        rows_multiple: int = 1,
        rngs: nnx.Rngs,
    ):
        self.vocab_size, self.d_embed, self.d_proj, self.div_val = vocab_size, d_embed, d_proj, div_val
        self.bounds = tuple(cluster_bounds(vocab_size, cutoffs))
        n_clusters = len(self.bounds) - 1
        self.dims = tuple(cluster_dims(d_embed, n_clusters, div_val))
        tie_projs = tuple(tie_projs) if tie_projs is not None else (False,) * (n_clusters + 1)
        if len(tie_projs) != n_clusters + 1:
            raise ValueError(f"tie_projs has {len(tie_projs)} entries; expected {n_clusters + 1} (head + tails)")
        self.tie_weights, self.tie_projs = tie_weights, tie_projs
        self.block_size, self.chunk_size = block_size, chunk_size
        rows = _stored_table_rows(vocab_size, cutoffs, div_val, rows_multiple)
        self.tables = None if tie_weights else _tables(rngs, rows, self.dims, init_std)
        self.biases = nnx.List([param(rngs, zeros, (r,), ("vocab",)) for _, r in rows])
        projs = []
        for k in range(n_clusters + 1):
            d_k = self.dims[0 if div_val == 1 else k]
            needs = d_k != d_proj if div_val == 1 else True
            own = needs and not tie_projs[k]
            projs.append(param(rngs, normal(proj_init_std), (d_k, d_proj), (None, "embed")) if own else None)
        self.projs = nnx.List(projs)
        if n_clusters:
            self.cluster_weight = param(rngs, normal(init_std), (n_clusters, d_embed), (None, "embed"))
            self.cluster_bias = param(rngs, zeros, (n_clusters,), (None,))
        self.n_clusters = n_clusters

    # -- weights of one cluster ------------------------------------------------------------------------------------
    def cluster_weights(self, k: int, embedding: Optional[AdaptiveEmbedding]):
        """(table `[R_k, d_k]`, bias `[R_k]`, projection `[d_k, d_proj]` or None) of output cluster k: R_k is its
        stored rows, the V_k real ones first; the bias is -inf (finite) on the padding rows."""
        s, e = self.bounds[k]
        t = 0 if self.div_val == 1 else k
        if self.tie_weights:
            if embedding is None:
                raise ValueError("tied adaptive softmax needs the AdaptiveEmbedding it is tied to")
            table = embedding.output_table(t)
        else:
            table = self.tables[t][...]
        bias = self.biases[t][...]
        if self.div_val == 1:
            table, bias = table[s:e], bias[s:e]
        elif bias.shape[0] > e - s:  # stored padding rows: probability 0
            bias = jnp.where(jnp.arange(bias.shape[0]) < e - s, bias, jnp.asarray(_NEG, bias.dtype))
        proj = self.projs[k]
        if proj is not None:
            proj = proj[...]
        elif self.tie_projs[k] and (self.div_val != 1 or self.dims[0] != self.d_proj):
            if embedding is None:
                raise ValueError("adaptive softmax with tied projections needs the AdaptiveEmbedding")
            proj = embedding.output_proj(t)
        return table, bias, proj

    @staticmethod
    def _project(h: jax.Array, proj: Optional[jax.Array]) -> jax.Array:
        return h if proj is None else h @ proj.astype(h.dtype).T

    def _head(self, h: jax.Array, embedding):
        """Projected hidden `[..., d_embed]` and the head logits (shortlist + cluster logits), float32."""
        table, bias, proj = self.cluster_weights(0, embedding)
        hp = self._project(h, proj)
        logits = jnp.einsum("...d,vd->...v", hp, table.astype(hp.dtype), preferred_element_type=jnp.float32)
        logits = logits + bias.astype(jnp.float32)
        if self.n_clusters:
            c = jnp.einsum(
                "...d,kd->...k", hp, self.cluster_weight[...].astype(hp.dtype), preferred_element_type=jnp.float32
            ) + self.cluster_bias[...].astype(jnp.float32)
            logits = jnp.concatenate([logits, c], -1)
        return hp, logits

    # -- outputs ---------------------------------------------------------------------------------------------------
    def log_probs(self, h: jax.Array, embedding: Optional[AdaptiveEmbedding] = None) -> jax.Array:
        """Full log-probabilities `[..., V]` (float32) for hidden states h `[..., d_proj]`."""
        _, head_logits = self._head(h, embedding)
        head_lp = jax.nn.log_softmax(head_logits, -1)
        shortlist = self.bounds[0][1]
        rows0 = head_logits.shape[-1] - self.n_clusters  # the head table's stored rows; cluster logits after them
        parts = [head_lp[..., :shortlist]]
        for k in range(1, self.n_clusters + 1):
            s, e = self.bounds[k]
            table, bias, proj = self.cluster_weights(k, embedding)
            hk = self._project(h, proj)
            logits = jnp.einsum("...d,vd->...v", hk, table.astype(hk.dtype), preferred_element_type=jnp.float32)
            parts.append(
                head_lp[..., rows0 + k - 1 : rows0 + k]
                + jax.nn.log_softmax(logits + bias.astype(jnp.float32), -1)[..., : e - s]
            )
        return jnp.concatenate(parts, -1)

    def nll(self, h: jax.Array, labels: jax.Array, embedding: Optional[AdaptiveEmbedding] = None) -> jax.Array:
        """-log p(labels) `[...]` (float32) for h `[..., d_proj]`, labels `[...]`; labels < 0 are ignored (nll 0).

        Head (every token): gathered target logit minus the log-normaliser over the shortlist and the cluster
        logits. Tails: only the tokens whose label lies in a tail cluster pay for that cluster, as in the
        original GPU code, but with static shapes: they are sorted by cluster into `chunk_size` chunks (each
        cluster padded to whole chunks) and a checkpointed scan runs `lax.switch` to the chunk's cluster
        (gathered target logit minus the cluster's blocked logsumexp). Nothing of size `[tokens, V]` is built.
        Lowered for TPU, where the log-normaliser is a kernel that keeps the logits in VMEM, every tail cluster runs
        once over all tokens instead (`operands.dense_tail_clusters`).
        """
        lead = labels.shape
        h = h.reshape(-1, h.shape[-1])
        labels = labels.reshape(-1)
        table0, bias0, proj0 = self.cluster_weights(0, embedding)
        h0 = self._project(h, proj0)
        head_table, head_bias = table0, bias0
        if self.n_clusters:
            head_table = jnp.concatenate([table0, self.cluster_weight[...].astype(table0.dtype)], 0)
            head_bias = jnp.concatenate([bias0, self.cluster_bias[...].astype(bias0.dtype)], 0)
        cluster = jnp.zeros_like(labels)
        for k, (s, _) in enumerate(self.bounds[1:], start=1):
            cluster = jnp.where(labels >= s, k, cluster)
        rows0 = table0.shape[0]  # stored rows: the cluster logits follow them
        head_col = jnp.clip(jnp.where(cluster == 0, labels, rows0 + cluster - 1), 0, head_table.shape[0] - 1)
        lp = target_log_probs(h0, head_table, head_bias, head_col, block=self.block_size)
        if self.n_clusters:
            lp = lp + self._tail_log_probs(h, labels, cluster, embedding)
        return jnp.where(labels >= 0, -lp, 0.0).reshape(lead)

    def _tail_log_probs(self, h: jax.Array, labels: jax.Array, cluster: jax.Array, embedding) -> jax.Array:
        """log softmax_k(h)[label - c_k] for tokens of tail cluster k = cluster > 0, 0 for the others. `[N]`.

        Run per device on its own tokens (`sharding.per_shard`, the tail weights gathered whole): the sort by
        cluster is data-dependent, and over the global batch it would make every device run every chunk, with the
        chunk logits all-reduced over the fsdp-sharded embedding dimension (46x the FSDP ideal communication of
        the WikiText-103 plan)."""
        weights = [self.cluster_weights(k, embedding) for k in range(self.n_clusters + 1)]
        local = per_shard(
            self._tail_log_probs_local,
            (TOKENS, ("activation_batch",), ("activation_batch",), None),
            ("activation_batch",),
        )
        return local(h, labels, cluster, weights)

    def _tail_log_probs_local(self, h: jax.Array, labels: jax.Array, cluster: jax.Array, weights) -> jax.Array:
        if operands.dense_tail_clusters(h.shape[0], [w[0].shape[1] for w in weights[1:]], h.dtype):
            return self._tail_log_probs_dense(h, labels, cluster, weights)
        n, n_tails, c = labels.shape[0], self.n_clusters, self.chunk_size
        key = jnp.where(cluster > 0, cluster, n_tails + 1)  # tails first, by cluster; head tokens last
        order = jnp.argsort(key, stable=True)
        sorted_key = key[order]
        counts = jnp.stack([(key == k).sum() for k in range(1, n_tails + 1)])
        padded = (counts + c - 1) // c * c
        ends = jnp.cumsum(padded)
        starts, firsts = ends - padded, jnp.cumsum(counts) - counts
        n_slots = (-(-n // c) + n_tails) * c  # static bound: every cluster pads by < c
        k0 = jnp.clip(sorted_key - 1, 0, n_tails - 1)
        slot = jnp.where(sorted_key <= n_tails, starts[k0] + jnp.arange(n) - firsts[k0], n_slots)
        src = jnp.full((n_slots,), n, jnp.int32).at[slot].set(order.astype(jnp.int32), mode="drop")
        chunk_src = src.reshape(-1, c)
        chunk_cluster = jnp.searchsorted(ends, jnp.arange(n_slots // c) * c, side="right")  # 0-based tail index
        branch = jnp.where(chunk_cluster < n_tails, chunk_cluster + 1, 0)  # 0: past the last tail chunk

        h_pad = jnp.concatenate([h, jnp.zeros_like(h[:1])], 0)  # row n: padding
        labels_pad = jnp.concatenate([labels, jnp.zeros_like(labels[:1])], 0)

        def tail_branch(k):
            s, e = self.bounds[k]
            table, bias, proj = weights[k]

            def run(hc, lc):
                hk = self._project(hc, proj)
                local = jnp.clip(lc - s, 0, e - s - 1)
                return target_log_probs(hk, table, bias, local, block=self.block_size)

            return run

        branches = [lambda hc, lc: lc.astype(jnp.float32) * 0.0] + [  # (typed like the others under shard_map)
            tail_branch(k) for k in range(1, n_tails + 1)
        ]

        @jax.checkpoint
        def step(_, xs):
            idx, br = xs
            return None, jax.lax.switch(br, branches, h_pad[idx], labels_pad[idx])

        _, out = jax.lax.scan(step, None, (chunk_src, branch))
        return jnp.zeros((n + 1,), jnp.float32).at[src].set(out.reshape(-1))[:n]

    def _tail_log_probs_dense(self, h: jax.Array, labels: jax.Array, cluster: jax.Array, weights) -> jax.Array:
        """`_tail_log_probs_local` with every tail cluster run once over all of the device's tokens, each token's
        value taken from its own cluster (`operands.dense_tail_clusters`: for TPU lowering, the logits in VMEM)."""
        out = jnp.zeros(labels.shape, jnp.float32)
        for k in range(1, self.n_clusters + 1):
            s, e = self.bounds[k]
            table, bias, proj = weights[k]
            hk = self._project(h, proj)
            local = jnp.clip(labels - s, 0, e - s - 1)
            lp = target_log_probs(hk, table, bias, local, block=self.block_size)
            out = jnp.where(cluster == k, lp, out)
        return out


def _target_logit(h: jax.Array, table: jax.Array, bias: jax.Array, idx: jax.Array) -> jax.Array:
    """h[n] · table[idx[n]] + bias[idx[n]] (float32) by row gathers: h `[N, d]`, idx `[N]` -> `[N]`."""
    rows = jnp.take(table, idx, axis=0).astype(h.dtype)
    return jnp.einsum("nd,nd->n", h, rows, preferred_element_type=jnp.float32) + jnp.take(bias, idx).astype(jnp.float32)
