"""`optimizer.param_groups` (xlgen/train/optim.py): per-group learning rates and frozen parameters through optax masks,
general over dotted parameter names (LMS-PLIF's layer-specific rate and LMS-PLIF†'s frozen slopes, finetuning)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_utils import _opt_cfg

from xlgen.config import apply_override, base_config
from xlgen.train import optim

SHAPES = {"embedding.tables.0": (5, 3), "softmax.slope_logits": (4,), "layers.0.ff.kernel": (3, 3)}
META = {n: (s, (None,) * len(s)) for n, s in SHAPES.items()}


def _tree(seed):
    keys = jax.random.split(jax.random.key(seed), len(SHAPES))
    return {n: jax.random.normal(k, s) for k, (n, s) in zip(keys, SHAPES.items())}


def _run(groups, grads_seq, params):
    cfg = _opt_cfg(
        name="adamw", learning_rate=0.01, schedule="constant", warmup_steps=0, weight_decay=0.1, clip_norm=0.5,
        param_groups=groups,
    )  # fmt: skip
    tx, _ = optim.make_optimizer(cfg, 10, META)
    state = tx.init(params)
    ups = []
    for g in grads_seq:
        u, state = tx.update(g, state, params)
        ups.append(u)
    return ups


def test_group_learning_rate_and_frozen_parameters():
    """Frozen: update exactly 0 (weight decay included) and its gradient outside the clip norm; a group with
    learning_rate 0.02 (base 0.01) moves exactly 2x what it moves without groups; others unchanged."""
    params = _tree(0)
    grads = [jax.tree.map(lambda x: 3.0 * x, _tree(s)) for s in (1, 2, 3)]
    groups = (
        {"pattern": "slope_logits", "learning_rate": 0.02},
        {"pattern": "^embedding[.]", "frozen": True},
    )
    got = _run(groups, grads, params)
    # the reference: no groups, the frozen parameter's gradient zeroed (then the clip norms agree)
    no_emb = [{**g, "embedding.tables.0": jnp.zeros(SHAPES["embedding.tables.0"])} for g in grads]
    ref = _run(None, no_emb, params)
    for u, r in zip(got, ref):
        assert float(jnp.abs(u["embedding.tables.0"]).max()) == 0.0
        np.testing.assert_array_equal(u["softmax.slope_logits"], 2.0 * r["softmax.slope_logits"])
        np.testing.assert_array_equal(u["layers.0.ff.kernel"], r["layers.0.ff.kernel"])
    assert float(jnp.abs(ref[0]["embedding.tables.0"]).max()) > 0  # weight decay would move it without the group
    scaled = _run(({"pattern": "ff", "lr_scale": 0.25},), no_emb, params)
    np.testing.assert_array_equal(scaled[1]["layers.0.ff.kernel"], 0.25 * ref[1]["layers.0.ff.kernel"])


def test_param_group_errors_name_the_group_and_key():
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.pattern='nothing'.*matches no parameter"):
        optim.param_group_scales(list(SHAPES), ({"pattern": "slope"}, {"pattern": "nothing"}), 0.01)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.lr: unknown key"):
        optim.param_group_scales(list(SHAPES), ({"pattern": "slope", "lr": 1.0},), 0.01)
    with pytest.raises(ValueError, match="not both"):
        optim.param_group_scales(list(SHAPES), ({"pattern": "slope", "lr_scale": 1.0, "learning_rate": 1.0},), 0.01)
    scales, frozen, matched = optim.param_group_scales(
        list(SHAPES), ({"pattern": "^soft", "frozen": True}, {"pattern": "(slope|kernel)", "lr_scale": 3.0}), 0.01
    )  # first match wins: group 0 owns the slopes, group 1 the kernel; the rest keep scale 1
    assert matched == [["softmax.slope_logits"], ["layers.0.ff.kernel"]]
    assert scales == {"embedding.tables.0": 1.0, "softmax.slope_logits": 0.0, "layers.0.ff.kernel": 3.0}
    assert frozen == {"embedding.tables.0": False, "softmax.slope_logits": True, "layers.0.ff.kernel": False}
    with pytest.raises(ValueError, match=r"param_groups\[1\].*matches no parameter"):  # shadowed by group 0
        optim.param_group_scales(list(SHAPES), ({"pattern": "slope"}, {"pattern": "slope_logits"}), 0.01)


def test_param_groups_from_the_command_line():
    c = base_config()
    assert c.optimizer.param_groups is None
    apply_override(c, "optimizer.param_groups", "({'pattern': 'slope_logits', 'learning_rate': 0.02},)")
    groups = c.optimizer.param_groups
    assert tuple(dict(g) for g in groups) == ({"pattern": "slope_logits", "learning_rate": 0.02},)
