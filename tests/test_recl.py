"""RECL (thesis §2.1.4) on constructed models whose effective context is known, and the context-length semantics
of the per-token losses on a real Transformer-XL."""

import numpy as np
import pytest

from xlgen.analyze.recl import TokenLosses, analyze, recl, relative_gain


def oracle_group(effective, n=20000, contexts=range(100, 1001, 100), seed=0):
    """Per-token losses of oracle models on a corpus where token t depends on one earlier token at distance d_t
    (uniform in [1, 1000)): model i predicts t well (loss 0.05) iff d_t < min(c, E_i), else it pays a
    token-specific cost in [1, 4]. Model i's effective context is E_i by construction."""
    rng = np.random.default_rng(seed)
    d = rng.integers(1, 1000, n)
    cost = rng.uniform(1.0, 4.0, n)
    return {name: {c: np.where(d < min(c, e), 0.05, cost) for c in contexts} for name, e in effective.items()}


@pytest.mark.parametrize("r", [0.1, 0.5, 1.0])
def test_recl_recovers_the_effective_context_of_constructed_models(r):
    losses = oracle_group({"short": 300, "long": 700, "tiny": 100})
    res = recl(losses, r=r, delta=100, start=100)
    assert res["recl"] == {"short": 300, "long": 700, "tiny": 100}
    assert not any(res["capped"].values())
    # gains are positive exactly while the model still learns from the added context
    for name, e in (("short", 300), ("long", 700)):
        for c, g, _ in res["curve"][name]:
            assert (g >= 0.01) == (c + 100 <= e), (name, c, g)


def test_recl_is_relative_to_the_group_baseline_and_capped():
    # a model that is better at every context by a constant does not gain RECL from it: the baseline is the best
    losses = oracle_group({"a": 400})
    better = {c: v * 0.5 for c, v in losses["a"].items()}
    res = recl({"a": losses["a"], "b": better}, r=0.5, delta=100, start=100)
    assert res["recl"]["b"] == 400
    # f_i(c, c) is the group's baseline for everyone, so the gain of "a" alone at c counts against "b"'s losses
    g = relative_gain({"a": losses["a"], "b": better}, 100, 200, 0.5)
    assert g["b"]["g"] > g["a"]["g"] > 0
    # still gaining at the largest context evaluated: reported as capped
    long = oracle_group({"x": 5000}, contexts=range(100, 501, 100))
    res = recl(long, r=1.0, delta=100, start=100)
    assert res["recl"]["x"] == 500 and res["capped"]["x"]
    out = analyze(long, [0.1, 1.0], 100, 100)
    assert set(out["per_r"]) == {"0.1", "1.0"} and len(out["ppl"]["x"]) == 5


def test_token_losses_see_exactly_the_context_length():
    """One-layer Transformer-XL: with context c a token's loss changes when the token c - 1 back changes and not
    when the token c back changes (every query attends to itself and c - 1 predecessors), after the memory has
    carried the window across segment boundaries."""
    from test_generate import tiny_txl

    model = tiny_txl(seed=4, n_layer=1)
    scorer = TokenLosses(model)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 23, 41).astype(np.int32)
    c, t = 6, 30  # loss index t predicts tokens[t + 1] from tokens[..t]
    base = scorer(tokens, c, segment=8, batch=1)
    inside, outside = tokens.copy(), tokens.copy()
    inside[t - (c - 1)] = (inside[t - (c - 1)] + 1) % 23
    outside[t - c] = (outside[t - c] + 1) % 23
    assert base[t] != scorer(inside, c, segment=8, batch=1)[t]
    np.testing.assert_array_equal(base[t], scorer(outside, c, segment=8, batch=1)[t])
    assert len(scorer._steps) == 1  # one program per context length, reused across segments and calls
