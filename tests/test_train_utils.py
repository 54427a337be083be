"""Helpers shared by the trainer tests (run `xlgen train` in subprocesses) + unit tests of the optimizer.

The end-to-end tests run the real CLI in subprocesses with the session's persistent compilation cache and
`CPU_FAST_COMPILE` (tiny models: compile time dominates), so each program compiles once per test session and every
further run (resume, restart) loads it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The simulated CPU devices are threads of one process sharing 2 cores with the other test worker: XLA aborts the
# process when a device thread reaches a collective 40 s after the others (its default terminate timeout), which a
# loaded machine can exceed. Slow is not stuck here.
CPU_COLLECTIVE_TIMEOUTS = (
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 --xla_cpu_collective_call_terminate_timeout_seconds=1200"
)

# Test programs are tiny: XLA:CPU's compile time, not their run time, is most of a test's time. Without LLVM's
# optimization passes they compile several times faster; every comparison in the suite is between programs compiled
# with the same flags (or against a tolerance).
CPU_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

# XLA:CPU runs the simulated devices' programs on one intra-op thread pool of max(cores, devices) threads, and a
# collective blocks its thread until every participant has arrived. A device can hold several such threads at once
# (one per executor running: the entry computation and each while-loop body, e.g. the layer scan): in the 2x2x2 train
# step, devices held all 8 threads in collectives (one device in two) while the last device's work waited in the
# pool's queue, forever (tests/test_pod_comm.py, test_constrained_step_on_2x2x2_mesh_equals_one_device). The pools
# get 8 threads per device (`PJRT_NPROC`, read by XLA's DefaultThreadPoolSize; idle threads cost no CPU).
CPU_THREADS_PER_DEVICE = 8


def cpu_thread_pool_env(devices: int) -> dict:
    """Environment that sizes XLA:CPU's thread pools for `devices` simulated devices (see CPU_THREADS_PER_DEVICE)."""
    return {"PJRT_NPROC": str(CPU_THREADS_PER_DEVICE * devices)}


TINY = {
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "tensorboard": False,
    "checkpoint.keep": 2,
    "model.d_model": 32,
    "model.d_embed": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.mem_len": 16,
    "data.batch_size": 8,
    "data.tgt_len": 16,
    "data.eval_batch_size": 8,
    "data.eval_tgt_len": 16,
}
TINY_XLNET = {
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "tensorboard": False,
    "checkpoint.keep": 2,
    "model.d_model": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.mem_len": 16,
    "model.reuse_len": 8,
    "data.batch_size": 8,
    "data.seq_len": 16,
    "data.reuse_len": 8,
    "data.perm_size": 8,
    "data.num_predict": 4,
}


@pytest.fixture(scope="session")
def compile_cache():
    """The session's persistent compilation cache (tests/conftest.py), shared with the in-process tests."""
    return os.environ["XLGEN_TEST_COMPILATION_CACHE"]


def xlgen_env(cache: str, devices: int = 8) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "JAX_PLATFORMS": "cpu",
            "XLGEN_COMPILATION_CACHE": cache,
            "XLGEN_COMPILATION_CACHE_MIN_SECS": "0",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {CPU_FAST_COMPILE} {CPU_COLLECTIVE_TIMEOUTS}",
            "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
            **cpu_thread_pool_env(devices),
        }
    )
    return env


def train_cmd(workdir, config="txl_tiny.py", overrides=None, extra=()):
    over = dict(TINY if config == "txl_tiny.py" else TINY_XLNET if config == "xlnet_tiny.py" else {})
    over.update(overrides or {})
    return (
        [
            sys.executable,
            "-m",
            "xlgen.cli",
            "train",
            f"--config={REPO}/configs/pretrain/{config}",
            f"--workdir={workdir}",
        ]
        + [f"--config.{k}={v}" for k, v in over.items()]
        + list(extra)
    )


def run_train(workdir, cache, config="txl_tiny.py", overrides=None, extra=(), devices=8, expect=0):
    p = subprocess.run(
        train_cmd(workdir, config, overrides, extra),
        env=xlgen_env(cache, devices),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == expect, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def train_losses(workdir) -> dict:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in recs if "split" not in r}


