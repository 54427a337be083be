"""Output layers through the real trainer: `xlgen train --config.model.output_layer=mos` trains (loss falls), resumes
bitwise exactly, evaluates (ppl/bpc), and `xlgen analyze rank` puts the MoS workdir above the softmax bound d+2
while a softmax workdir stays within it. Tiny d = 16 (bound 18 < the 74 characters)."""

import json
import math
import os

from test_train_utils import compile_cache, run_train, train_losses  # noqa: F401

K = 4
SMALL = {
    "total_steps": 2 * K,
    "checkpoint.every_steps": K,
    "mesh.num_devices": 1,
    "eval_every_steps": -1,
    "eval.steps": 2,
    "optimizer.warmup_steps": 2,
    "model.d_model": 16,
    "model.d_embed": 16,
    "model.n_head": 2,
    "model.d_head": 8,
    "model.d_inner": 32,
    "model.init_std": 0.3,  # logits far enough from uniform that MoS's nonlinearity shows in float32
}


def _rank(workdir):
    from xlgen.analyze.rank import analyze

    return analyze(workdir, contexts=148)


def test_mos_trains_resumes_exactly_and_breaks_the_softmax_rank_bound(tmp_path, compile_cache):
    over = dict(SMALL, **{"model.output_layer": "mos", "model.output.n_experts": 3})
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run_train(full, compile_cache, overrides=over)
    run_train(part, compile_cache, overrides=over, extra=[f"--stop_at_step={K}"])
    run_train(part, compile_cache, overrides=over)
    a, b = train_losses(full), train_losses(part)
    assert sorted(a) == list(range(1, 2 * K + 1)) and a[2 * K] < a[1]
    assert [b[s] for s in range(K + 1, 2 * K + 1)] == [a[s] for s in range(K + 1, 2 * K + 1)]
    with open(os.path.join(full, "metrics.jsonl")) as f:
        ev = [json.loads(line) for line in f if '"split"' in line][-1]
    assert ev["step"] == 2 * K and abs(ev["bpc"] * math.log(2) - ev["loss"]) < 1e-9

    mos = _rank(full)
    assert mos["bound"] == 18 and mos["d"] == 16 and mos["rank"] > 18, mos["rank"]

    soft_dir = str(tmp_path / "softmax")
    run_train(soft_dir, compile_cache, overrides=dict(SMALL, **{"model.output_layer": "softmax", "total_steps": K}))
    soft = _rank(soft_dir)
    assert soft["rank"] <= 18, soft["rank"]
