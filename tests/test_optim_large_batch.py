"""LAMB and Adafactor (`optimizer.name=lamb|adafactor`, xlgen/train/optim.py): their updates equal optax's reference
transformations on a small tree, LAMB's trust-ratio exclusion gives the excluded leaves AdamW's update, a scanned
stack gets the unscanned layers' updates, layer-wise decay and parameter groups scale the update, Adafactor's
factored moments are sharded like their parameters, and the plan's optimizer-state bytes follow; exact resume
with each."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_train_utils import REPO, TINY, _opt_cfg, train_losses

from xlgen import registry
from xlgen.train import optim

# a small tree in the trainer's form: {dotted name: array} with (shape, logical axes) metadata
META = {
    "embedding.weight": ((12, 8), ("vocab", "embed")),
    "layers.0.attn.q.kernel": ((8, 16), ("embed", "mlp")),
    "layers.0.attn.q.bias": ((16,), ("mlp",)),
    "layers.0.layer_norm.scale": ((8,), ("embed",)),
    "layers.1.attn.q.kernel": ((8, 16), ("embed", "mlp")),
    "layers.1.layer_norm.scale": ((8,), ("embed",)),
}
STEPS = 3


def _tree(seed, meta=META):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(meta))
    return {n: jax.random.normal(k, s, jnp.float32) for k, (n, (s, _)) in zip(keys, meta.items())}


def _run(tx, meta=META, steps=STEPS):
    """The updates of `steps` steps on fixed parameters and gradients (per step a new gradient)."""
    params = _tree(0, meta)
    state = tx.init(params)
    out = []
    for t in range(steps):
        updates, state = tx.update(_tree(10 + t, meta), state, params)
        out.append(updates)
        params = optax.apply_updates(params, updates)
    return out


def _equal(a, b):
    for ua, ub in zip(a, b):
        assert ua.keys() == ub.keys()
        for k in ua:
            np.testing.assert_array_equal(np.asarray(ua[k]), np.asarray(ub[k]), err_msg=k)


def _cfg(name, **kw):
    base = dict(name=name, learning_rate=1e-2, warmup_steps=0, schedule="constant", clip_norm=0.0)
    base.update(kw)
    return _opt_cfg(**base)


def test_lamb_equals_optax_lamb():
    c = _cfg("lamb", b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.01, weight_decay_mask="xlgen")
    c.lamb.update(dict(trust_ratio_mask="all"))
    tx, _ = optim.make_optimizer(c, 10, META)
    mask = optim.weight_decay_mask(list(META), "xlgen")
    ref = optax.lamb(1e-2, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.01, mask=mask)
    _equal(_run(tx), _run(ref))


def test_lamb_trust_ratio_skips_biases_and_layer_norms():
    """Default mask "xlgen": biases and LayerNorm parameters get AdamW's update (no trust ratio), the others
    LAMB's, exactly."""
    c = _cfg("lamb", eps=1e-6, weight_decay=0.01)
    tx, _ = optim.make_optimizer(c, 10, META)
    mask = optim.weight_decay_mask(list(META), "xlgen")
    ours = _run(tx)
    lamb = _run(optax.lamb(1e-2, eps=1e-6, weight_decay=0.01, mask=mask))
    adamw = _run(optax.adamw(1e-2, eps=1e-6, weight_decay=0.01, mask=mask))
    excluded = {n for n, m in optim.weight_decay_mask(list(META), "xlgen").items() if not m}
    assert excluded == {"layers.0.attn.q.bias", "layers.0.layer_norm.scale", "layers.1.layer_norm.scale"}
    for u, ul, ua in zip(ours, lamb, adamw):
        for n in META:
            np.testing.assert_array_equal(np.asarray(u[n]), np.asarray((ua if n in excluded else ul)[n]), err_msg=n)
    # the trust ratio really acts: LAMB's kernel update differs from AdamW's
    assert not np.allclose(ours[0]["layers.0.attn.q.kernel"], adamw[0]["layers.0.attn.q.kernel"])