def sigterm_after_step(proc, workdir, *, min_step: int = 3, timeout: float = 600):
    """SIGTERM a running `xlgen train`/`finetune` process once its metrics.jsonl has a training step >= `min_step`;
    checks it exits 143 having saved a checkpoint at exactly the step it was at. -> (stdout, that step)."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(metrics) and max(train_losses(workdir) or [0]) >= min_step:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    last = max(train_losses(workdir))
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps == [last] and last >= min_step, (steps, last)
    assert f"saved checkpoint {workdir}/checkpoints/{last}" in out
    return out, last


def run_plans_subprocess(runner: str, *args: str, timeout: float = 1800) -> None:
    """Run `python -c runner *args` (plans compiled for TPU topologies through libtpu) in a clean environment: CPU
    platform, no inherited XLA_FLAGS (the tests' forced host device count would change the compile). Skips the
    calling test when libtpu is not installed."""
    from xlgen.plan import topology

    if not topology.libtpu_available():
        pytest.skip("libtpu is not installed (pip install -e '.[tpu]'): cannot compile for TPU topologies")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-c", runner, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-4000:]


def random_train_batch(program, rng, *, random_masks: bool = False) -> dict:
    """A valid random training batch for `program`'s objective, placed with its batch shardings: token ids, token
    types, a permutation mask and one-hot target mapping (XLNet), stream resets; label / target / attention masks all
    ones, or (`random_masks`) random with every row's first position kept."""
    import jax

    vocab = int(program.config.model.vocab_size)
    batch = {}
    for name, (shape, dtype) in program.objective.batch_shapes(program.config, "train").items():
        if name in ("input_ids", "labels", "target_ids"):
            x = rng.integers(0, vocab, shape)
        elif name == "token_type_ids":
            x = rng.integers(0, 2, shape)
        elif name in ("label_mask", "target_mask", "attention_mask"):
            x = np.ones(shape, bool)
            if random_masks:
                x = rng.random(shape) < (0.3 if name == "label_mask" else 0.9)
                x[:, 0] = True
        elif name == "perm_mask":
            x = rng.integers(0, 2, shape)
        elif name == "target_mapping":
            b, m, length = shape
            x = np.eye(length)[rng.integers(0, length, (b, m))]
        elif name in ("stream_reset", "is_forward"):
            x = np.arange(shape[0]) % 3 == 1
        else:
            raise AssertionError(f"unexpected batch key {name}")
        batch[name] = jax.device_put(np.asarray(x, dtype), program.batch_shardings[name])
    return batch


# ---- optimizer unit tests (fast, in-process) -------------------------------------------------------------------


def _opt_cfg(**kw):
    from xlgen.config import base_config

    c = base_config().optimizer
    c.update(kw)
    return c


def test_schedule_warmup_then_decay_to_min_ratio():
    from xlgen.train.optim import make_schedule

    for kind in ("linear", "cosine", "poly"):
        s = make_schedule(
            _opt_cfg(learning_rate=1.0, warmup_steps=10, schedule=kind, min_lr_ratio=0.1, poly_power=2.0),
            total_steps=110,
        )
        assert float(s(0)) == 0.0 and abs(float(s(5)) - 0.5) < 1e-6 and abs(float(s(10)) - 1.0) < 1e-6
        assert abs(float(s(110)) - 0.1) < 1e-6, kind
        assert float(s(60)) < 1.0


def test_weight_decay_mask_and_layer_decay_scales():
    from xlgen import registry
    from xlgen.train.optim import layer_decay_scales, weight_decay_mask

    names = [
        "layers.0.attn.q.kernel",
        "layers.0.attn.layer_norm.scale",
        "layers.1.ff.layer_1.bias",
        "r_w_bias",
        "embedding.emb_layers.0.embedding",
    ]
    m = weight_decay_mask(names)
    assert m == {names[0]: True, names[1]: False, names[2]: False, names[3]: False, names[4]: True}
    # layer l of L = 1 + max index gets rate^(L-1-l); a stacked (`layers` axis) parameter gets one scale per slice
    meta = {
        "layers.0.q": ((4, 4), ("embed", "heads")),
        "layers.2.q": ((4, 4), ("embed", "heads")),
        "layers.q": ((3, 4, 4), ("layers", "embed", "heads")),
        "emb": ((8, 4), ("vocab", "embed")),
    }
    sc = layer_decay_scales(meta, registry.get("xlnet").layer_ids, rate=0.5)
    assert sc["layers.0.q"] == np.float32(0.25) and sc["layers.2.q"] == np.float32(1.0) and sc["emb"] == 1.0
    assert sc["layers.q"].shape == (3, 1, 1)
    np.testing.assert_allclose(sc["layers.q"].reshape(-1), [0.25, 0.5, 1.0])
    assert all(float(v) == 1.0 for v in layer_decay_scales(meta, registry.get("xlnet").layer_ids, rate=1.0).values())


def test_layer_decay_lr_mode_scales_updates_and_faithful_mode_nearly_cancels():
    import jax.numpy as jnp

    from xlgen import registry
    from xlgen.train.optim import make_optimizer

    meta = {"layers.0.w": ((3,), ("embed",)), "layers.1.w": ((3,), ("embed",))}
    params = {k: jnp.ones(3) for k in meta}
    grads = {k: jnp.array([0.1, -0.2, 0.3]) for k in meta}
    upd = {}
    for mode in ("lr", "faithful"):
        tx, _ = make_optimizer(
            _opt_cfg(
                schedule="constant",
                learning_rate=1.0,
                lr_layer_decay_rate=0.5,
                layer_decay_mode=mode,
                clip_norm=0.0,
                eps=1e-8,
            ),
            10,
            meta,
            layer_ids=registry.get("xlnet").layer_ids,
        )
        u, _ = tx.update(grads, tx.init(params), params)
        upd[mode] = u
    r = np.asarray(upd["lr"]["layers.0.w"]) / np.asarray(upd["lr"]["layers.1.w"])
    np.testing.assert_allclose(r, 0.5, rtol=1e-6)  # true per-layer learning rate
    r = np.asarray(upd["faithful"]["layers.0.w"]) / np.asarray(upd["faithful"]["layers.1.w"])
    np.testing.assert_allclose(r, 1.0, rtol=1e-5)  # Adam cancels a gradient scale (up to eps)
