"""Attention score precision (`model.scores_dtype`, `model.softmax_dtype`; issue 38): bfloat16 scores agree with
float32 within bfloat16 tolerance, the bfloat16 softmax path is numerically sane (masking, max subtraction), the
Funnel mixture (bfloat16 scores, float32 softmax) computes what it says, and the paper pod configs carry the
original implementations' setting while the CPU configs stay float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_remat_precision import _eqns

from xlgen.models import relative_attention as ra
from xlgen.models.params import materialize
from xlgen.models.xlnet import model as X

REPO = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
SETTINGS = {"f32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16"), "mixed": ("bfloat16", "float32")}


def _inputs(seed=0, b=2, q=5, k=7, n=3, d=8):
    rng = np.random.default_rng(seed)
    q_head, k_head, v_head = (jnp.asarray(rng.normal(size=(b, L, n, d)), jnp.bfloat16) for L in (q, k, k))
    u = jnp.asarray(rng.normal(size=(n, d)), jnp.bfloat16)
    pos = jnp.asarray(3 * rng.normal(size=(b, n, q, k)), jnp.bfloat16)
    mask = rng.random((b, 1, q, k)) < 0.4
    mask[0, 0, 1] = True  # a fully masked row (XLNet: the first target in the order without memory)
    mask[1, 0, 2] = False
    return q_head, k_head, v_head, u, pos, jnp.asarray(mask)


def _attend(setting, inputs):
    q_head, k_head, v_head, u, pos, mask = inputs
    scores_dtype, softmax_dtype = SETTINGS[setting]
    return ra.relative_attention(
        q_head,
        k_head,
        v_head,
        r_w_bias=u,
        position_term=pos,
        mask=mask,
        return_probs=True,
        scores_dtype=scores_dtype,
        softmax_dtype=softmax_dtype,
    )


def test_bfloat16_scores_agree_with_float32_and_mask_exactly():
    inputs = _inputs()
    mask = np.asarray(inputs[-1])
    vec32, p32 = (np.asarray(x, np.float32) for x in _attend("f32", inputs))
    for setting in ("bf16", "mixed"):
        vec, probs = _attend(setting, inputs)
        assert probs.dtype == jnp.bfloat16  # the probabilities live in the scores' dtype
        probs = np.asarray(probs, np.float32)
        assert np.isfinite(probs).all() and np.isfinite(np.asarray(vec, np.float32)).all()
        # masked keys get exactly zero where a row has any visible key (-1e30 is finite in bfloat16: the max
        # subtraction stays exact and the exp underflows); a fully masked row is uniform, as in the originals
        full = mask.all(-1, keepdims=True)
        assert np.all(probs[np.broadcast_to(mask & ~full, probs.shape)] == 0.0)
        row = probs[0, :, 1]
        assert np.all(row == row[..., :1])
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=2e-2)
        # bfloat16 keeps 8 significant bits: scores of size ~5 round by <= 2^-5, probabilities agree to ~1e-2
        np.testing.assert_allclose(probs, p32, atol=4e-2)
        np.testing.assert_allclose(np.asarray(vec, np.float32), vec32, atol=6e-2)


def _dtypes_by_primitive(setting):
    inputs = _inputs()
    jaxpr = jax.make_jaxpr(lambda *a: _attend(setting, a))(*inputs).jaxpr
    out = {}
    for eqn in _eqns(jaxpr):
        for v in eqn.outvars:
            if getattr(v.aval, "shape", None) == (2, 3, 5, 7):
                out.setdefault(eqn.primitive.name, set()).add(str(v.aval.dtype))
            elif eqn.primitive.name == "reduce_sum" and getattr(v.aval, "shape", None) == (2, 3, 5):
                out.setdefault("row_sum", set()).add(str(v.aval.dtype))
    return out


def test_each_setting_computes_in_its_dtypes():
    """f32: scores and softmax float32; bf16 (XLNet's `use_bfloat16` path): everything bfloat16, the softmax's
    sum accumulated in float32 as XLA's softmax does; mixed (Funnel's `safe_softmax`): bfloat16 score sum and
    mask, the softmax's exp in float32, bfloat16 probabilities."""
    f32, bf16, mixed = (_dtypes_by_primitive(s) for s in ("f32", "bf16", "mixed"))
    assert f32["add"] == f32["exp"] == f32["select_n"] == {"float32"}
    assert bf16["add"] == bf16["exp"] == bf16["select_n"] == {"bfloat16"}
    assert f32["row_sum"] == bf16["row_sum"] == mixed["row_sum"] == {"float32"}  # the exps' sum
    assert mixed["add"] == mixed["select_n"] == {"bfloat16"} and mixed["exp"] == {"float32"}
    assert "float32" in mixed["convert_element_type"] and "bfloat16" in mixed["convert_element_type"]