@pytest.mark.parametrize("momentum,clip,wd", [(0.0, 1.0, 0.0), (0.9, 0.0, 0.01)])
def test_adafactor_equals_optax_adafactor(momentum, clip, wd):
    c = _cfg("adafactor", weight_decay=wd, weight_decay_mask="xlgen")
    c.adafactor.update(dict(min_dim_size_to_factor=8, momentum=momentum, clipping_threshold=clip, decay_rate=0.8))
    tx, _ = optim.make_optimizer(c, 10, META)
    ref = optax.adafactor(
        learning_rate=optax.constant_schedule(1e-2),
        min_dim_size_to_factor=8,
        momentum=momentum or None,
        clipping_threshold=clip or None,
        weight_decay_rate=wd or None,
        weight_decay_mask=optim.weight_decay_mask(list(META), "xlgen") if wd else None,
    )
    _equal(_run(tx), _run(ref))
    # factored second moments: a [8, 16] kernel keeps 8 + 16 numbers, not 128
    state = jax.eval_shape(tx.init, _tree(0))
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    shapes = {(jax.tree_util.keystr(p[-2:-1]), p[-1].key): tuple(x.shape) for p, x in leaves if hasattr(p[-1], "key")}
    assert shapes[(".v_row", "layers.0.attn.q.kernel")] == (8,)
    assert shapes[(".v_col", "layers.0.attn.q.kernel")] == (16,)
    assert shapes[(".v", "layers.0.attn.q.kernel")] == (1,)
    assert shapes[(".v", "layers.0.attn.q.bias")] == (16,)  # one dimension: not factored


def test_adafactor_relative_step():
    """relative_step: lr(t) = min(learning_rate, 1/sqrt(t+1)); warmup_init: min(1e-6 (t+1), 1/sqrt(t+1)); the
    updates are optax.adafactor's with that schedule."""
    s = optim.relative_step_schedule(0.01)
    assert [float(s(t)) for t in (0, 9999, 39999)] == pytest.approx([0.01, 0.01, 0.005])
    w = optim.relative_step_schedule(0.01, warmup_init=True)
    assert [float(w(t)) for t in (0, 999)] == pytest.approx([1e-6, 1e-3])
    c = _cfg("adafactor", learning_rate=0.5)
    c.adafactor.update(dict(relative_step=True, min_dim_size_to_factor=8))
    tx, sched = optim.make_optimizer(c, 10, META)
    assert [float(sched(t)) for t in (0, 3, 15)] == pytest.approx([0.5, 0.5, 0.25])
    ref = optax.adafactor(learning_rate=optim.relative_step_schedule(0.5), min_dim_size_to_factor=8)
    _equal(_run(tx, steps=5), _run(ref, steps=5))


def _stacked_meta(n_layer=3):
    return {
        "embedding.weight": ((12, 8), ("vocab", "embed")),
        "layers.attn.q.kernel": ((n_layer, 8, 16), ("layers", "embed", "mlp")),
        "layers.layer_norm.scale": ((n_layer, 8), ("layers", "embed")),
    }


