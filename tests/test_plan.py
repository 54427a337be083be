"""`xlgen plan`: the real train step compiled for TPU topologies on this CPU, and the report's numbers.

The TPU compiles run in ONE subprocess (module fixture) with a clean environment: the plan must not inherit this test
session's `jax_default_matmul_precision=highest`, and libtpu is loaded only there. Skipped without libtpu.
"""
import glob
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from xlgen import plan as plan_lib
from xlgen import topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1024 ** 3

# Tiny configs, widened so that matmuls dominate the step (at d_model=64, LayerNorm/softmax/Adam element-wise work is
# ~30% of XLA's FLOP count, which the analytic 6ND-style model deliberately leaves out).
WIDE = ["--config.model.d_model=256", "--config.model.d_inner=1024", "--config.model.d_head=64"]
CASES = {
    "txl_v3": ["--config=configs/pretrain/txl_tiny.py", "--topology=v3:2x2", *WIDE, "--config.model.d_embed=256",
               "--config.data.batch_size=16", "--config.data.tgt_len=64", "--config.model.mem_len=64"],
    "xlnet_v4": ["--config=configs/pretrain/xlnet_tiny.py", "--topology=v4:2x2x1", *WIDE,
                 "--config.data.batch_size=16", "--config.mesh.fsdp=2", "--config.mesh.rules=fsdp"],
    # does not fit: 2**14 rows x 4096 tokens of memory per layer on 8 v3 cores
    "txl_oom": ["--config=configs/pretrain/txl_tiny.py", "--topology=v3:2x2", "--config.data.batch_size=16384",
                "--config.data.tgt_len=512", "--config.model.mem_len=4096"],
}
if os.path.exists(os.path.join(ROOT, "configs/pretrain/funnel_tiny.py")):
    CASES["funnel_v3"] = ["--config=configs/pretrain/funnel_tiny.py", "--topology=v3:2x2", *WIDE,
                          "--config.data.batch_size=16"]

RUNNER = """
import json, sys
from xlgen import plan
cases, out = json.loads(sys.argv[1]), sys.argv[2]
for name, argv in cases.items():
    plan.main(argv + [f"--json={out}/{name}.json"])
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    if not topology.libtpu_available():
        pytest.skip("libtpu is not installed (pip install -e '.[tpu]'): cannot compile for TPU topologies")
    out = tmp_path_factory.mktemp("plans")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(CASES), str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return {name: json.load(open(out / f"{name}.json")) for name in CASES}


# ------------------------------------------------------------------------------------------------ compiled plans

@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c != "txl_oom"])
def test_tiny_configs_compile_and_fit(reports, case):
    r = reports[case]
    assert r["fits"] is True and r["suggestions"] == []
    dev = {"v3:2x2": 8, "v4:2x2x1": 4}[r["topology"]]     # v3: 2 cores per chip; v4: one megacore device per chip
    assert r["devices"] == dev and math.prod(r["mesh"].values()) == dev
    assert r["hbm_per_device"] == {"v3:2x2": 16 * GiB, "v4:2x2x1": 32 * GiB}[r["topology"]]
    mem, state = r["memory_per_device"], r["state_bytes_per_device"]
    # the executable holds at least the parameters (+ Adam moments) of each device's shard, float32
    assert mem["total"] > state["params"] > 0
    assert mem["arguments"] >= state["total"]
    assert state["opt_state"] >= 2 * state["params"] * 0.99
    # the donated train state is aliased to the new state, not held twice
    assert mem["aliased"] >= state["total"] - state.get("mems", 0) - 1024
    shards = r["mesh"]["fsdp"] if r["mesh_rules"] != "dp" else 1
    assert state["params"] * shards >= 4 * r["num_params"] * 0.9


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c != "txl_oom"])
def test_flops_match_analytic_model(reports, case):
    fl = reports[case]["flops_per_step"]
    assert not fl["xla_counts_loop_bodies_once"]
    assert fl["xla_cost_analysis"] == pytest.approx(fl["analytic_model"], rel=0.10)
    assert fl["matmul_jaxpr"] == pytest.approx(fl["analytic_model"], rel=0.15)
    r = reports[case]
    assert 0 < r["mfu"] <= 1 and r["step_time_s"] >= fl["analytic_model"] / r["devices"] / r[
        "peak_bf16_flops_per_device"] * (1 - 1e-6) * 0.9


@pytest.mark.slow
def test_oversized_step_does_not_fit_and_gets_suggestions(reports):
    r = reports["txl_oom"]
    assert r["fits"] is False and r["over_by_bytes"] > 0
    assert r["memory_per_device"]["total"] > r["memory_per_device"]["hbm_usable"]
    text = "\n".join(r["suggestions"])
    assert "grad_accum_steps" in text and "model.remat=True" in text and "mem_len" in text


# ------------------------------------------------------------------------------------------------ pieces (no TPU)

def test_parse_topology():
    t = topology.parse_topology("v3:16x32")
    assert (t.chip.generation, t.chip_dims, t.num_chips) == ("v3", (16, 32), 512)
    assert topology.parse_topology("v5litepod:4x4", num_slices=2).num_chips == 32
    for bad, msg in [("v3-32", "expected"), ("v9:2x2", "unknown TPU generation"), ("v3:", "expected")]:
        with pytest.raises(ValueError, match=msg):
            topology.parse_topology(bad)


def test_parse_oom_message():
    msg = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (16.02G) "
           "exceeds available HBM (15.48G).")
    assert plan_lib.parse_oom(msg) == {"required": int(16.02 * GiB), "available": int(15.48 * GiB)}
    assert plan_lib.parse_oom("INTERNAL: something else") is None


def test_jaxpr_matmul_flops_counts_scan_iterations():
    def layer(x, w):
        return jnp.tanh(x @ w), None

    def scanned(ws, x):
        return jax.lax.scan(layer, x, ws)[0].sum()

    def unrolled(ws, x):
        for i in range(ws.shape[0]):
            x = layer(x, ws[i])[0]
        return x.sum()

    ws, x = jnp.zeros((5, 32, 32)), jnp.zeros((8, 32))
    fwd = 5 * 2 * 8 * 32 * 32
    for f in (scanned, unrolled):
        flops, _ = plan_lib.jaxpr_matmul_flops(jax.make_jaxpr(f)(ws, x).jaxpr)
        assert flops == fwd
        flops, _ = plan_lib.jaxpr_matmul_flops(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(ws, x).jaxpr)
        assert flops == 3 * fwd  # forward + grad w.r.t. weights + grad w.r.t. activations


def test_pod_table_in_docs_is_generated_from_saved_plans():
    """docs/pod_scale.md's table is exactly `xlgen plan --table docs/pod_plans/*.json` (not typed by hand)."""
    paths = sorted(glob.glob(os.path.join(ROOT, "docs", "pod_plans", "*.json")))
    if not paths:
        pytest.skip("no saved plans in docs/pod_plans")
    reports = [json.load(open(p)) for p in paths]
    table = plan_lib.render_table(sorted(reports, key=plan_lib.table_order))
    doc = open(os.path.join(ROOT, "docs", "pod_scale.md")).read()
    assert table in doc
