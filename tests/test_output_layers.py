"""Output layers (xlgen/models/output_layers.py): identities, normalisation, blocked NLL, AdvSoft / CosReg closed
forms, spectrum control, the rank procedure, and vocabulary sharding. All in-process, tiny shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from xlgen.analyze.rank import effective_rank, rank_report
from xlgen.analyze.spectrum import isotropy
from xlgen.models import output_layers as ol
from xlgen.models.adaptive_softmax import AdaptiveEmbedding

V, D = 40, 8
OUT = dict(n_experts=4, d2=4, plif_intervals=64, doc_counts=(2, 1, 1))
N_LAYER = 2  # DOC reads n_layer + 1 = 3 states


def _emb(d_embed=D, d_proj=D, seed=0):
    return AdaptiveEmbedding(V, d_embed, d_proj, (), 1, rngs=nnx.Rngs(seed))


def _layer(name, block=32768, train=False, d_embed=D, d_proj=D, **out):
    layer = ol.make_output_layer(
        name, V, d_embed, d_proj, {**OUT, **out}, block_size=block, n_layer=N_LAYER, rngs=nnx.Rngs(1)
    )
    layer.train() if train else layer.eval()
    return layer


def _h(shape=(3, 5), d=D, seed=2, scale=1.0):
    return scale * jax.random.normal(jax.random.key(seed), shape + (d,))


def _random_bias(layer, seed=5):
    layer.bias[...] = 0.5 * jax.random.normal(jax.random.key(seed), (V,))


@pytest.mark.parametrize("name", sorted(ol.OUTPUT_LAYERS))
def test_probabilities_sum_to_one_and_nll_matches_log_probs(name):
    """Every layer: Σ_z P(z|c) = 1; the blocked label NLL (V = 40 > block 16: 3 padded blocks) equals
    -log_probs[label] (one full-vocabulary softmax); label < 0 -> 0. One jit per layer."""
    emb, h = _emb(d_embed=6), _h(scale=3.0)  # d_embed 6 != d_model 8: the tied projection is used
    labels = jax.random.randint(jax.random.key(3), (3, 5), 0, V).at[0, 0].set(-1)
    layer = _layer(name, block=16, d_embed=6)
    _random_bias(layer)
    layers = _h((N_LAYER + 1, 3, 5), seed=8) if layer.needs_layers else None  # DOC's per-layer states
    lp, nll = nnx.jit(lambda lay, e, h, y, s: (lay.log_probs(h, e, s), lay.nll(h, y, e, s)))(
        layer, emb, h, labels, layers
    )
    assert lp.shape == (3, 5, V) and lp.dtype == jnp.float32
    np.testing.assert_allclose(np.exp(np.asarray(lp, np.float64)).sum(-1), 1.0, atol=2e-6)
    ref = -np.take_along_axis(np.asarray(lp), np.asarray(labels.clip(0))[..., None], -1)[..., 0]
    ref[0, 0] = 0.0
    np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)


def test_gss_identities_and_smooth_pl():
    """GSS(c, 1) = softmax for any c; GSS(0, 2) = SigSoftmax; P̃L(x; 0, 0) = softplus (001 eq. 4.17/4.18)."""
    emb, h = _emb(), _h(scale=4.0)
    soft = _layer("softmax")
    _random_bias(soft)
    ref = soft.log_probs(h, emb)
    for c in (-1.5, 0.0, 2.0):
        gss = _layer("gss", c=c, k=1.0)
        nnx.update(gss, nnx.state(soft))
        np.testing.assert_allclose(gss.log_probs(h, emb), ref, atol=2e-5)
    sig, gss = _layer("sigsoftmax"), _layer("gss", c=0.0, k=2.0)
    nnx.update(sig, nnx.state(soft))
    nnx.update(gss, nnx.state(soft))
    np.testing.assert_allclose(gss.log_probs(h, emb), sig.log_probs(h, emb), atol=2e-5)
    assert np.abs(np.asarray(sig.log_probs(h, emb) - ref)).max() > 1e-2  # and it is not the softmax
    x = jnp.linspace(-30, 30, 101)
    np.testing.assert_allclose(ol.smooth_pl(x, 0.0, 0.0), jax.nn.softplus(x), atol=1e-5)
    # asymptotes: x above c, kx + c(1-k) below
    np.testing.assert_allclose(ol.smooth_pl(jnp.array(40.0), -1.5, 2.5), 40.0, atol=1e-4)
    np.testing.assert_allclose(ol.smooth_pl(jnp.array(-40.0), -1.5, 2.5), 2.5 * -40 + -1.5 * (1 - 2.5), atol=1e-4)


def test_mos_with_one_expert_is_a_softmax_over_its_context():
    """MoS K=1 (π = 1) equals the softmax of its single context h_1 = tanh(W h); MoC K=1 equals MoS K=1."""
    emb, h = _emb(), _h()
    mos, moc, soft = _layer("mos", n_experts=1), _layer("moc", n_experts=1), _layer("softmax")
    _random_bias(mos)
    nnx.update(moc, nnx.state(mos))
    nnx.update(soft, {"bias": nnx.state(mos)["bias"]})
    h1 = mos.experts(h.reshape(-1, D))[0][:, 0]
    np.testing.assert_allclose(mos.log_probs(h, emb).reshape(-1, V), soft.log_probs(h1, emb), atol=1e-5)
    np.testing.assert_allclose(moc.log_probs(h, emb), mos.log_probs(h, emb), atol=1e-5)


def test_mixtape_sigmoid_tree_priors():
    """K=4 tree gives 001's π1 = γ1γ2, π2 = γ1(1-γ2), π3 = (1-γ1)γ3, π4 = (1-γ1)(1-γ3); priors sum to 1 (K=8)."""
    a = jax.random.normal(jax.random.key(0), (3, 5))  # [K-1, R]
    g = jax.nn.sigmoid(a)
    want = jnp.stack([g[0] * g[1], g[0] * (1 - g[1]), (1 - g[0]) * g[2], (1 - g[0]) * (1 - g[2])])
    np.testing.assert_allclose(jnp.exp(ol.sigmoid_tree_log_priors(a, 4)), want, rtol=1e-5)
    p8 = jnp.exp(ol.sigmoid_tree_log_priors(jax.random.normal(jax.random.key(1), (7, 6)), 8))
    np.testing.assert_allclose(p8.sum(0), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="power of two"):
        _layer("mixtape", n_experts=3)


