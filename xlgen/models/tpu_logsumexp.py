"""The adaptive softmax's log-normaliser for TPU: logits of vocabulary blocks formed and reduced in VMEM by a Pallas
kernel, never written to HBM.

For h `[N, d]`, table `[V, d]`, bias `[V]` (float32 results, products accumulated in float32):

    z[n, v] = h[n] · table[v] + bias[v],       lse[n] = log sum_v exp z[n, v]
    p[n, v] = g[n] · exp(z[n, v] - lse[n])     (g = the cotangent of lse)
    dh = p · table,   dtable = p^T · h,   dbias[v] = sum_n p[n, v]

With targets y `[N]` (`nll_rows`, the loss -log softmax(z)[y] = lse - z[n, y[n]]): the forward kernel also sums each
row's target logit over the vocabulary blocks, and the backward kernel takes p = g · (exp(z - lse) - onehot(y)), so
the target rows' gradient is inside dtable and dbias. The XLA form gathers the target rows and scatters their
gradient into a table-sized float32 buffer per device (WikiText-103 large: 0.9 ms per v3 core per step).

The XLA form (`adaptive_softmax.logsumexp_rows`) writes every `[N, block]` float32 logits block to HBM and reads it
back, in the forward pass and again in the backward pass that recomputes it; with the tail clusters' widths (d = 64
to 256 against v3's ridge of 137 FLOP/byte) that traffic, not the products, sets the time. Here the forward kernel
runs over a grid of (row blocks, vocabulary blocks), the vocabulary axis innermost, with the running max m and sum
s of an online logsumexp in VMEM scratch (s <- s·exp(m - m') + sum_v exp(z - m'), m' = max(m, max_v z)); the
backward kernel runs over (vocabulary blocks, row blocks), recomputes each block's logits in VMEM and accumulates
dtable and dbias in the output block of its vocabulary block (resident while the inner row axis runs) and dh in an
output holding all N rows (resident for the whole grid, hence the VMEM bound of `applies`). HBM traffic: the table
once per row block in the forward pass, the table read and its gradient written once in the backward pass, the rows
once each. Mosaic's matmuls on v3 take float32 operands only: the operands are rounded to h's dtype (as the XLA
form's) and multiplied in float32 (the kernels' FLOPs, 2·N·V·d forward and 6·N·V·d backward, are the XLA form's,
which recomputes the logits too; they reach the roofline through the kernels' cost estimates).

Cost (v3, per core, `xlgen.plan.roofline`): Transformer-XL WikiText-103 large's adaptive softmax loss and gradient
at its per-core shapes (768 bfloat16 rows, cutoffs 20000/40000/200000, div_val 4) takes 18.0 ms roofline and 7.7 GB
of HBM traffic with these kernels and the tail clusters in chunks of 256 tokens, against 34.8 ms and 15.3 GB for the
XLA form (3.7 ms of matmul FLOPs at peak either way), and 6.3 ms and 2.1 GB with every tail cluster once over all
tokens (`operands.dense_tail_clusters`); one chunk against a 160,000 x 128 table, forward and backward, moves
255 MB against the XLA form's 1656 MB (docs/pod_scale.md).

Blocks: the last vocabulary block runs past V (its table rows are zeroed and its logits set to -1e30 in VMEM: no
padded copy of the table); the rows are padded to whole row blocks (zero rows, zero cotangent, log-normaliser
1e30) and cut off again. The table is taken as `[V, d]`, the layout XLA:TPU gives it inside the tail clusters'
chunk scan (a `[d, V]` operand cost a copy each way there). A `custom_vjp` (the kernels are not differentiable).
Runs per device: called inside `shard_map` (the adaptive softmax's tail clusters run per device already) as it
is, else under `xlgen.sharding.per_shard` (rows split as the tokens, weights whole), so the partitioner never
gathers a custom call's operand. `interpret=True` runs the same kernels through JAX on any backend (the tests
compare them with the XLA form on the CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xlgen import sharding

ROW_BLOCK = 256  # rows of h per block
ROW_MULTIPLE = 16  # bfloat16 vregs pack 16 sublanes
LANES = 128
VOCAB_BLOCK = 1024  # at most this many vocabulary entries per block
TABLE_BLOCK_BYTES = 2**20  # float32 bytes of one table block [bv, d] (bv reduced for wide tables)
RESIDENT_BYTES = 8 * 2**20  # h and float32 dh, double-buffered, kept whole in VMEM by the backward kernel
ROWS = ("activation_batch", None)  # h `[N, d]`: rows split as the tokens, the width whole
TRANS_B = (((1,), (1,)), ((), ()))  # [n, d] x [bv, d] -> [n, bv]
_NEG = -1e30  # logit of vocabulary entries past V in the last block (as adaptive_softmax's padding)


def row_blocks(n: int) -> tuple:
    """(padded rows, rows per block): blocks of at most ROW_BLOCK rows, a multiple of 16."""
    rows = min(ROW_BLOCK, -(-n // ROW_MULTIPLE) * ROW_MULTIPLE)
    return -(-n // rows) * rows, rows


def vocab_block(vocab: int, width: int) -> int:
    """Vocabulary entries per block: all of them when they fit one block, else a multiple of 128 lanes of at most
    VOCAB_BLOCK entries and TABLE_BLOCK_BYTES of float32 table (the last block runs past V: masked)."""
    cap = max(LANES, min(VOCAB_BLOCK, TABLE_BLOCK_BYTES // (4 * width)) // LANES * LANES)
    return vocab if vocab <= cap else cap


def applies(n: int, width: int, dtype) -> bool:
    """Whether `[n, width]` rows (per device) fit the backward kernel's VMEM-resident h and dh."""
    n_pad, _ = row_blocks(n)
    return 2 * n_pad * width * (jnp.dtype(dtype).itemsize + 4) <= RESIDENT_BYTES


