"""Output layers through the real trainer: `xlgen train --config.model.output_layer=mos` trains (loss falls), resumes
bitwise exactly, evaluates (ppl/bpc), and `xlgen analyze rank` puts the MoS workdir above the softmax bound d+2
while a softmax workdir stays within it. Tiny d = 16 (bound 18 < the 74 characters). The commands run in-process
(`cli.main`, the same entry point as the executable): every run is a fresh trainer restoring from its workdir, and
the session's compilation cache serves them all."""

import json
import math
import os

from test_train_utils import compile_cache, train_cmd, train_losses  # noqa: F401

from xlgen import cli

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


def run_train(workdir, overrides, extra=()):
    """`xlgen train` on txl_tiny with `overrides` (tests/test_train_utils.py's TINY first), in-process."""
    assert cli.main(train_cmd(workdir, overrides=overrides, extra=extra)[3:]) == 0


def run_cli(args):
    assert cli.main(args) == 0


def test_mos_trains_resumes_exactly_and_breaks_the_softmax_rank_bound(tmp_path):
    over = dict(SMALL, **{"model.output_layer": "mos", "model.output.n_experts": 3, "model.output.expert_dropout": 0.1})
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run_train(full, over)
    run_train(part, over, extra=[f"--stop_at_step={K}"])
    run_train(part, over)
    a, b = train_losses(full), train_losses(part)
    assert sorted(a) == list(range(1, 2 * K + 1)) and a[2 * K] < a[1]
    assert [b[s] for s in range(K + 1, 2 * K + 1)] == [a[s] for s in range(K + 1, 2 * K + 1)]
    with open(os.path.join(full, "metrics.jsonl")) as f:
        ev = [json.loads(line) for line in f if '"split"' in line][
            -1
        ]  # the final evaluation: the last record with a split
    assert ev["step"] == 2 * K and abs(ev["bpc"] * math.log(2) - ev["loss"]) < 1e-9

    mos = _rank(full)
    assert mos["bound"] == 18 and mos["d"] == 16 and mos["rank"] > 18, mos["rank"]

    soft_dir = str(tmp_path / "softmax")
    run_train(soft_dir, dict(SMALL, **{"model.output_layer": "softmax", "total_steps": K}))
    # the CLI: rank JSON (contract keys rank, bound) + PNG; spectrum of both runs overlaid (singular_values, I1, I2)
    rank_json, spec_json, png = (str(tmp_path / n) for n in ("rank.json", "spectrum.json", "spectrum.png"))
    run_cli(["analyze", "rank", f"--workdir={soft_dir}", "--contexts=148", f"--json={rank_json}"])
    with open(rank_json) as f:
        soft = json.load(f)
    assert soft["bound"] == 18 and soft["rank"] <= 18, soft["rank"]
    run_cli(
        ["analyze", "spectrum", f"--workdir={soft_dir}", f"--workdir={full}", f"--json={spec_json}", f"--png={png}"]
    )
    with open(spec_json) as f:
        spec = json.load(f)
    for rep in spec.values():
        assert len(rep["singular_values"]) == 16 and 0 < rep["I1"] <= 1 and rep["I2"] >= 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_doc_with_a_frozen_param_group_trains_resumes_exactly_and_ranks(tmp_path):
    """DOC (`output_layer=doc`, 2 components from the top state, 1 from block 1, 1 from the embedding) through
    `xlgen train`, with `optimizer.param_groups` freezing the mixture prior and giving the lower-layer projections
    their own learning rate: the loss falls, resume is bitwise exact, the frozen prior is the initial one at every
    checkpoint, and `xlgen analyze rank` (one forward pass per segment) puts DOC above the softmax bound."""
    from xlgen.train.workdir_model import restore_params

    groups = (
        "({'pattern': r'softmax[.]experts[.]prior', 'frozen': True}, {'pattern': r'softmax[.]lower', 'lr_scale': 0.5})"
    )
    over = dict(
        SMALL,
        **{
            "model.output_layer": "doc",
            "model.output.doc_counts": "(2, 1, 1)",
            "model.output.expert_dropout": 0.1,
            "optimizer.param_groups": groups,
        },
    )
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run_train(full, over)
    run_train(part, over, extra=[f"--stop_at_step={K}"])
    run_train(part, over)
    a, b = train_losses(full), train_losses(part)
    assert a[2 * K] < a[1]
    assert [b[s] for s in range(K + 1, 2 * K + 1)] == [a[s] for s in range(K + 1, 2 * K + 1)]
    priors = [restore_params(full, s)[2]["softmax.experts.prior.kernel"] for s in (K, 2 * K)]
    import numpy as np

    np.testing.assert_array_equal(np.asarray(priors[0]), np.asarray(priors[1]))
    lower = [np.asarray(restore_params(full, s)[2]["softmax.lower.0.kernel"]) for s in (K, 2 * K)]
    assert np.abs(lower[1] - lower[0]).max() > 0
    doc = _rank(full)
    assert doc["output_layer"] == "doc" and doc["rank"] > doc["bound"] == 18, doc["rank"]
    from xlgen.analyze import kld

    k = kld.analyze(full, contexts=64)  # the same contexts' Q, one forward pass per segment
    assert k["contexts"] == 64 and k["expected_pairwise_kld"] > 0
