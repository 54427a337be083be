"""Output layers against the theses' definitions (issue 35): MoS without a prior bias, tanh in the embedding space,
variational expert dropout; PLIF's random positive initial slopes and 1e5 intervals; the spectrum prior on the
ordered, positive singular values; DOC against a direct computation from the layer states; AdvSoft's closed form
for every layer that offers it; spectrum control under the adaptive softmax. Tiny shapes, float64 references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from xlgen.models import output_layers as ol
from xlgen.models.adaptive_softmax import AdaptiveEmbedding
from xlgen.models.transformer_xl.model import TransformerXLConfig, TransformerXLLM

V, D, DE = 40, 8, 6  # vocabulary, d_model, d_embed (d_e != d_model: the tied projection P is used)


def _layer(name, d_embed=D, n_layer=2, train=False, **out):
    layer = ol.make_output_layer(name, V, d_embed, D, out, n_layer=n_layer, rngs=nnx.Rngs(1))
    layer.train() if train else layer.eval()
    return layer


def _h(shape, d=D, seed=2, scale=2.0):
    return scale * jax.random.normal(jax.random.key(seed), shape + (d,))


def _np(x):
    return np.asarray(x, np.float64)


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _logsumexp(x, axis):
    m = x.max(axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis, keepdims=True))).squeeze(axis)


def test_mos_prior_has_no_bias_and_tanh_is_in_the_embedding_space():
    """000 A.2.4: π = softmax(w_π,kᵀ g) (no bias); 001 §3.1.2: h_{c,k} = tanh(W_k g) ∈ R^{d_e}. With d_e = 6 != 8 =
    d_model the log-probabilities equal log Σ_k π_k softmax(h_k Eᵀ + b) computed directly in float64 — no
    projection after the tanh. The old behaviour (prior bias, P·tanh in d_model space) stays as options."""
    emb = AdaptiveEmbedding(V, DE, D, (), 1, rngs=nnx.Rngs(0))
    mos = _layer("mos", d_embed=DE, n_experts=3)
    assert mos.experts.prior.bias is None
    assert mos.experts.latent.kernel.shape == (D, 3, DE)
    mos.bias[...] = jax.random.normal(jax.random.key(5), (V,))
    h = _h((7,))
    e, b = _np(emb.tables[0][...]), _np(mos.bias[...])
    wk, bk, wp = (
        _np(mos.experts.latent.kernel[...]),
        _np(mos.experts.latent.bias[...]),
        _np(mos.experts.prior.kernel[...]),
    )
    hk = np.tanh(np.einsum("nd,dke->nke", _np(h), wk) + bk)  # [N, K, d_e]
    log_pi = _log_softmax(_np(h) @ wp)
    want = _logsumexp(log_pi[..., None] + _log_softmax(hk @ e.T + b), axis=1)
    np.testing.assert_allclose(mos.log_probs(h, emb), want, atol=2e-5)

    old = _layer("mos", d_embed=DE, n_experts=3, prior_bias=True, expert_space="model")
    assert old.experts.prior.bias is not None and old.experts.latent.kernel.shape == (D, 3, D)
    moc = _layer("moc", d_embed=DE, n_experts=3)
    nnx.update(moc, nnx.state(mos))  # MoC: the same parameters, contexts mixed in the embedding space
    mixed = np.einsum("nk,nke->ne", np.exp(log_pi), hk)
    np.testing.assert_allclose(moc.log_probs(h, emb), _log_softmax(mixed @ e.T + b), atol=2e-5)


def test_expert_dropout_is_variational_one_mask_per_sequence():
    """000 A.7 "context vector V-dropout": the mask over (k, feature) is drawn once per sequence and shared by every
    time step; `expert_dropout_kind="element"` draws one per position (the old behaviour)."""
    b, t, k = 3, 6, 4
    h = _h((b, t))
    for kind, shared in (("variational", True), ("element", False)):
        mos = _layer("mos", train=True, n_experts=k, expert_dropout=0.5, expert_dropout_kind=kind)
        hk, _ = mos.experts(h.reshape(-1, D), (b, t))
        dropped = np.asarray(hk == 0).reshape(b, t, k, D)
        assert 0.3 < dropped.mean() < 0.7
        same_over_time = all((dropped[:, i] == dropped[:, 0]).all() for i in range(t))
        assert same_over_time == shared, kind
        assert not (dropped[0] == dropped[1]).all()  # different sequences, different masks
        # the layer itself uses the sequence layout it is given: nll of [b, t] states trains with that mask
        labels = jnp.zeros((b, t), jnp.int32)
        emb = AdaptiveEmbedding(V, D, D, (), 1, rngs=nnx.Rngs(0))
        assert np.isfinite(np.asarray(mos.nll(h, labels, emb))).all()


def test_plif_default_intervals_and_random_positive_initial_slopes():
    """001 §4.3.2.1: K = 1e5 intervals on [-20, 20]; §5.7.1: slopes start at random positive values (not all 1)."""
    assert ol.OutputConfig().plif_intervals == 100_000 and ol.OutputConfig().plif_range == 20.0
    plif = _layer("plif", plif_intervals=1000)
    slopes = np.asarray(jax.nn.softplus(plif.slope_logits[...]))
    assert np.all(slopes > 0) and slopes.std() > 0.05 and np.unique(slopes).size > 990
    ident = _layer("plif", plif_intervals=1000, plif_init="identity")
    np.testing.assert_allclose(jax.nn.softplus(ident.slope_logits[...]), 1.0, rtol=1e-6)


def test_spectrum_prior_uses_the_ordered_positive_singular_values():
    """Seed 002: σ_k is the k-th largest singular value. With σ stored unordered and with signs, the prior term
    equals Σ_k (s_k(E) - target_k)² for the singular values s(E) of E = U diag(σ) Vᵀ (orthonormal U, V)."""
    spec = ol.SpectralEmbedding(V, D, D, rngs=nnx.Rngs(0))
    sigma = np.array([0.3, -1.2, 0.05, 0.8, -0.01, 2.0, 0.4, -0.6], np.float32)
    spec.sigma[...] = jnp.asarray(sigma)
    o = ol.OutputConfig(spectrum_control=True, sc_prior="poly", sc_lambda_prior=1.0, sc_c1=1.5, sc_gamma=0.8)
    _, terms = spec.penalty(o)
    s = np.linalg.svd(_np(spec.table()), compute_uv=False)
    target = 1.5 * np.arange(1, D + 1) ** -0.8
    np.testing.assert_allclose(terms["sc_prior"], ((s - target) ** 2).sum(), rtol=1e-5)
    _, old = spec.penalty(ol.OutputConfig(**{**o.__dict__, "sc_prior_order": "index"}))
    np.testing.assert_allclose(old["sc_prior"], ((sigma - target) ** 2).sum(), rtol=1e-5)


def _doc_reference(doc, emb, h, layers, counts):
    """log P of DOC from its parameters in float64: g_r = tanh(W_{r,i} o_i), π = softmax(U o_top) (001 eq. 3.14-16)."""
    e, b = _np(emb.tables[0][...]), _np(doc.bias[...])
    o = [_np(x) for x in layers]  # o_0 .. o_L, with o_L replaced by h
    o[-1] = _np(h)
    gs = []
    for j, v in enumerate(counts):
        if not v:
            continue
        dense = doc.experts.latent if j == 0 else doc.lower[j - 1]
        x = o[len(o) - 1 - j]
        gs.append(np.tanh(np.einsum("...d,dke->...ke", x, _np(dense.kernel[...])) + _np(dense.bias[...])))
    g = np.concatenate(gs, axis=-2)
    log_pi = _log_softmax(_np(h) @ _np(doc.experts.prior.kernel[...]))
    return _logsumexp(log_pi[..., None] + _log_softmax(g @ e.T + b), axis=-2)


def test_doc_log_probs_equal_a_direct_computation_and_doc_top_only_is_mos():
    counts = (3, 0, 2)  # 3 components from the top state, 2 from the embedding output o_0
    emb = AdaptiveEmbedding(V, D, D, (), 1, rngs=nnx.Rngs(0))
    doc = _layer("doc", doc_counts=counts)
    doc.bias[...] = jax.random.normal(jax.random.key(5), (V,))
    h, layers = _h((2, 5)), _h((3, 2, 5), seed=3)
    np.testing.assert_allclose(doc.log_probs(h, emb, layers), _doc_reference(doc, emb, h, layers, counts), atol=2e-5)
    assert doc.experts.prior.kernel.shape == (D, 5) and doc.lower[0] is None
    with pytest.raises(ValueError, match="per-layer states"):
        doc.log_probs(h, emb)
    with pytest.raises(ValueError, match="doc_counts"):
        _layer("doc", doc_counts=(1, 1, 1, 1))  # 2 blocks + embedding = 3 states
    top = _layer("doc", doc_counts=(4,))
    mos = _layer("mos", n_experts=4)
    nnx.update(mos, nnx.state(top))
    np.testing.assert_allclose(top.log_probs(h, emb, layers), mos.log_probs(h, emb), atol=1e-6)


def _tiny_txl(**kw):
    base = dict(
        vocab_size=V, cutoffs=(), d_model=D, d_embed=D, n_head=2, d_head=4, d_inner=16, div_val=1, n_layer=2,
        mem_len=4, clamp_len=-1, dropout=0.0, init_std=0.3,
    )  # fmt: skip
    base.update(kw)
    model = TransformerXLLM(TransformerXLConfig(**base), rngs=nnx.Rngs(0))
    model.eval()
    return model


def test_doc_in_transformer_xl_reads_every_layer_from_one_pass():
    """The model's DOC log-probs and NLL equal the direct computation from `hidden_states(with_layers=True)`:
    layers[0] is the embedding output, layers[-1] the top state."""
    counts = (2, 1, 1)
    model = _tiny_txl(output_layer="doc", output=dict(doc_counts=counts))
    ids = jax.random.randint(jax.random.key(1), (2, 5), 0, V)
    lp, mems = model(ids, model.init_mems(2))
    h, mems2, layers = model.hidden_states(ids, model.init_mems(2), with_layers=True)
    assert layers.shape == (3, 2, 5, D)
    np.testing.assert_allclose(layers[0], model.embedding(ids), atol=1e-6)
    np.testing.assert_allclose(layers[-1], h, atol=1e-6)
    np.testing.assert_allclose(mems, mems2)
    ref = _doc_reference(model.softmax, model.embedding, h, layers, counts)
    np.testing.assert_allclose(lp, ref, atol=3e-5)
    labels = jax.random.randint(jax.random.key(2), (2, 5), 0, V)
    nll, _ = model(ids, model.init_mems(2), labels=labels)
    np.testing.assert_allclose(nll, -np.take_along_axis(ref, np.asarray(labels)[..., None], -1)[..., 0], atol=3e-5)


@pytest.mark.parametrize("name", ["softmax", "sigsoftmax", "gss", "plif", "moc"])
def test_advsoft_closed_form_for_every_layer_that_offers_it(name):
    """AdvSoft (001 §3.3.3): min_{‖δ‖<=ε} log P(z | c; e_z + δ) is reached at δ* = -ε h_e/‖h_e‖ for any increasing
    logit transform (d log P_z / d l_z = f'(l_z)(1 - P_z) >= 0), h_e the (mixed, for MoC) context in the embedding
    space; the training NLL equals -log P at δ*, and no random δ on the sphere gives a lower log P."""
    emb = AdaptiveEmbedding(V, DE, D, (), 1, rngs=nnx.Rngs(0))
    eps = 0.4
    layer = _layer(name, d_embed=DE, train=True, adv_eps=eps, c=-1.5, k=2.5, plif_intervals=256, n_experts=3)
    layer.bias[...] = 0.5 * jax.random.normal(jax.random.key(5), (V,))
    h = _h((1, 4), scale=3.0)
    labels = jax.random.randint(jax.random.key(4), (1, 4), 0, V)
    ours = np.asarray(layer.nll(h, labels, emb))[0]
    layer.eval()  # the reference perturbs the table and evaluates without the margin
    table = emb.tables[0][...]
    if name == "moc":
        hk, log_pi = layer.experts(h.reshape(-1, D))
        he = jnp.einsum("nk,nke->ne", jnp.exp(log_pi), hk)
    else:
        he = h.reshape(-1, D) @ emb.projs[0][...].T
    for n in range(4):
        z = int(labels[0, n])

        def logp(delta):
            emb.tables[0][...] = table.at[z].add(delta)
            out = layer.log_probs(h[:, n : n + 1], emb)[0, 0, z]
            emb.tables[0][...] = table
            return float(out)

        star = -eps * he[n] / jnp.linalg.norm(he[n])
        best = logp(star)
        np.testing.assert_allclose(ours[n], -best, rtol=2e-5, atol=2e-5)
        dirs = jax.random.normal(jax.random.key(n), (12, DE))
        for d in dirs:
            assert logp(eps * d / jnp.linalg.norm(d)) >= best - 1e-5


def test_spectrum_control_with_the_adaptive_softmax():
    """Seed 002 Table 2's setting (TXL + adaptive softmax, div_val 1): E = U diag(σ) Vᵀ is the one table whose rows
    the head and tail clusters slice; log-probs equal the plain adaptive model holding E, the penalty is reported,
    and div_val > 1 (clusters of different widths, no single E) is refused."""
    kw = dict(cutoffs=(10, 25), output_layer="adaptive")
    sc = _tiny_txl(**kw, output=dict(spectrum_control=True, sc_lambda_u_fro=1.0, sc_prior="exp", sc_lambda_prior=1.0))
    plain = _tiny_txl(**kw)
    state = nnx.state(sc, nnx.Param)
    flat = {".".join(map(str, k)): v for k, v in nnx.to_flat_state(state)}
    plain_state = nnx.state(plain, nnx.Param)
    for path, var in nnx.to_flat_state(plain_state):
        name = ".".join(map(str, path))
        var.set_value(sc.embedding.table() if name == "embedding.tables.0" else flat[name].get_value())
    nnx.update(plain, plain_state)
    ids = jax.random.randint(jax.random.key(1), (2, 5), 0, V)
    np.testing.assert_allclose(sc(ids)[0], plain(ids)[0], atol=2e-5)
    penalty, terms = sc.regularization()
    assert {"sc_u_fro", "sc_prior"} <= set(terms) and float(penalty) > 0
    with pytest.raises(ValueError, match="div_val"):
        TransformerXLConfig(vocab_size=V, cutoffs=(10, 25), div_val=2, output=dict(spectrum_control=True))


def test_doc_incremental_decoding_equals_the_full_pass():
    """`xlgen generate` with DOC: each step's log-probs (from the step's own per-layer states) equal one full pass
    over prompt + generated tokens (as tests/test_generate.py checks for the softmax)."""
    import dataclasses

    from test_generate import tiny_txl

    from xlgen.generate import TXLDecoder

    mem_len, prompt, n_new = 4, [3, 7, 1], 5
    model = tiny_txl(output_layer="doc", output=dict(doc_counts=(2, 1, 1)))
    res = TXLDecoder(model, mem_len).generate(prompt, max_new_tokens=n_new, seed=3, top_k=5, return_log_probs=True)
    full_cfg = dataclasses.replace(model.config, same_length=True)
    ids = np.concatenate([np.asarray([prompt]), res["tokens"][:, :-1]], axis=1)
    m = nnx.merge(nnx.graphdef(model), nnx.state(model))
    m.config = full_cfg
    ref = np.asarray(m(jnp.asarray(ids), None, mem_len=mem_len + 1)[0])[:, len(prompt) - 1 :]
    np.testing.assert_allclose(res["log_probs"], ref, atol=1e-5)