def _tiny_xlnet(scores_dtype, softmax_dtype):
    cfg = X.XLNetConfig(
        vocab_size=37,
        d_model=16,
        n_layer=2,
        n_head=2,
        d_head=8,
        d_inner=24,
        dropout=0.0,
        dropatt=0.0,
        initializer_range=0.3,
        dtype="bfloat16",
        scores_dtype=scores_dtype,
        softmax_dtype=softmax_dtype,
    )
    rng = np.random.RandomState(3)
    value = lambda name, shape: (1.0 + 0.1 * rng.randn(*shape)) if name.endswith("scale") else 0.3 * rng.randn(*shape)
    model = materialize(nnx.eval_shape(lambda: X.XLNetLMHeadModel(cfg, rngs=nnx.Rngs(0))), value, seed=0)
    model.eval()
    return model


def test_tiny_xlnet_bfloat16_scores_agree_with_float32():
    """A tiny bfloat16-compute XLNet (two streams, permutation mask, padding): its LM log-probabilities with
    bfloat16 scores (and softmax) agree with float32 scores within bfloat16 tolerance."""
    rng = np.random.RandomState(5)
    b, l, m = 2, 8, 3
    tm = np.zeros((b, m, l), np.float32)
    for i in range(b):
        tm[i, np.arange(m), rng.choice(l, m, replace=False)] = 1
    kw = dict(
        input_ids=rng.randint(0, 37, (b, l)),
        token_type_ids=rng.randint(0, 2, (b, l)),
        attention_mask=np.pad(np.ones((b, l - 2), np.float32), ((0, 0), (2, 0))),
        perm_mask=(rng.rand(b, l, l) < 0.4).astype(np.float32),
        target_mapping=tm,
    )
    models = {setting: nnx.split(_tiny_xlnet(*dtypes)) for setting, dtypes in SETTINGS.items()}

    @jax.jit
    def log_probs(states, kw):  # the three settings in one program (one compile, no op-by-op dispatch)
        return {
            setting: jax.nn.log_softmax(nnx.merge(models[setting][0], state)(**kw)[0].astype(jnp.float32))
            for setting, state in states.items()
        }

    out = {
        setting: np.asarray(lp, np.float32)
        for setting, lp in log_probs({s: state for s, (_, state) in models.items()}, kw).items()
    }
    ref = out["f32"]
    assert np.isfinite(ref).all()
    for setting in ("bf16", "mixed"):
        err = np.abs(out[setting] - ref).max()
        print(f"tiny XLNet log-probabilities, {setting} scores vs float32: max |diff| {err:.4f}")
        assert err < 0.1, (setting, err)
        assert not np.array_equal(out[setting], ref)  # the setting reached the attention


POD = {  # docs/pod_plans/*.json: config file -> (scores_dtype, softmax_dtype) of the original TPU code
    "xlnet_base.py": ("bfloat16", "bfloat16"),
    "xlnet_large.py": ("bfloat16", "bfloat16"),
    "xlnet_large_bsz8192.py": ("bfloat16", "bfloat16"),
    "funnel_B10-10-10H1024_electra.py": ("bfloat16", "float32"),
    "txl_enwik8_large.py": ("float32", "float32"),
    "txl_wt103_large.py": ("float32", "float32"),
}


@pytest.mark.parametrize("name", sorted(POD) + ["xlnet_tiny.py", "funnel_tiny.py", "txl_tiny.py"])
def test_configs_carry_the_originals_score_precision(name):
    from xlgen.config import load_config

    c = load_config(f"{REPO}/configs/pretrain/{name}", {}).model
    assert (c.scores_dtype, c.softmax_dtype) == POD.get(name, ("float32", "float32"))
