"""Funnel-Transformer: parity with transformers 4.34.1 (random weights, every HF class, both attention types, padding,
two segments, shared and unshared layouts), shapes via jax.eval_shape, factorized == rel_shift, and the objectives.

Compile time dominates on CPU, so models are tiny, each case compiles once, and jit uses XLA's -O0 backend.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import xlgen
from xlgen.models import relative_attention as RA
from xlgen.models.funnel import heads as FH
from xlgen.models.funnel import model as F
from xlgen.models.params import materialize

FAST = {"xla_backend_optimization_level": 0}
TINY = dict(vocab_size=40, d_model=16, n_head=2, d_head=8, d_inner=32)


def _inputs(arch, seq_len, seed=0):
    """Two segments (<cls> has token type 2 as in the Funnel tokenizer) and right padding in row 1."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, TINY["vocab_size"], (2, seq_len))
    tt = np.zeros((2, seq_len), np.int64)
    tt[:, seq_len // 2 :] = 1
    tt[:, 0] = 2
    am = np.ones((2, seq_len), np.int64)
    am[1, seq_len - 3 :] = 0
    if arch == "FunnelForMultipleChoice":
        ids, tt, am = (np.stack([x, np.roll(x, 1, axis=1)], 1) for x in (ids, tt, am))
    return ids, tt, am


PARITY_CASES = [
    # (HF class, attention_type, extra HF config, sequence length)
    ("FunnelModel", "relative_shift", dict(block_sizes=[1, 2], block_repeats=[2, 1], num_decoder_layers=1), 11),
    ("FunnelModel", "factorized", dict(block_sizes=[1, 1, 1], num_decoder_layers=2), 12),
    ("FunnelBaseModel", "relative_shift", dict(block_sizes=[1, 1, 1], block_repeats=[1, 2, 1], pool_q_only=False), 12),
    ("FunnelBaseModel", "factorized", dict(block_sizes=[1, 1, 1], separate_cls=False, pooling_type="max"), 11),
    ("FunnelForPreTraining", "relative_shift", dict(block_sizes=[1, 1], truncate_seq=False, num_decoder_layers=1), 11),
    ("FunnelForPreTraining", "factorized", dict(block_sizes=[1, 1], num_decoder_layers=1), 12),
    ("FunnelForMaskedLM", "relative_shift", dict(block_sizes=[1, 1], num_decoder_layers=1), 12),
    ("FunnelForMaskedLM", "factorized", dict(block_sizes=[1, 1], truncate_seq=False, num_decoder_layers=1), 11),
    ("FunnelForSequenceClassification", "relative_shift", dict(block_sizes=[1, 1, 1], num_labels=3), 12),
    ("FunnelForSequenceClassification", "factorized", dict(block_sizes=[2, 1], num_labels=1), 11),
    ("FunnelForQuestionAnswering", "relative_shift", dict(block_sizes=[1, 1], num_decoder_layers=1), 11),
    ("FunnelForQuestionAnswering", "factorized", dict(block_sizes=[1, 1, 1], num_decoder_layers=1), 12),
    ("FunnelForMultipleChoice", "relative_shift", dict(block_sizes=[1, 1]), 12),
    ("FunnelForMultipleChoice", "factorized", dict(block_sizes=[1, 1]), 11),
    (
        "FunnelForTokenClassification",
        "relative_shift",
        dict(block_sizes=[1, 1], num_decoder_layers=1, num_labels=5),
        11,
    ),
    ("FunnelForTokenClassification", "factorized", dict(block_sizes=[1, 2], num_decoder_layers=1, num_labels=3), 12),
]


def _save_hf(tmp_path, arch, attention_type, extra):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hc = transformers.FunnelConfig(
        **TINY,
        attention_type=attention_type,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, arch)(hc).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


@pytest.mark.parametrize(
    "arch,attention_type,extra,seq_len", PARITY_CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(PARITY_CASES)]
)
def test_parity_with_transformers(tmp_path, arch, attention_type, extra, seq_len):
    import torch

    ref_model = _save_hf(tmp_path, arch, attention_type, extra)
    ids, tt, am = _inputs(arch, seq_len)
    with torch.no_grad():
        ref = ref_model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(tt), attention_mask=torch.tensor(am))
    ours = xlgen.from_pretrained(str(tmp_path), compiler_options=FAST)
    assert ours.architecture == arch and ours.config.attention_type == attention_type
    out = ours(ids, token_type_ids=tt, attention_mask=am)
    checked = 0
    for field in ("last_hidden_state", "logits", "start_logits", "end_logits"):
        r = getattr(ref, field, None)
        if r is None:
            continue
        o = np.asarray(getattr(out, field))
        r = r.numpy().reshape(o.shape) if field == "logits" and arch == "FunnelForPreTraining" else r.numpy()
        assert o.shape == r.shape, (field, o.shape, r.shape)
        err = float(np.abs(o - r).max())
        print(f"parity {arch} {attention_type} {extra} {field}: max|diff| = {err:.2e}")
        assert err < 1e-4, (field, err)
        checked += 1
    assert checked >= 1