@pytest.mark.parametrize("name", ["lamb", "adafactor"])
def test_scanned_stack_gets_the_unscanned_layers_updates(name):
    """Trust ratio (LAMB) and factoring / clipping / parameter scale (Adafactor) run per layer of a scanned stack."""
    stacked = _stacked_meta()
    flat = {"embedding.weight": stacked["embedding.weight"]}
    for i in range(3):
        flat[f"layers.{i}.attn.q.kernel"] = ((8, 16), ("embed", "mlp"))
        flat[f"layers.{i}.layer_norm.scale"] = ((8,), ("embed",))
    c = _cfg(name, weight_decay=0.01)
    c.adafactor.update(dict(min_dim_size_to_factor=8))
    tx_s, _ = optim.make_optimizer(c, 10, stacked)
    tx_f, _ = optim.make_optimizer(c, 10, flat)
    p_s, state_s = _tree(0, stacked), None
    p_f = {"embedding.weight": p_s["embedding.weight"]}
    for i in range(3):
        p_f[f"layers.{i}.attn.q.kernel"] = p_s["layers.attn.q.kernel"][i]
        p_f[f"layers.{i}.layer_norm.scale"] = p_s["layers.layer_norm.scale"][i]
    state_s, state_f = tx_s.init(p_s), tx_f.init(p_f)
    for t in range(STEPS):
        g_s = _tree(10 + t, stacked)
        g_f = {"embedding.weight": g_s["embedding.weight"]}
        for i in range(3):
            g_f[f"layers.{i}.attn.q.kernel"] = g_s["layers.attn.q.kernel"][i]
            g_f[f"layers.{i}.layer_norm.scale"] = g_s["layers.layer_norm.scale"][i]
        u_s, state_s = tx_s.update(g_s, state_s, p_s)
        u_f, state_f = tx_f.update(g_f, state_f, p_f)
        np.testing.assert_allclose(u_s["embedding.weight"], u_f["embedding.weight"], rtol=1e-6)
        for i in range(3):
            for leaf in ("attn.q.kernel", "layer_norm.scale"):
                np.testing.assert_allclose(u_s[f"layers.{leaf}"][i], u_f[f"layers.{i}.{leaf}"], rtol=1e-5, atol=1e-9)
        p_s, p_f = optax.apply_updates(p_s, u_s), optax.apply_updates(p_f, u_f)


@pytest.mark.parametrize("name", ["lamb", "adafactor"])
def test_layer_decay_and_param_groups_scale_the_update(name):
    """lr-mode layer-wise decay (rate 0.5: layer 0 of 2 gets 0.5, layer 1 and the embedding 1) and a parameter
    group (lr_scale 0.1 on the embedding, a frozen LayerNorm) multiply the optimizer's own update."""
    c = _cfg(name, weight_decay=0.01)
    c.adafactor.update(dict(min_dim_size_to_factor=8))
    plain = _run(optim.make_optimizer(c, 10, META, layer_ids=registry.get("xlnet").layer_ids)[0])
    c.lr_layer_decay_rate, c.layer_decay_mode = 0.5, "lr"
    c.param_groups = ({"pattern": "^embedding", "lr_scale": 0.1}, {"pattern": "layers.1.layer_norm", "frozen": True})
    scaled = _run(optim.make_optimizer(c, 10, META, layer_ids=registry.get("xlnet").layer_ids)[0], steps=1)
    want = {n: 1.0 for n in META}
    want.update({n: 0.5 for n in META if n.startswith("layers.0.")})
    want["embedding.weight"] = 0.1
    want["layers.1.layer_norm.scale"] = 0.0
    for n, s in want.items():
        np.testing.assert_allclose(scaled[0][n], s * np.asarray(plain[0][n]), rtol=1e-6, err_msg=n)


def test_unknown_names_and_masks_are_errors():
    with pytest.raises(ValueError, match="optimizer.name='lars'"):
        optim.make_optimizer(_cfg("lars"), 10, META)
    c = _cfg("lamb")
    c.lamb.update(dict(trust_ratio_mask="none"))
    with pytest.raises(ValueError, match="optimizer.lamb.trust_ratio_mask='none'"):
        optim.make_optimizer(c, 10, META)
    with pytest.raises(ValueError, match="update_rule='original' applies to adam/adamw"):
        optim.make_optimizer(_cfg("adafactor", update_rule="original"), 10, META)


