"""Layer-wise learning-rate decay (`Family.layer_ids` / `make_optimizer(layer_ids=...)`) on the real parameter
names of all three families, unscanned and scanned: layer l of L gets rate**(L-1-l), and a scanned model (parameters
stacked on the `layers` axis) gets exactly the updates of the unscanned one for the same gradients."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_utils import REPO, _opt_cfg

RATE = 0.5


def _meta(config_file, model=None, **over):
    from xlgen import registry
    from xlgen.config import load_config
    from xlgen.train.program import abstract_model

    config = load_config(f"{REPO}/configs/pretrain/{config_file}", {k: str(v) for k, v in over.items()})
    with config.unlocked():
        config.model.update(model or {})
    obj = registry.objective(config)
    return abstract_model(lambda r: obj.make_model(config, r, True), train=True).meta()


def _layer_ids_of(family):
    """The family's numbering of parameters into layers (`Family.layer_ids`), what the trainer gives the optimizer."""
    from xlgen import registry

    return registry.get(family).layer_ids


def _layer_ids(meta, family):
    return _layer_ids_of(family)(meta)


def _scales(meta, family):
    from xlgen.train import optim

    ids, n = _layer_ids(meta, family)
    return optim.scales_from_ids(ids, n, RATE), n


def _call(f, *args):
    """f(*args) compiled once without XLA's expensive CPU passes (these tests are compile-bound)."""
    opts = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
    return jax.jit(f).lower(*args).compile(compiler_options=opts)(*args)


SMALL = {"model.d_model": 16, "model.n_head": 2, "model.d_head": 8, "model.d_inner": 32}


@pytest.mark.parametrize(
    "config_file,family,prefix", [("txl_tiny.py", "transformer_xl", ""), ("xlnet_tiny.py", "xlnet", "transformer.")]
)
def test_txl_xlnet_layer_l_of_n_gets_rate_pow_n_minus_1_minus_l(config_file, family, prefix):
    over = dict(SMALL, **{"model.n_layer": 3})
    if family == "transformer_xl":
        over["model.d_embed"] = 16
    flat = _meta(config_file, **over)
    sc, n = _scales(flat, family)
    assert n == 3
    for name, s in sc.items():
        m = re.match(rf"{re.escape(prefix)}layers\.(\d+)\.", name)
        want = RATE ** (2 - int(m.group(1))) if m else 1.0  # embeddings, mask_emb, softmax/lm_bias: 1.0
        assert float(s) == pytest.approx(want, rel=1e-7), name
    assert any(k.startswith(prefix + "layers.0.") for k in sc) and any("embedding" in k for k in sc)

    stacked = _meta(config_file, **over, **{"model.scan_layers": True})
    sc2, n2 = _scales(stacked, family)
    assert n2 == 3
    for name, (shape, axes) in stacked.items():
        if name.startswith(prefix + "layers."):
            assert axes[0] == "layers" and np.shape(sc2[name]) == (3,) + (1,) * (len(shape) - 1), name
            np.testing.assert_allclose(np.ravel(sc2[name]), [RATE**2, RATE, 1.0], rtol=1e-7)
        else:
            assert float(sc2[name]) == 1.0, name


def _funnel_expect(name, sizes, n_dec):
    """The Funnel numbering written out: input 0, encoder parameter layers 1.., decoder on top, heads 1.0."""
    n = 1 + sum(sizes) + n_dec
    m = re.search(r"encoder\.blocks\.(\d+)\.(\d+)\.", name)
    if m:
        return RATE ** (n - 1 - (1 + sum(sizes[: int(m.group(1))]) + int(m.group(2))))
    m = re.search(r"decoder\.layers\.(\d+)\.", name)
    if m:
        return RATE ** (n - 1 - (1 + sum(sizes) + int(m.group(1))))
    if ".embeddings." in "." + name or "input_projection" in name:
        return RATE ** (n - 1)
    return 1.0


@pytest.mark.parametrize(
    "over,sizes,n_dec",
    [
        ({"model.block_sizes": "(2, 1, 3)", "model.num_decoder_layers": 2}, (2, 1, 3), 2),
        ({"model": {"block_sizes": (2, 1), "block_repeats": (2, 2)}, "model.num_decoder_layers": 1}, (2, 1), 1),
        ({"objective": "funnel_electra", "model.block_sizes": "(1, 2)", "model.num_decoder_layers": 1}, (1, 2), 1),
    ],
)
def test_funnel_input_blocks_decoder_numbered_as_one_stack(over, sizes, n_dec):
    from xlgen.train import optim

    flat = _meta("funnel_tiny.py", **SMALL, **over)  # "model": B2x2-1x2, shared layers count once
    ids, n = _layer_ids(flat, "funnel")
    assert n == 1 + sum(sizes) + n_dec
    sc = optim.scales_from_ids(ids, n, RATE)
    for name, s in sc.items():
        assert float(s) == pytest.approx(_funnel_expect(name, sizes, n_dec), rel=1e-7), name
    emb = [k for k in sc if "embeddings.word_embeddings" in k]
    assert emb and all(float(sc[k]) == RATE ** (n - 1) for k in emb)  # the bottom layer
    heads = [k for k in sc if ("lm_head" in k or "head" in k.split(".")[0]) and "encoder" not in k]
    assert heads and all(float(sc[k]) == 1.0 for k in heads)
    if "objective" in over:  # ELECTRA: generator and discriminator towers are numbered alike
        g = {k.split("encoder.", 1)[1]: float(v) for k, v in sc.items() if k.startswith("generator.encoder.")}
        d = {
            k.split("encoder.", 1)[1]: float(v) for k, v in sc.items() if k.startswith("discriminator.funnel.encoder.")
        }
        common = [k for k in g if k.startswith("blocks.")]
        assert len(common) > 10 and all(d[k] == g[k] for k in common)
        assert g["input_projection.kernel"] == RATE ** (n - 1)  # the narrow generator's input projection: layer 0