def test_plif_is_identity_at_init_increasing_and_continuous():
    x = jnp.linspace(-30.0, 30.0, 2001)
    ones = jnp.ones((64,))
    np.testing.assert_allclose(ol.plif(x, ones, 20.0), x, atol=1e-4)
    slopes = jax.nn.softplus(jax.random.normal(jax.random.key(0), (64,)))
    y = np.asarray(ol.plif(x, slopes, 20.0))
    assert np.all(np.diff(y) > 0)
    knots = jnp.asarray(-20.0 + 40.0 * np.arange(1, 64) / 64, jnp.float32)  # continuity at every knot
    np.testing.assert_allclose(ol.plif(knots - 1e-4, slopes, 20.0), ol.plif(knots + 1e-4, slopes, 20.0), atol=1e-3)


def test_advsoft_closed_form_is_the_worst_case_perturbation():
    """min_{‖δ‖<=ε} log P(z | c; e_z + δ) is reached at δ* = -ε h/‖h‖; our training NLL equals -log P at δ*."""
    emb, h = _emb(), _h((1, 6), scale=2.0)
    labels = jax.random.randint(jax.random.key(4), (1, 6), 0, V)
    eps = 0.3
    layer = _layer("softmax", train=True, adv_eps=eps)
    _random_bias(layer)
    table = emb.tables[0][...]
    bias = layer.bias[...]
    ours = np.asarray(layer.nll(h, labels, emb))[0]
    for n in range(6):
        hn, z = h[0, n], int(labels[0, n])

        def logp(delta):
            t = table.at[z].add(delta)
            return jax.nn.log_softmax(t @ hn + bias)[z]

        star = -eps * hn / jnp.linalg.norm(hn)
        np.testing.assert_allclose(ours[n], -logp(star), rtol=1e-5)
        dirs = jax.random.normal(jax.random.key(n), (256, D))
        others = jax.vmap(logp)(eps * dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True))
        assert float(others.min()) >= float(logp(star)) - 1e-5
    layer.eval()  # evaluation: no margin
    np.testing.assert_allclose(
        layer.nll(h, labels, emb),
        -np.take_along_axis(np.asarray(layer.log_probs(h, emb)), labels[..., None], -1)[..., 0],
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="AdvSoft"):
        _layer("mos", adv_eps=0.1)


