"""Funnel-Transformer pretraining through the real trainer (`xlgen.train.loop.train`, in-process: what `xlgen train`
runs, minus a process start per run; the resumed run reuses the compiled program): MLM and ELECTRA losses fall on
the embedded corpus, a run stopped at `stop_at` (CLI --stop_at_step) and resumed logs bitwise the metrics of the
uninterrupted run, and ELECTRA logs gen_loss and disc_loss with loss = gen_loss + disc_coeff * disc_loss for the
configured disc_coeff.

Cost (2 CPU cores): MLM ~17 s CPU, ELECTRA ~47 s (compiling the generator + discriminator dominates). A (2,2,2)
mesh run costs another ~35 s of SPMD compilation, so the sharded trainer is covered by test_train_sharding (TXL)."""

import json
import os

import numpy as np
import pytest
from test_train_utils import REPO

STEPS, K = 12, 6
TINY_FUNNEL = {
    "log_every_steps": 1,
    "eval_every_steps": 0,
    "tensorboard": False,
    "checkpoint.keep": 2,
    "checkpoint.every_steps": K,
    "total_steps": STEPS,
    "mesh.num_devices": 1,
    "model.d_model": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.block_sizes": "(1,1)",
    "model.num_decoder_layers": 1,
    "data.seq_len": 32,
    "data.batch_size": 8,
    "optimizer.warmup_steps": 2,
    "optimizer.learning_rate": 3e-3,
}
ELECTRA = {"objective": "funnel_electra", "data.pipeline": "electra", "objective_options.disc_coeff": 20.0}


def _train(workdir, over, stop_at=None):
    from xlgen.config import load_config
    from xlgen.train import loop

    config = load_config(f"{REPO}/configs/pretrain/funnel_tiny.py", {k: str(v) for k, v in over.items()})
    return loop.train(config, workdir, stop_at=stop_at)


def _records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r for r in recs if "split" not in r}


def _falls(values, margin):
    v = [values[s] for s in sorted(values)]
    assert np.all(np.isfinite(v)), v
    assert np.mean(v[-3:]) < np.mean(v[:3]) - margin, v


def _full_then_resumed(tmp_path, over, capsys):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    _train(full, over)
    _train(part, over, stop_at=K)
    assert sorted(_records(part)) == list(range(1, K + 1))
    capsys.readouterr()
    _train(part, over)  # the same call resumes
    assert f"resumed from {part}/checkpoints/{K}" in "".join(capsys.readouterr())
    a, b = _records(full), _records(part)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    return a, b


def test_mlm_loss_falls_and_resume_is_bitwise_exact(tmp_path, capsys):
    a, b = _full_then_resumed(tmp_path, TINY_FUNNEL, capsys)
    _falls({s: r["loss"] for s, r in a.items()}, 0.1)  # ln(74) = 4.30 -> below 4.0
    for s in range(K + 1, STEPS + 1):
        assert b[s]["loss"] == a[s]["loss"] and b[s]["mlm_accuracy"] == a[s]["mlm_accuracy"], s
        assert b[s]["grad_norm"] == a[s]["grad_norm"], s


@pytest.mark.slow
def test_electra_losses_weighted_by_disc_coeff_fall_and_resume_is_bitwise_exact(tmp_path, capsys):
    a, b = _full_then_resumed(tmp_path, dict(TINY_FUNNEL, **ELECTRA), capsys)
    coeff = ELECTRA["objective_options.disc_coeff"]
    for s, r in a.items():
        assert {"gen_loss", "disc_loss", "disc_accuracy", "replaced_ratio"} <= set(r), r
        np.testing.assert_allclose(r["loss"], r["gen_loss"] + coeff * r["disc_loss"], rtol=1e-6, err_msg=str(s))
        assert 0.0 < r["replaced_ratio"] < 0.5
    _falls({s: r["gen_loss"] for s, r in a.items()}, 0.1)
    _falls({s: r["disc_loss"] for s, r in a.items()}, 0.01)
    for s in range(K + 1, STEPS + 1):
        for key in ("loss", "gen_loss", "disc_loss", "disc_accuracy", "grad_norm"):
            assert b[s][key] == a[s][key], (s, key)


def test_mlm_eval_at_predicted_rows_equals_every_position():
    """The MLM eval loss runs the last decoder layer at the pipeline's per-row count of predicted rows; on the `mlm`
    pipeline's eval batches (every row predicts that many) its summed NLL and count equal every position's."""
    import jax
    from flax import nnx

    import data_pipelines
    from xlgen import registry
    from xlgen.config import load_config
    from xlgen.models.funnel.heads import mlm_loss
    from xlgen.train import loop

    over = {k: str(v) for k, v in TINY_FUNNEL.items()}
    config = load_config(f"{REPO}/configs/pretrain/funnel_tiny.py", {**over, "objective_options.max_predictions": "2"})
    k = data_pipelines.mlm_predictions_per_row(config.data)
    assert k is not None and 2 < k < int(config.data.seq_len)
    objective = registry.objective(config)
    model = objective.make_model(config, nnx.Rngs(0), False)
    model.eval()
    batch = {n: jax.numpy.asarray(v) for n, v in loop.make_pipeline(config, "valid").batch(0).items()}
    assert (np.asarray(batch["label_mask"]).sum(1) == k).all()
    graphdef, state = nnx.split(model)

    def compiled(fn):  # one compile each, read for values and FLOPs (eager op-by-op dispatch costs ~10x more)
        return jax.jit(lambda state, batch: fn(nnx.merge(graphdef, state), batch)).lower(state, batch).compile()

    at_rows = compiled(lambda m, b: objective.eval_loss(m, b, None, config)[:2])
    every = compiled(lambda m, b: mlm_loss(m, b)[0])
    total, count = at_rows(state, batch)
    full = every(state, batch)
    n = float(np.asarray(batch["label_mask"]).sum())
    assert float(count) == n  # not training's max_predictions=2
    np.testing.assert_allclose(float(total), float(full) * n, rtol=1e-5)
    rows, every = at_rows.cost_analysis()["flops"], every.cost_analysis()["flops"]
    assert rows < 0.9 * every, (rows, every)  # the last decoder layer and the softmax at k of 32 rows