def _operand(x, dtype):
    """x rounded to `dtype` (the XLA form's product operands), held in float32: Mosaic's matmuls on v3 take float32
    operands only (bfloat16 ones fail to compile)."""
    return x.astype(dtype).astype(jnp.float32)


def _block(h, t_ref, b_ref, j, vocab: int):
    """(h, vocabulary block j of the table `[bv, d]` with zero rows past V, z = h · block^T + bias `[rows, bv]`
    with -1e30 past V), float32, the products' operands rounded to h's dtype."""
    bv = t_ref.shape[0]
    entries = j * bv + jax.lax.broadcasted_iota(jnp.int32, (bv, 1), 0) < vocab
    t = jnp.where(entries, _operand(t_ref[...], h.dtype), 0.0)
    h = _operand(h, h.dtype)
    z = jax.lax.dot_general(h, t, TRANS_B, preferred_element_type=jnp.float32) + b_ref[...]
    return h, t, jnp.where(j * bv + jax.lax.broadcasted_iota(jnp.int32, (1, bv), 1) < vocab, z, _NEG)


def _hits(y, j, bv: int):
    """`[rows, bv]` mask of each row's target entry (y `[rows, 1]`, -1: none) in vocabulary block j."""
    return j * bv + jax.lax.broadcasted_iota(jnp.int32, (1, bv), 1) == y


def _forward_kernel(*refs, vocab: int, target: bool):
    from jax.experimental import pallas as pl

    if target:  # the target logit z[n, y[n]] summed into its own output over the vocabulary blocks
        h_ref, t_ref, b_ref, y_ref, o_ref, zt_ref, m_ref, s_ref = refs
    else:
        (h_ref, t_ref, b_ref, o_ref, m_ref, s_ref), y_ref, zt_ref = refs, None, None
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
        s_ref[...] = jnp.zeros(s_ref.shape, jnp.float32)
        if target:
            zt_ref[...] = jnp.zeros(zt_ref.shape, jnp.float32)

    _, _, z = _block(h_ref[...], t_ref, b_ref, j, vocab)
    m = m_ref[...]
    m_new = jnp.maximum(m, z.max(axis=1, keepdims=True))
    s_ref[...] = s_ref[...] * jnp.exp(m - m_new) + jnp.exp(z - m_new).sum(axis=1, keepdims=True)
    m_ref[...] = m_new
    if target:
        zt_ref[...] += jnp.where(_hits(y_ref[...], j, t_ref.shape[0]), z, 0.0).sum(axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = m_ref[...] + jnp.log(s_ref[...])


def _backward_kernel(*refs, rows: int, vocab: int, target: bool):
    from jax.experimental import pallas as pl

    if target:
        h_ref, t_ref, b_ref, lse_ref, g_ref, y_ref, dh_ref, dt_ref, db_ref = refs
    else:
        h_ref, t_ref, b_ref, lse_ref, g_ref, dh_ref, dt_ref, db_ref = refs

    j, i = pl.program_id(0), pl.program_id(1)  # vocabulary block, row block (innermost)

    @pl.when((j == 0) & (i == 0))
    def _():
        dh_ref[...] = jnp.zeros(dh_ref.shape, jnp.float32)

    @pl.when(i == 0)
    def _():
        dt_ref[...] = jnp.zeros(dt_ref.shape, jnp.float32)
        db_ref[...] = jnp.zeros(db_ref.shape, jnp.float32)

    r = pl.ds(pl.multiple_of(i * rows, rows), rows)
    h, t, z = _block(h_ref[r, :], t_ref, b_ref, j, vocab)
    p = jnp.exp(z - lse_ref[r, :]) * g_ref[r, :]  # [rows, bv]: 0 past V
    if target:  # d(lse - z[y]) / dz = softmax - onehot(y)
        p = p - jnp.where(_hits(y_ref[r, :], j, t_ref.shape[0]), g_ref[r, :], 0.0)
    dh_ref[r, :] += jnp.dot(p, t, preferred_element_type=jnp.float32)
    dt_ref[...] += jnp.dot(p.T, h, preferred_element_type=jnp.float32)  # p transposed in float32
    db_ref[...] += p.sum(axis=0, keepdims=True)


def _mosaic(*semantics):
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=semantics)


