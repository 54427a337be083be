"""Sharded training: a (data=2, fsdp=2, tensor=2) mesh of 8 simulated CPU devices trains exactly like one device,
parameters and optimizer moments are really sharded as the rules say, and a checkpoint saved on the (2,2,2) mesh
restores onto one device and continues.

The runs call the trainer in-process (`xlgen.train.loop.train`: what `xlgen train` runs after parsing its flags,
--stop_at_step is its `stop_at`); the CLI's own process boundary is covered by tests/test_train_resume.py."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from test_train_utils import REPO, TINY, train_losses

MESH222 = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "mesh.rules": "fsdp_tp"}
ONE = {"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, "mesh.num_devices": 1}


def _train(workdir, over, stop_at=None):
    """`xlgen train --config=configs/pretrain/txl_tiny.py` with the tests' TINY sizes and `over`, in-process."""
    from xlgen.config import load_config
    from xlgen.train import loop

    config = load_config(f"{REPO}/configs/pretrain/txl_tiny.py", {k: str(v) for k, v in {**TINY, **over}.items()})
    return loop.train(config, workdir, stop_at=stop_at)


def test_2x2x2_mesh_matches_one_device_and_restores_onto_one_device(tmp_path, capsys):
    over = {"total_steps": 10, "checkpoint.every_steps": 5}
    one, sharded, moved = (str(tmp_path / n) for n in ("one", "sharded", "moved"))
    _train(one, dict(over, **ONE))
    _train(sharded, dict(over, **MESH222))
    a, b = train_losses(one), train_losses(sharded)
    assert sorted(a) == sorted(b) == list(range(1, 11))
    np.testing.assert_allclose([b[s] for s in range(1, 11)], [a[s] for s in range(1, 11)], rtol=2e-6, atol=0)
    assert a[10] < a[1]
    # saved on (2,2,2) at step 5, resumed on one device: continues like the uninterrupted runs
    _train(moved, dict(over, **MESH222), stop_at=5)
    capsys.readouterr()
    _train(moved, dict(over, **ONE))
    assert f"resumed from {moved}/checkpoints/5" in capsys.readouterr().out
    c = train_losses(moved)
    np.testing.assert_allclose([c[s] for s in range(6, 11)], [a[s] for s in range(6, 11)], rtol=2e-6, atol=0)


def test_parameters_and_moments_are_sharded_by_the_rules():
    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.train import build_program

    over = {k: str(v) for k, v in MESH222.items()}
    over.update({"model.n_layer": "1", "model.d_inner": "64"})
    config = load_config(f"{REPO}/configs/pretrain/txl_tiny.py", over)
    mesh = sharding.make_mesh(config.mesh)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    program = build_program(config, mesh)
    with jax.set_mesh(mesh):
        state, mems = program.init_state()
    params = state["params"]
    q = params["layers.0.attn.q.kernel"]  # (embed, heads, kv) -> (fsdp, tensor, -)
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (32, 2, 16)
    assert params["layers.0.ff.layer_1.kernel"].sharding.spec == P("fsdp", "tensor")  # (embed, mlp)
    assert params["embedding.tables.0"].sharding.spec == P("tensor", "fsdp")  # (vocab, embed)
    assert params["layers.0.attn.r_w_bias"].sharding.spec == P("tensor", None)  # (heads, kv)
    for name, arr in params.items():
        assert arr.sharding.spec == program.param_specs[name], name
    import optax

    is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)  # noqa: E731
    (adam,) = [x for x in jax.tree.leaves(state["opt_state"], is_leaf=is_adam) if is_adam(x)]
    for name in params:
        assert adam.mu[name].sharding.spec == params[name].sharding.spec, name
        assert adam.nu[name].sharding.spec == params[name].sharding.spec, name
    assert mems.sharding.spec == P(None, ("data", "fsdp"), None, None)
    assert mems.addressable_shards[0].data.shape[1] == config.data.batch_size // 4