def test_cosreg_linear_time_equals_pairwise_sum():
    e = jax.random.normal(jax.random.key(0), (V, D)) + 0.3
    e_hat = e / jnp.linalg.norm(e, axis=-1, keepdims=True)
    gram = e_hat @ e_hat.T
    pairwise = (gram.sum() - jnp.trace(gram)) / V**2
    np.testing.assert_allclose(ol.cosreg_penalty(e), pairwise, rtol=1e-5)
    emb = _emb()
    layer = _layer("softmax", cosreg=0.5)
    total, terms = layer.regularization(emb)
    np.testing.assert_allclose(total, 0.5 * ol.cosreg_penalty(emb.tables[0][...]), rtol=1e-6)


def test_spectrum_control_is_an_exact_reparameterisation():
    """W <-> (U, σ, V) both ways; SpectralEmbedding's logits/embeddings equal the plain table's; penalties vanish
    on the SVD init (orthonormal U, V) except the prior; gradients reach U, σ and V."""
    w = np.asarray(jax.random.normal(jax.random.key(0), (V, D)), np.float32)
    u, s, v = ol.spectral_from_table(w)
    np.testing.assert_allclose(ol.table_from_spectral(u, s, v), w, atol=1e-5)
    assert np.all(np.diff(s) <= 0)
    params = ol.collapse_spectral_params(ol.expand_spectral_params({"embedding/tables/0": w, "x": 1}))
    np.testing.assert_allclose(params["embedding/tables/0"], w, atol=1e-5)

    spec = ol.SpectralEmbedding(V, D, D, rngs=nnx.Rngs(0))
    plain = _emb()
    plain.tables[0][...] = spec.table()
    ids = jnp.array([[0, 3, 39]])
    np.testing.assert_allclose(spec(ids), plain(ids), atol=1e-5)
    o = ol.OutputConfig(
        spectrum_control=True, sc_lambda_u_fro=1.0, sc_lambda_v_fro=1.0, sc_lambda_u_spec=1.0, sc_lambda_v_spec=1.0,
        sc_prior="poly", sc_lambda_prior=2.0, sc_c1=0.5, sc_gamma=0.7,
    )  # fmt: skip
    total, terms = spec.penalty(o)
    for k in ("sc_u_fro", "sc_v_fro", "sc_u_spec", "sc_v_spec"):
        assert float(terms[k]) < 1e-9, (k, terms[k])
    prior = 0.5 * np.arange(1, D + 1) ** -0.7  # the paper's k^(-γ)
    np.testing.assert_allclose(terms["sc_prior"], ((np.asarray(spec.sigma[...]) - prior) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(total, 2.0 * terms["sc_prior"], rtol=1e-5)

    layer = _layer("softmax", spectrum_control=True, sc_lambda_u_fro=1.0, sc_prior="exp", sc_lambda_prior=1.0)
    layer.train()
    h, labels = _h((2, 3)), jnp.array([[1, 2, 3], [4, 5, 6]])

    def loss(spec):
        reg, _ = layer.regularization(spec)
        return layer.nll(h, labels, spec).mean() + reg

    grads = nnx.grad(loss)(spec)
    for name in ("u", "sigma", "v"):
        assert float(jnp.abs(getattr(grads, name)[...]).max()) > 0, name


def test_bf16_compute_keeps_float32_log_probs():
    emb = _emb()
    for name in ("softmax", "mos", "gss"):
        layer = _layer(name)
        lp = layer.log_probs(_h().astype(jnp.bfloat16), emb)
        assert lp.dtype == jnp.float32
        np.testing.assert_allclose(np.exp(np.asarray(lp, np.float64)).sum(-1), 1.0, atol=1e-5)


def test_rank_softmax_within_bound_mixtures_and_gss_exceed_it():
    """Q = log P over M contexts: softmax and MoC rank <= d + 2 (output bias); MoS, SigSoftmax, GSS, Mixtape exceed
    it. Random tiny layers (d = 8, V = 40, M = 120), Press tolerance with float32 eps."""
    emb, h = _emb(), _h((120,), scale=3.0, seed=7)
    ranks = {}
    for name in ("softmax", "moc", "mos", "sigsoftmax", "gss", "mixtape"):
        layer = _layer(name, c=-1.5, k=2.5)
        _random_bias(layer)
        ranks[name] = rank_report(np.asarray(layer.log_probs(h, emb)), "float32")["rank"]
    assert ranks["softmax"] == D + 2 and ranks["moc"] <= D + 2, ranks
    for name in ("mos", "sigsoftmax", "gss", "mixtape"):
        assert ranks[name] > D + 2, ranks


def test_rank_procedure_precision_and_effective_rank():
    """The float32 Q of a softmax is rank d+1 with a float32 eps and (wrongly) full rank with float64's eps;
    the ε-effective rank of a rank-3 matrix plus tiny noise stays 3 (001 §5.4 robustness)."""
    rng = np.random.default_rng(0)
    hq, eq = rng.normal(size=(200, 6)), rng.normal(size=(60, 6))
    q = np.asarray(jax.nn.log_softmax(jnp.asarray(hq @ eq.T, jnp.float32)), np.float32)
    assert rank_report(q, "float32")["rank"] == 7
    assert rank_report(q, "float64")["rank"] == 60
    low = rng.normal(size=(100, 3)) @ rng.normal(size=(3, 50)) + 1e-9 * rng.normal(size=(100, 50))
    s = np.linalg.svd(low, compute_uv=False)
    assert effective_rank(s, 1e-5) == 3 and rank_report(low, "float64")["rank"] == 50


def test_isotropy_measures():
    """I1 = 1, I2 = 0 for an isotropic (orthogonal, symmetric) set; a narrow cone is far less isotropic."""
    w = np.concatenate([np.eye(4), -np.eye(4)])
    iso = isotropy(w)
    np.testing.assert_allclose([iso["I1"], iso["I2"]], [1.0, 0.0], atol=1e-12)
    cone = np.random.default_rng(0).normal(size=(500, 4)) * 0.1 + np.array([2.0, 0, 0, 0])
    c = isotropy(cone)
    assert c["I1"] < 0.2 and c["I2"] > 0.3


def test_vocab_sharded_equals_one_device():
    """MoS and GSS NLL + gradients with the vocabulary sharded over `tensor` (fsdp_tp rules) equal one device."""
    from jax.sharding import NamedSharding

    from xlgen import sharding

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
    rules = sharding.rules_for("fsdp_tp")
    emb, h = _emb(), _h((4, 6), seed=9)
    labels = jax.random.randint(jax.random.key(3), (4, 6), 0, V)
    for name in ("mos", "gss"):
        layer = _layer(name, block=16)
        graphdef, state, rest = nnx.split((layer, emb), nnx.Param, ...)

        def loss(state, h, labels):
            lay, e = nnx.merge(graphdef, state, rest)
            return lay.nll(h, labels, e).mean()

        ref_loss, ref_grad = jax.jit(jax.value_and_grad(loss))(state, h, labels)

        def shard(x):
            axes = x.get_metadata().get("out_sharding") or (None,) * x.ndim
            return NamedSharding(mesh, sharding.logical_to_spec(axes, x.shape, rules, mesh))

        shardings = jax.tree.map(shard, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        with jax.set_mesh(mesh):
            sstate = jax.device_put(state, shardings)
            assert "tensor" in str(sstate[1]["tables"][0].sharding.spec)  # the vocabulary really is split
            hs = jax.device_put(h, sharding.batch_sharding(mesh, 3))
            got_loss, got_grad = jax.jit(jax.value_and_grad(loss))(sstate, hs, labels)
        np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_grad, ref_grad)