def test_factored_moments_sharded_like_their_parameter():
    """`opt_state_shardings`: Adam/LAMB moments take the parameter's spec; Adafactor's v_row (the larger dimension
    dropped) and v_col (the other) take the spec without that dimension, also for a scanned stack."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from xlgen import sharding

    mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    meta = {
        "w": ((256, 64), ("mlp", "embed")),
        "stack": ((2, 64, 256), ("layers", "embed", "mlp")),
    }
    specs = {"w": P("fsdp", None), "stack": P(None, None, "fsdp")}
    shard = {n: NamedSharding(mesh, specs[n]) for n in meta}
    shapes = {n: s for n, (s, _) in meta.items()}
    c = _cfg("adafactor")
    c.adafactor.update(dict(min_dim_size_to_factor=8))
    tx, _ = optim.make_optimizer(c, 10, meta)
    params = {n: jax.ShapeDtypeStruct(s, jnp.float32) for n, s in shapes.items()}
    state = jax.eval_shape(tx.init, params)
    out = sharding.opt_state_shardings(state, shard, shapes, mesh)
    got = {}
    for (path, leaf), (_, sh) in zip(
        jax.tree_util.tree_flatten_with_path(state)[0], jax.tree_util.tree_flatten_with_path(out)[0]
    ):
        if hasattr(path[-1], "key"):
            got[(jax.tree_util.keystr(path[-2:-1]), path[-1].key)] = (tuple(leaf.shape), sh.spec)
    assert got[(".v_row", "w")] == ((64,), P(None))  # the 256 rows (sharded) dropped
    assert got[(".v_col", "w")] == ((256,), P("fsdp"))
    # the stack: per layer [64, 256], state batched on the layers axis
    assert got[(".v_row", "stack")] == ((2, 64), P(None, None))
    assert got[(".v_col", "stack")] == ((2, 256), P(None, "fsdp"))


@pytest.fixture(scope="module")
def state_bytes():
    """The plan's per-device state bytes (`xlgen.plan.state_breakdown`) of xlnet_tiny under fsdp=4 on 8 CPU devices,
    per optimizer (abstract: nothing compiled)."""
    from test_train_utils import REPO

    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.plan import state_breakdown
    from xlgen.train.program import build_program

    out = {}
    for name in ("adamw", "lamb", "adafactor"):
        c = load_config(
            f"{REPO}/configs/pretrain/xlnet_tiny.py",
            {
                "optimizer.name": name,
                "mesh.fsdp": "4",
                "mesh.data": "2",
                "mesh.rules": "fsdp",
                "optimizer.adafactor.min_dim_size_to_factor": "16",
            },
        )
        program = build_program(c, sharding.make_mesh(c.mesh))
        out[name] = state_breakdown(program.abstract_state())
    return out


def test_plan_state_bytes_per_optimizer(state_bytes):
    """Adam and LAMB keep two moments per parameter, each sharded like it (2 x the parameters' bytes per device,
    + the step count); Adafactor's factored moments are a small fraction."""
    adam, lamb, ada = state_bytes["adamw"], state_bytes["lamb"], state_bytes["adafactor"]
    assert adam["params"] == lamb["params"] == ada["params"]
    assert lamb["opt_state"] == adam["opt_state"]
    assert 2 * adam["params"] <= adam["opt_state"] <= 2 * adam["params"] + 64
    assert ada["opt_state"] < 0.5 * adam["params"]


@pytest.mark.parametrize(
    "name,extra", [("lamb", {}), ("adafactor", {"optimizer.adafactor.min_dim_size_to_factor": 16})]
)
def test_resume_is_bitwise_exact(tmp_path, capsys, name, extra):
    """Train 2k steps vs k steps + resume to 2k (the trainer `xlgen train` runs, in-process; `stop_at` is its
    --stop_at_step): identical losses."""
    from xlgen.config import load_config
    from xlgen.train import loop

    k = 3
    over = {"total_steps": 2 * k, "checkpoint.every_steps": k, "mesh.num_devices": 1, "optimizer.name": name}
    over.update(extra)
    config = lambda: load_config(  # noqa: E731
        f"{REPO}/configs/pretrain/txl_tiny.py", {n: str(v) for n, v in {**TINY, **over}.items()}
    )
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    loop.train(config(), full)
    loop.train(config(), part, stop_at=k)
    capsys.readouterr()
    loop.train(config(), part)
    assert f"resumed from {part}/checkpoints/{k}" in capsys.readouterr().out
    a, b = train_losses(full), train_losses(part)
    assert sorted(b) == list(range(1, 2 * k + 1))
    assert [b[s] for s in range(k + 1, 2 * k + 1)] == [a[s] for s in range(k + 1, 2 * k + 1)]