def test_factorized_equals_rel_shift_on_same_weights(tmp_path):
    """Same HF weights, both position forms selected by config: identical outputs (shared layout, padding)."""
    _save_hf(
        tmp_path,
        "FunnelModel",
        "relative_shift",
        dict(block_sizes=[1, 1, 1], block_repeats=[1, 2, 1], num_decoder_layers=1),
    )
    ids, tt, am = _inputs("FunnelModel", 16)
    a = xlgen.from_pretrained(str(tmp_path), compiler_options=FAST)(ids, tt, am)
    b = xlgen.from_pretrained(str(tmp_path), compiler_options=FAST, attention_type="factorized")(ids, tt, am)
    np.testing.assert_allclose(np.asarray(a.last_hidden_state), np.asarray(b.last_hidden_state), atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(a.encoder_last_hidden_state), np.asarray(b.encoder_last_hidden_state), atol=1e-5
    )


def test_bfloat16_and_remat_close_to_float32(tmp_path):
    _save_hf(tmp_path, "FunnelForMaskedLM", "relative_shift", dict(block_sizes=[1, 1], num_decoder_layers=1))
    ids, tt, am = _inputs("FunnelForMaskedLM", 12)
    a = xlgen.from_pretrained(str(tmp_path), compiler_options=FAST)(ids, tt, am)
    b = xlgen.from_pretrained(str(tmp_path), compiler_options=FAST, dtype="bfloat16", remat=True)(ids, tt, am)
    assert b.last_hidden_state.dtype == jnp.bfloat16 and b.logits.dtype == jnp.float32
    scale = float(np.abs(np.asarray(a.logits)).max())
    assert float(np.abs(np.asarray(a.logits) - np.asarray(b.logits)).max()) < 0.02 * scale