# ---- scanned vs unscanned: identical updates -------------------------------------------------------------------


def _stack(meta, *patterns):
    """Stack the unscanned layers matched by `patterns` (groups: stack prefix, layer index, rest) on a leading
    `layers` axis -> (stacked meta, {stacked name: [unscanned names in layer order]})."""
    groups, out = {}, {}
    for name, (shape, axes) in meta.items():
        m = next((m for m in (re.match(p, name) for p in patterns) if m), None)
        if m:
            groups.setdefault(f"{m.group(1)}.{m.group(3)}", []).append((int(m.group(2)), name, shape, axes))
        else:
            out[name] = (shape, axes)
    stacks = {}
    for sname, members in groups.items():
        members.sort()
        assert [i for i, *_ in members] == list(range(len(members)))
        out[sname] = ((len(members),) + members[0][2], ("layers",) + tuple(members[0][3]))
        stacks[sname] = [n for _, n, *_ in members]
    return out, stacks


def _layouts(family):
    """(unscanned meta, scanned meta, {stacked name: [unscanned names]}) of a small model of `family`."""
    if family == "funnel":
        flat = _meta("funnel_tiny.py", **SMALL, **{"model.block_sizes": "(2, 1)", "model.num_decoder_layers": 2})
        # the layout a scanned Funnel would have (it has no scan option): each block's and the decoder's layers stacked
        stacked_meta, stacks = _stack(
            flat, r"(.*encoder\.blocks\.\d+)\.(\d+)\.(.*)", r"(.*decoder\.layers)\.(\d+)\.(.*)"
        )
    else:
        cfg = "txl_tiny.py" if family == "transformer_xl" else "xlnet_tiny.py"
        over = dict(SMALL, **{"model.n_layer": 3}, **({"model.d_embed": 16} if family == "transformer_xl" else {}))
        flat = _meta(cfg, **over)
        stacked_meta, stacks = _stack(flat, r"((?:transformer\.)?layers)\.(\d+)\.(.*)")
        assert _meta(cfg, **over, **{"model.scan_layers": True}) == stacked_meta  # the model's own scanned layout
    assert stacks
    return flat, stacked_meta, stacks


def _stacker(stacked_meta, stacks):
    def stack(tree):
        out = {k: v for k, v in tree.items() if k in stacked_meta}
        out.update(
            {s: np.stack([np.broadcast_to(tree[n], np.shape(tree[n])) for n in names]) for s, names in stacks.items()}
        )
        return out

    return stack


@pytest.mark.parametrize("family", ["transformer_xl", "xlnet", "funnel"])
def test_scanned_scales_are_the_unscanned_scales_stacked(family):
    """Every element of a stacked parameter gets exactly the scale of the same element of the unscanned layer; the
    rest of the chain (global-norm clip, Adam, masked weight decay) is element-wise, so the updates agree."""
    from xlgen.train import optim

    flat, stacked_meta, stacks = _layouts(family)
    (ids1, n1), (ids2, n2) = _layer_ids(flat, family), _layer_ids(stacked_meta, family)
    assert n1 == n2 == (1 + 3 + 2 if family == "funnel" else 3)
    s1, s2 = optim.scales_from_ids(ids1, n1, RATE), optim.scales_from_ids(ids2, n2, RATE)
    stack = _stacker(stacked_meta, stacks)
    full = lambda sc, meta: {k: np.broadcast_to(v, meta[k][0]) for k, v in sc.items()}  # noqa: E731
    a, b = stack(full(s1, flat)), full(s2, stacked_meta)
    assert sorted(a) == sorted(b)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert len({float(x) for v in b.values() for x in np.unique(v)}) == n1  # one distinct scale per layer