def _target_column(target, n_pad: int):
    """Targets `[N]` as the kernels' `[n_pad, 1]` int32 column (padded rows: -1, no entry)."""
    return jnp.pad(target.astype(jnp.int32), (0, n_pad - target.shape[0]), constant_values=-1)[:, None]


def _forward(h, table, bias, target, interpret):
    """(lse `[N]`, the target logits z[n, target[n]] `[N]` or None) of h `[N, d]` over table `[V, d]` and bias `[V]`
    (float32); `target` `[N]` int or None."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    n, width = h.shape
    vocab = bias.shape[0]
    n_pad, rows = row_blocks(n)
    bv = vocab_block(vocab, width)
    hp = jnp.pad(h, ((0, n_pad - n), (0, 0)))
    column = pl.BlockSpec((rows, 1), lambda i, j: (i, 0))
    typed = jax.ShapeDtypeStruct((n_pad, 1), jnp.float32, manual_axis_type=jax.typeof(hp).manual_axis_type)
    extra = () if target is None else (_target_column(target, n_pad),)
    out = pl.pallas_call(
        functools.partial(_forward_kernel, vocab=vocab, target=target is not None),
        name="logsumexp_forward",
        grid=(n_pad // rows, pl.cdiv(vocab, bv)),
        in_specs=[
            pl.BlockSpec((rows, width), lambda i, j: (i, 0)),
            pl.BlockSpec((bv, width), lambda i, j: (j, 0)),
            pl.BlockSpec((1, bv), lambda i, j: (0, j)),
        ]
        + [column] * len(extra),
        out_specs=[column] * (1 + len(extra)),
        out_shape=[typed] * (1 + len(extra)),
        scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32)],
        compiler_params=_mosaic("parallel", "arbitrary"),
        cost_estimate=pl.CostEstimate(
            flops=2 * n_pad * vocab * width,
            transcendentals=n_pad * vocab,
            bytes_accessed=hp.nbytes + (n_pad // rows) * 4 * vocab * (width + 1) + 4 * n_pad * (1 + 2 * len(extra)),
        ),
        interpret=interpret,
    )(hp, table, bias[None], *extra)
    return out[0][:n, 0], (None if target is None else out[1][:n, 0])


def _backward(h, table, bias, target, lse, g, interpret):
    """(dh `[N, d]`, dtable `[V, d]` float32, dbias `[V]`) for the cotangent g `[N]` of lse, or of lse minus the
    target logits when `target` is given."""
    from jax.experimental import pallas as pl

    n, width = h.shape
    vocab = bias.shape[0]
    n_pad, rows = row_blocks(n)
    bv = vocab_block(vocab, width)
    hp = jnp.pad(h, ((0, n_pad - n), (0, 0)))
    column = lambda x, fill: jnp.pad(x.astype(jnp.float32), (0, n_pad - n), constant_values=fill)[:, None]  # noqa: E731
    whole = lambda j, i: (0, 0)  # noqa: E731
    block = lambda j, i: (0, j)  # noqa: E731
    typed = functools.partial(jax.ShapeDtypeStruct, manual_axis_type=jax.typeof(hp).manual_axis_type)
    extra = () if target is None else (_target_column(target, n_pad),)
    dh, dt, db = pl.pallas_call(
        functools.partial(_backward_kernel, rows=rows, vocab=vocab, target=target is not None),
        name="logsumexp_backward",
        grid=(pl.cdiv(vocab, bv), n_pad // rows),
        in_specs=[
            pl.BlockSpec((n_pad, width), whole),
            pl.BlockSpec((bv, width), lambda j, i: (j, 0)),
            pl.BlockSpec((1, bv), block),
            pl.BlockSpec((n_pad, 1), whole),
            pl.BlockSpec((n_pad, 1), whole),
        ]
        + [pl.BlockSpec((n_pad, 1), whole)] * len(extra),
        out_specs=[
            pl.BlockSpec((n_pad, width), whole),
            pl.BlockSpec((bv, width), lambda j, i: (j, 0)),
            pl.BlockSpec((1, bv), block),
        ],
        out_shape=[typed((n_pad, width), jnp.float32), typed(table.shape, jnp.float32), typed((1, vocab), jnp.float32)],
        compiler_params=_mosaic("arbitrary", "arbitrary"),  # dh is revisited by every vocabulary block
        cost_estimate=pl.CostEstimate(
            flops=6 * n_pad * vocab * width,
            transcendentals=n_pad * vocab,
            bytes_accessed=hp.nbytes + 8 * (width + 1) * vocab + 4 * n_pad * (width + 2 + len(extra)),
        ),
        interpret=interpret,
    )(hp, table, bias[None], column(lse, -_NEG), column(g, 0.0), *extra)  # padded rows: p = exp(z - 1e30) · 0 = 0
    return dh[:n].astype(h.dtype), dt, db[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _logsumexp(h, table, bias, interpret):
    return _forward(h, table, bias, None, interpret)[0]


def _logsumexp_fwd(h, table, bias, interpret):
    lse = _forward(h, table, bias, None, interpret)[0]
    return lse, (h, table, bias, lse)


def _logsumexp_bwd(interpret, residuals, g):
    h, table, bias, lse = residuals
    dh, dt, db = _backward(h, table, bias, None, lse, g, interpret)
    return dh, dt.astype(table.dtype), db


_logsumexp.defvjp(_logsumexp_fwd, _logsumexp_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _nll(h, table, bias, target, interpret):
    lse, zt = _forward(h, table, bias, target, interpret)
    return lse - zt


def _nll_fwd(h, table, bias, target, interpret):
    lse, zt = _forward(h, table, bias, target, interpret)
    return lse - zt, (h, table, bias, target, lse)


def _nll_bwd(interpret, residuals, g):
    h, table, bias, target, lse = residuals
    dh, dt, db = _backward(h, table, bias, target, lse, g, interpret)
    return dh, dt.astype(table.dtype), db, None


_nll.defvjp(_nll_fwd, _nll_bwd)


def logsumexp_rows(h: jax.Array, table: jax.Array, bias: jax.Array, *, interpret: bool = False) -> jax.Array:
    """logsumexp_v (h · table[v] + bias[v]) in float32 for h `[N, d]`, table `[V, d]`, bias `[V]` -> `[N]`
    (`adaptive_softmax.logsumexp_rows`), by the kernels above, per device."""
    bias = bias.astype(jnp.float32)
    fn = lambda h, table, bias: _logsumexp(h, table, bias, interpret)  # noqa: E731
    if jax.sharding.get_abstract_mesh().manual_axes:  # already per device (inside shard_map)
        return fn(h, table, bias)
    return sharding.per_shard(fn, (ROWS, None, None), ("activation_batch",), check_vma=not interpret)(h, table, bias)


def nll_rows(
    h: jax.Array, table: jax.Array, bias: jax.Array, target: jax.Array, *, interpret: bool = False
) -> jax.Array:
    """-log softmax_v (h · table[v] + bias[v])[target] in float32 `[N]` for targets `[N]` (ints in [0, V)): the
    log-normaliser minus the target logit, both from the kernels above (`adaptive_softmax.target_log_probs`). The
    backward kernel takes the target's one-hot off the softmax in VMEM, dz = g · (softmax - onehot), so the table's
    gradient has no separate scatter of the target rows (a table-sized buffer per device). Per device."""
    bias = bias.astype(jnp.float32)
    fn = lambda h, table, bias, target: _nll(h, table, bias, target, interpret)  # noqa: E731
    if jax.sharding.get_abstract_mesh().manual_axes:
        return fn(h, table, bias, target)
    rows = ("activation_batch",)
    return sharding.per_shard(fn, (ROWS, None, None, rows), rows, check_vma=not interpret)(h, table, bias, target)