@pytest.mark.parametrize("q_stride,k_stride,q0,k0", [(1, 1, 0, 0), (2, 1, -1, 0), (4, 4, -3, -3), (4, 2, -3, -1)])
def test_factorized_position_scores_match_strided_shift(q_stride, k_stride, q0, k0):
    """Core: trig-identity scores == W_r-projected sinusoids of the distance sequence + strided relative_shift."""
    klen = 10
    qlen = klen * k_stride // q_stride
    d_model, n, dh = 12, 2, 4
    rng = np.random.RandomState(0)
    q_head, w_r, v_bias = (rng.randn(*s).astype(np.float32) for s in [(2, qlen, n, dh), (d_model, n, dh), (n, dh)])
    q_pos, k_pos = q0 + q_stride * np.arange(qlen), k0 + k_stride * np.arange(klen)
    shift = q_stride // k_stride
    dist = F.relative_distances(q_pos, k_pos, k_stride, shift)

    @jax.jit
    def scores(q_head, w_r, v_bias):
        r = jnp.einsum("rD,Dnd->rnd", RA.sinusoid_embedding(jnp.asarray(dist), d_model), w_r)
        shifted = RA.position_scores(q_head, r, v_bias, klen=klen, offset=shift * qlen, stride=shift)
        q_enc, k_enc = RA.factorized_position_encodings(jnp.asarray(q_pos), jnp.asarray(k_pos), d_model)
        factorized = RA.factorized_position_scores(q_head, w_r, v_bias, q_enc, k_enc)
        naive = jnp.einsum(
            "bind,ijD,Dnd->bnij",
            q_head + v_bias,
            RA.sinusoid_embedding(jnp.asarray(q_pos[:, None] - k_pos[None, :]), d_model),
            w_r,
        )
        return shifted, factorized, naive

    shifted, factorized, naive = scores(q_head, w_r, v_bias)
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(naive), atol=1e-4)
    np.testing.assert_allclose(np.asarray(factorized), np.asarray(naive), atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Structure and shapes (jax.eval_shape: nothing is compiled)
# ----------------------------------------------------------------------------------------------------------------


def test_block_layout_notation():
    assert F.parse_block_layout("6-3x2-3x2") == ((6, 3, 3), (1, 2, 2))
    assert F.parse_block_layout("6_6_6") == ((6, 6, 6), (1, 1, 1))
    cfg = F.FunnelConfig(block_sizes="1x2-1")
    assert cfg.block_sizes == (1, 1) and cfg.block_repeats == (2, 1) and cfg.layout == "B1x2-1"
    assert dataclasses.replace(cfg, block_sizes="3-3x2-3x2").block_repeats == (1, 2, 2)
    with pytest.raises(ValueError, match="block layout"):
        F.parse_block_layout("6-x2")


def _abstract_forward(cls, cfg, seq_len, batch=2):
    def run():
        model = cls(cfg, rngs=nnx.Rngs(0))
        ids = jnp.zeros((batch, seq_len), jnp.int32)
        return model(ids)

    return jax.eval_shape(run)


def test_shapes_512_256_128_with_separate_cls_truncate_seq():
    cfg = F.FunnelConfig(**TINY, block_sizes=(1, 1, 1), num_decoder_layers=1)
    assert F.pooled_lengths(512, cfg) == (512, 256, 128)
    assert F.pooled_lengths(512, dataclasses.replace(cfg, truncate_seq=False)) == (512, 257, 129)
    assert F.pooled_lengths(512, dataclasses.replace(cfg, separate_cls=False)) == (512, 256, 128)
    out = _abstract_forward(F.FunnelModel, cfg, 512)
    assert out.encoder_last_hidden_state.shape == (2, 128, 16)
    assert out.last_hidden_state.shape == (2, 512, 16)  # decoder runs at full length
    # a single pool-query-only layer (block 2 of "1-1") already outputs the pooled length
    assert _abstract_forward(
        F.FunnelBaseModel, dataclasses.replace(cfg, block_sizes=(1, 1), block_repeats=None), 512
    ).last_hidden_state.shape == (2, 256, 16)
    qa = jax.eval_shape(
        lambda: FH.FunnelForQuestionAnswering(cfg, answerability=True, rngs=nnx.Rngs(0))(jnp.zeros((2, 512), jnp.int32))
    )
    assert qa.start_logits.shape == qa.end_logits.shape == (2, 512) and qa.cls_logits.shape == (2,)
    # the upsampled decoder input has full length and keeps <cls>
    up = jax.eval_shape(lambda x: F.upsample(x, 4, 512, cfg), jax.ShapeDtypeStruct((2, 128, 16), jnp.float32))
    assert up.shape == (2, 512, 16)


def test_pool_upsample_values():
    cfg = F.FunnelConfig(**TINY)
    x = np.arange(8.0)[None, :, None]  # <cls>=0, tokens 1..7
    np.testing.assert_array_equal(np.asarray(F.pool_sequence(x, "mean", cfg))[0, :, 0], [0, 1.5, 3.5, 5.5])
    np.testing.assert_array_equal(np.asarray(F.pool_sequence(x, "max", cfg))[0, :, 0], [0, 2, 4, 6])
    np.testing.assert_array_equal(np.asarray(F.pool_sequence(x, "min", cfg))[0, :, 0], [0, 1, 3, 5])
    np.testing.assert_array_equal(F.stride_select(np.arange(8), 0, cfg), [0, 1, 3, 5])
    np.testing.assert_array_equal(
        np.asarray(F.upsample(jnp.asarray([[[0.0], [1.0], [2.0]]]), 2, 5, cfg))[0, :, 0], [0, 1, 1, 2, 2]
    )


# ----------------------------------------------------------------------------------------------------------------
# Objectives
# ----------------------------------------------------------------------------------------------------------------


def _init(ctor, cfg, seed=0, **kw):
    """Build a module with N(0, 0.1) NumPy parameters (LayerNorm scales around 1): no initialiser runs (a jitted
    random init compiles one threefry kernel per parameter, more than the programs under test; eager init
    dispatches hundreds of tiny ops)."""
    rng = np.random.RandomState(seed)
    value = lambda name, shape: (name.endswith("scale") + 0.1 * rng.randn(*shape)).astype(np.float32)
    return materialize(nnx.eval_shape(lambda: ctor(cfg, rngs=nnx.Rngs(0), **kw)), value, seed=seed)


def _jit_init(ctor, cfg, **kw):
    """Build a module with its random init compiled once (eager init dispatches hundreds of tiny ops)."""
    abstract = nnx.eval_shape(lambda: ctor(cfg, rngs=nnx.Rngs(0), **kw))
    graphdef, _ = nnx.split(abstract)
    state = jax.jit(lambda: nnx.split(ctor(cfg, rngs=nnx.Rngs(0), **kw))[1], compiler_options=FAST)()
    return nnx.merge(graphdef, state)


def _batch(seq_len=12, seed=0):
    rng = np.random.RandomState(seed)
    labels = rng.randint(3, TINY["vocab_size"], (2, seq_len)).astype(np.int32)
    label_mask = np.zeros((2, seq_len), np.float32)
    label_mask[:, [2, 5, 7]] = 1
    ids = np.where(label_mask > 0, 1, labels).astype(np.int32)  # 1 = <mask>
    am = np.ones((2, seq_len), np.int32)
    am[1, -2:] = 0
    tt = np.zeros((2, seq_len), np.int32)
    return {"input_ids": ids, "labels": labels, "label_mask": label_mask, "attention_mask": am, "token_type_ids": tt}


def test_mlm_loss_matches_logits_and_gathered_predictions():
    cfg = F.FunnelConfig(**TINY, block_sizes=(1, 1), num_decoder_layers=1, dropout=0.0, dropatt=0.0)
    model = _init(F.FunnelForMaskedLM, cfg)
    model.eval()
    batch = _batch()

    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, compiler_options=FAST)
    def run(state, batch):
        model = nnx.merge(graphdef, state)
        full, _ = FH.mlm_loss(model, batch)
        gathered, _ = FH.mlm_loss(model, batch, max_predictions=4)
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
        return full, gathered, logits

    full, gathered, logits = run(state, batch)
    logp = jax.nn.log_softmax(np.asarray(logits), -1)
    nll = -np.take_along_axis(np.asarray(logp), batch["labels"][..., None], -1)[..., 0]
    expected = (nll * batch["label_mask"]).sum() / batch["label_mask"].sum()
    np.testing.assert_allclose(float(full), expected, rtol=1e-5)
    np.testing.assert_allclose(float(gathered), expected, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["relative_shift", "factorized"])