@pytest.mark.parametrize("family,mode", [("transformer_xl", "faithful"), ("xlnet", "lr"), ("funnel", "lr")])
def test_scanned_and_unscanned_get_identical_updates(family, mode):
    """Two real optimizer steps (clip, Adam, weight decay, layer decay) on both layouts agree; the first update is the
    closed form  -lr * s * (g_c / (|g_c| + eps) + wd * p)  (mode lr)  or  -lr * (s g_c / (|s g_c| + eps) + wd * p)
    (mode faithful, gradients scaled before Adam), g_c the clipped gradient, s the layer scale."""
    from xlgen.train import optim

    flat, stacked_meta, stacks = _layouts(family)
    stack = _stacker(stacked_meta, stacks)
    rng = np.random.default_rng(0)
    params = {k: rng.normal(size=s).astype(np.float32) for k, (s, _) in flat.items()}
    grads = [{k: rng.normal(size=s).astype(np.float32) for k, (s, _) in flat.items()} for _ in range(2)]
    lr, wd, eps, clip = 1e-2, 0.01, 1e-6, 1.0
    cfg = _opt_cfg(
        schedule="constant",
        learning_rate=lr,
        warmup_steps=0,
        lr_layer_decay_rate=RATE,
        layer_decay_mode=mode,
        clip_norm=clip,
        weight_decay=wd,
        eps=eps,
    )

    def run(tx, p, gs):  # two optimizer steps, one compiled program
        state, us = tx.init(p), []
        for g in gs:
            u, state = tx.update(g, state, p)
            p = jax.tree.map(jnp.add, p, u)
            us.append(u)
        return p, us

    results = []
    for meta, p, gs in ((flat, params, grads), (stacked_meta, stack(params), [stack(g) for g in grads])):
        tx, _ = optim.make_optimizer(cfg, 10, meta, layer_ids=_layer_ids_of(family))
        results.append(_call(lambda p, gs: run(tx, p, gs), p, gs))
    (p1, us1), (p2, us2) = results
    for a, b in [(stack(p1), p2)] + [(stack(x), y) for x, y in zip(us1, us2)]:
        for k in b:
            np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-6, atol=1e-7, err_msg=k)

    ids, n = _layer_ids(flat, family)
    scales = optim.scales_from_ids(ids, n, RATE)
    mask = optim.weight_decay_mask(list(flat))
    norm = np.sqrt(sum(float(np.sum(np.square(g.astype(np.float64)))) for g in grads[0].values()))
    for k, g in grads[0].items():
        gc, sc, decay = g * min(1.0, clip / norm), float(scales[k]), wd * params[k] * mask[k]
        want = (
            -lr * sc * (gc / (np.abs(gc) + eps) + decay)
            if mode == "lr"
            else -lr * (sc * gc / (np.abs(sc * gc) + eps) + decay)
        )
        np.testing.assert_allclose(np.asarray(us1[0][k]), want, rtol=2e-5, atol=1e-8, err_msg=k)
    lowest = [k for k, i in ids.items() if i is not None and int(i) == 0]
    assert lowest and min(float(scales[k]) for k in lowest) == RATE ** (n - 1)


def test_program_uses_the_family_numbering_for_funnel():
    """Through build_program (what `xlgen train` runs): a Funnel pretraining config's optimizer decays per layer."""
    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.train.program import build_program

    over = {k: str(v) for k, v in SMALL.items()}
    over.update(
        {
            "optimizer.lr_layer_decay_rate": str(RATE),
            "optimizer.weight_decay": "0",
            "optimizer.warmup_steps": "0",
            "optimizer.schedule": "constant",
            "optimizer.clip_norm": "0",
            "mesh.num_devices": "1",
        }
    )
    config = load_config(f"{REPO}/configs/pretrain/funnel_tiny.py", over)
    program = build_program(config, sharding.make_mesh(config.mesh))
    meta = program.train_spec.meta()
    ids, n = _layer_ids(meta, "funnel")
    assert n == 1 + 6 + 2
    params = {k: jnp.zeros(s, jnp.float32) for k, (s, _) in meta.items()}
    g = {k: jnp.ones(s, jnp.float32) for k, (s, _) in meta.items()}
    u, _ = _call(lambda g, p: program.tx.update(g, program.tx.init(p), p), g, params)
    lr = float(config.optimizer.learning_rate)
    for k, i in ids.items():
        want = -lr * (1.0 if i is None else RATE ** (n - 1 - int(i)))
        np.testing.assert_allclose(np.asarray(u[k]), want, rtol=1e-4, err_msg=k)
    assert float(np.ravel(u["funnel.embeddings.word_embeddings"])[0]) == pytest.approx(-lr * RATE**8, rel=1e-4)


def test_layer_decay_without_a_numbering_is_an_error():
    from xlgen.train import optim

    meta = {"layers.0.w": ((3,), ("embed",))}
    with pytest.raises(ValueError, match="model.family's numbering"):  # decay for a system without `layer_ids`
        optim.make_optimizer(_opt_cfg(lr_layer_decay_rate=0.5), 10, meta)
    optim.make_optimizer(_opt_cfg(lr_layer_decay_rate=1.0), 10, meta)  # no decay: no numbering
