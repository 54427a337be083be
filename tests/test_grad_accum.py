"""Gradient accumulation (`optimizer.grad_accum_steps`): one training step over A micro-batches equals one step
over the global batch — same loss, same updated parameters, same new memory rows in the same order — for
Transformer-XL (memory, padded label masks, stream resets) and XLNet (memory, partial target masks), on one device
and on a (data=2, fsdp=2, tensor=2) mesh. Dropout is 0, so the only differences are float summation order."""

import jax
import numpy as np
import pytest
from test_train_utils import REPO

ONE = {"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, "mesh.num_devices": 1}
MESH222 = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "mesh.rules": "fsdp_tp"}
COMMON = {
    "model.d_model": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.mem_len": 8,
    "model.dropout": 0.0,
    "model.dropatt": 0.0,
    "data.batch_size": 8,
    "total_steps": 10,
    # eps >> |g|: Adam's first update -lr * g / (|g| + eps) is ~linear in the gradient, so comparing updated
    # parameters compares gradients (eps << |g| would compare their signs, ill-conditioned where g ~ 0)
    "optimizer.warmup_steps": 0,
    "optimizer.learning_rate": 1.0,
    "optimizer.eps": 1.0,
    "optimizer.clip_norm": 0,
}
FAMILY = {
    "txl_tiny.py": {"model.d_embed": 32, "data.tgt_len": 8},
    "xlnet_tiny.py": {
        "model.reuse_len": 4,
        "data.seq_len": 8,
        "data.reuse_len": 4,
        "data.perm_size": 4,
        "data.num_predict": 3,
    },
}
_CPU_FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _program(config_file, accum, mesh_over):
    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.train import build_program

    over = dict(COMMON, **FAMILY[config_file], **mesh_over, **{"optimizer.grad_accum_steps": accum})
    config = load_config(f"{REPO}/configs/pretrain/{config_file}", {k: str(v) for k, v in over.items()})
    mesh = sharding.make_mesh(config.mesh)
    return build_program(config, mesh), mesh


def _batch_and_mems(program):
    """A global batch whose micro-batches differ in their number of target tokens, and non-zero memory."""
    rng = np.random.default_rng(0)
    spec = program.objective.batch_shapes(program.config, "train")
    vocab = int(program.config.model.vocab_size)
    batch = {}
    for name, (shape, dtype) in spec.items():
        if name in ("input_ids", "labels", "target_ids"):
            batch[name] = rng.integers(0, vocab, shape)
        elif name == "token_type_ids":
            batch[name] = rng.integers(0, 2, shape)
        elif name in ("label_mask", "target_mask"):
            m = np.ones(shape)
            m[0, shape[1] // 2 :] = 0  # padding in row 0 only: micro-batches get unequal token counts
            m[3, 1:] = 0
            batch[name] = m
        elif name == "perm_mask":
            batch[name] = rng.integers(0, 2, shape)
        elif name == "target_mapping":
            b, m, l = shape
            batch[name] = np.eye(l)[rng.integers(0, l, (b, m))]
        elif name in ("stream_reset", "is_forward"):
            batch[name] = np.arange(shape[0]) % 3 == 1
        else:
            raise AssertionError(f"unexpected batch key {name}")
        batch[name] = jax.device_put(np.asarray(batch[name], dtype), program.batch_shardings[name])
    mems = rng.normal(size=program.mems_shape).astype(np.float32)
    mems[:, 5] += 10.0 * np.arange(program.mems_shape[0])[:, None, None]  # rows are distinguishable
    return batch, jax.device_put(mems, program.mems_sharding)


def _one_step(config_file, accum, mesh_over):
    program, mesh = _program(config_file, accum, mesh_over)
    with jax.set_mesh(mesh):
        state, _ = program.init_state()
        batch, mems = _batch_and_mems(program)
        before = jax.tree.map(np.asarray, state["params"])
        step = program.train_step.lower(state, batch, mems).compile(compiler_options=_CPU_FAST)
        new_state, new_mems, metrics = step(state, batch, mems)
    return before, jax.tree.map(np.asarray, (new_state["params"], new_mems, metrics))


_REF = {}


def _reference(config_file):
    if config_file not in _REF:
        _REF[config_file] = _one_step(config_file, 1, ONE)
    return _REF[config_file]


@pytest.mark.parametrize(
    "config_file,accum,mesh_over",
    [
        ("txl_tiny.py", 4, ONE),
        ("txl_tiny.py", 2, MESH222),
        pytest.param("xlnet_tiny.py", 2, MESH222, marks=pytest.mark.slow),
    ],
)
def test_accumulated_step_equals_global_batch_step(config_file, accum, mesh_over):
    before, (p1, m1, met1) = _reference(config_file)
    before2, (p2, m2, met2) = _one_step(config_file, accum, mesh_over)
    for k in before:  # same initial parameters (same seed)
        np.testing.assert_array_equal(before[k], before2[k], err_msg=k)
    np.testing.assert_allclose(met2["loss"], met1["loss"], rtol=1e-5)
    np.testing.assert_allclose(met2["grad_norm"], met1["grad_norm"], rtol=1e-5)
    assert np.isfinite(met1["loss"]) and met1["grad_norm"] > 0
    np.testing.assert_allclose(m2, m1, rtol=1e-5, atol=1e-5)  # new memory, row for row
    assert m1.shape[1] == 8
    moved = 0
    for k in p1:
        d1, d2 = p1[k] - before[k], p2[k] - before[k]
        ulp = np.spacing(np.abs(before[k]).max().astype(np.float32))  # p + u is rounded to the parameter's ulp
        np.testing.assert_allclose(d2, d1, rtol=1e-4, atol=2 * ulp + 1e-5 * np.abs(d1).max(), err_msg=k)
        moved += int(np.abs(d1).max() > 1e-6)
    assert moved > len(p1) // 2


def test_unequal_micro_batches_are_weighted_by_their_tokens():
    """The property above needs token weighting: with row 0 half padded and row 3 nearly empty, the mean of the two
    micro-batch means differs from the global mean by far more than the tolerance."""
    program, _ = _program("txl_tiny.py", 2, ONE)
    batch, _ = _batch_and_mems(program)
    w = np.asarray(batch["label_mask"])
    micro = [w[a::2].sum() for a in range(2)]  # strided micro-batches: rows a, a+2, ...
    assert micro[0] != micro[1]
    assert float(program.objective.loss_weight(jax.tree.map(lambda x: x[0::2], batch), program.config)) == micro[0]
    later = program.config.copy_and_resolve_references()
    later.objective_options.loss_positions = "later_half"  # the TXL ablation: only the later half is a target
    assert float(program.objective.loss_weight(batch, later)) == w[:, w.shape[1] // 2 :].sum()


@pytest.mark.parametrize("accum,mesh_over", [(3, ONE), (4, MESH222)])
def test_indivisible_batch_is_a_clear_error(accum, mesh_over):
    with pytest.raises(ValueError, match=r"data\.batch_size=8 is not divisible by optimizer\.grad_accum_steps"):
        _program("txl_tiny.py", accum, mesh_over)