def test_decoder_rows_equal_full_decoder_rows(attention_type):
    """`hidden(..., rows)` runs the last decoder layer at the given rows only (what the MLM loss over k predicted
    positions needs): its output and every parameter gradient equal the full decoder's rows, here with <cls>
    (position 0, token type 2), two segments, padding, the last position and a repeated row among the rows."""
    cfg = F.FunnelConfig(
        **TINY, block_sizes=(1, 1), num_decoder_layers=2, attention_type=attention_type, dropout=0.0, dropatt=0.0
    )
    model = _init(F.FunnelForMaskedLM, cfg)
    model.eval()
    ids, tt, am = _inputs("FunnelForMaskedLM", 12)
    rows = np.array([[0, 3, 11, 3], [5, 1, 9, 10]], np.int32)
    w = np.random.RandomState(1).randn(2, 4, TINY["d_model"]).astype(np.float32)  # a loss that reads every row
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @functools.partial(jax.jit, compiler_options=FAST)
    def run(params):
        def at_rows(params):
            h = nnx.merge(graphdef, params, rest).hidden(ids, tt, am, rows)
            return (h * w).sum(), h

        def full(params):
            h = F.take_rows(nnx.merge(graphdef, params, rest).hidden(ids, tt, am), rows)
            return (h * w).sum(), h

        return jax.value_and_grad(at_rows, has_aux=True)(params), jax.value_and_grad(full, has_aux=True)(params)

    ((_, h_rows), g_rows), ((_, h_full), g_full) = run(params)
    assert h_rows.shape == (2, 4, TINY["d_model"])
    np.testing.assert_allclose(np.asarray(h_rows), np.asarray(h_full), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_rows), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_electra_objective():
    cfg = F.FunnelConfig(**dict(TINY, d_model=32, n_head=4, d_inner=64), block_sizes="1-1", num_decoder_layers=1)
    model = _jit_init(FH.FunnelElectra, cfg)
    model.eval()  # dropout off: its rng state cannot be mutated inside jax.grad of a merged module
    gen = model.generator.config
    assert (gen.d_model, gen.n_head, gen.d_inner, gen.embed_dim) == (8, 1, 16, 32)  # width_shrink 0.25
    assert model.disc_coeff == 50.0
    batch = _batch()

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @functools.partial(jax.jit, compiler_options=FAST)
    def step(params, rest, batch, rng):
        def split_loss(params):
            total, parts = FH.electra_loss(nnx.merge(graphdef, params, rest), batch, rng, max_predictions=4)
            return total - parts["gen_loss"], (total, parts)

        (_, (total, parts)), grads = jax.value_and_grad(split_loss, has_aux=True)(params)
        return total, parts, grads

    total, parts, grads = step(params, rest, batch, jax.random.key(1))
    np.testing.assert_allclose(float(total), float(parts["gen_loss"] + 50.0 * parts["disc_loss"]), rtol=1e-6)
    assert 0.0 < float(parts["replaced_ratio"]) <= 3 / 11 + 1e-6  # only masked positions can be replaced
    # replacements are sampled without gradient: the discriminator loss does not train the generator ...
    assert max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads["generator"])) == 0.0
    # ... but it does train the discriminator and the shared embeddings
    emb_grad = grads["discriminator"]["funnel"]["embeddings"]["word_embeddings"]
    assert float(np.abs(np.asarray(getattr(emb_grad, "value", emb_grad))).max()) > 0
    # the generator loss does not depend on the sampling rng
    _, parts_b, _ = step(params, rest, batch, jax.random.key(3))
    np.testing.assert_allclose(float(parts["gen_loss"]), float(parts_b["gen_loss"]), rtol=1e-6)
