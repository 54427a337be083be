"""`xlgen bench`: the generated before/after table and its in-place update of docs/performance.md, HF's side in a
process of its own, and the host-malloc policy the command runs with."""

import json
import os
import subprocess
import sys

import pytest

from xlgen.bench import cli, compare, render

AFTER = {
    "xlnet_train": {
        "hf_mode": "own_process",
        "xlgen_tokens_per_sec": 1500.0,
        "hf_tokens_per_sec": 700.0,
        "ratio_xlgen_over_hf": 1500.0 / 700.0,
        "mfu_vs_measured_matmul_peak": 0.61,
        "load_before": [3.0],
        "load_after": [3.5],
        "matmul_peak_flops_per_sec": 2e11,
    },
    "txl_eval": {
        "hf_mode": "own_process",
        "per_len": {"128": {"xlgen_ms_per_token": 0.05, "hf_ms_per_token": 0.1, "ratio_xlgen_over_hf": 2.0}},
    },
    "funnel_12l": {"hf_mode": "own_process", "xlgen_step_s": 1.0, "hf_step_s": 1.7, "ratio_xlgen_over_hf": 1.7},
    "funnel_b444": {"hf_mode": "own_process", "xlgen_step_s": 0.5, "hf_step_s": 1.1, "ratio_xlgen_over_hf": 2.2},
    "xlnet_large_compile": {"compile_s": 42.0},
}


def test_table_rows_and_in_place_update(tmp_path):
    rows = {r[0]: r for r in render._rows(AFTER)}
    assert rows["XLNet 6L d512 8h, b8 s256 m128, 43 targets, train"][1:] == ["1500 tok/s", "700 tok/s", "2.14×"]
    assert rows["same, model FLOP/s ÷ measured f32 matmul peak (MFU)"][1] == "61%"
    assert rows["Funnel B4-4-4 ÷ 12-layer step time (paper 0.55×)"][1:3] == ["0.50×", "0.65×"]
    assert rows["XLNet-Large 24L scanned train step compile"][1] == "42 s"
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nintro\n\n{render.BEGIN}\nold table\n{render.END}\n\n## Profiles\nkept\n")
    before = {"xlnet_train": {**AFTER["xlnet_train"], "xlgen_tokens_per_sec": 800.0, "ratio_xlgen_over_hf": 1.14}}
    render.write_into(str(doc), AFTER, before, "commit 19f3fa0")
    text = doc.read_text()
    assert (
        "old table" not in text and text.startswith("# Performance\n\nintro") and text.endswith("## Profiles\nkept\n")
    )
    assert "| workload | before: xlgen | before: HF | before: ratio | after: xlgen | after: HF | after: ratio |" in text
    assert "| 800 tok/s | 700 tok/s | 1.14× | 1500 tok/s | 700 tok/s | 2.14× |" in text
    assert "Before: commit 19f3fa0" in text
    assert "xlnet_train: HF in a process of its own" in text


def test_same_process_results_are_labelled_and_never_written(tmp_path):
    """HF measured inside the bench's process is labelled in every HF cell and refused by the docs writer."""
    same = {**AFTER, "funnel_12l": {**AFTER["funnel_12l"], "hf_mode": "same_process"}}
    rows = {r[0]: r for r in render._rows(same)}
    assert rows["Funnel MLM d256, b4 s512, 12 layers, train step"][1:] == [
        "1.00 s",
        "1.70 s (same process)",
        "1.70× (same process)",
    ]
    assert rows["Funnel MLM B4-4-4, same"][2] == "1.10 s"
    doc = tmp_path / "performance.md"
    doc.write_text(f"{render.BEGIN}\nold table\n{render.END}\n")
    with pytest.raises(ValueError, match="funnel_12l: measured with HF in the bench's own process"):
        render.write_into(str(doc), same, None, "")
    assert "old table" in doc.read_text()


def test_hf_side_runs_in_a_process_of_its_own(tmp_path):
    """`xlgen bench --compare-hf` on a tiny Funnel: xlgen's loop and HF's model run in two child processes (neither
    is the bench's), alternating; every measured block records both pids, thread counts, load and matmul peak; HF's
    process never starts a JAX backend (a handful of threads, against XLA's pool in xlgen's) and runs without
    xlgen's malloc tunables; a block's figure is its measured steps' tokens over their time."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    rc = cli.main(
        [
            "--config=configs/pretrain/funnel_tiny.py",
            "--config.model.block_sizes=(1,1)",
            "--config.model.num_decoder_layers=1",
            "--config.data.batch_size=2",
            "--config.data.seq_len=32",
            "--config.mesh.num_devices=1",  # the tests' 8 host devices: one, as a CPU user runs it
            "--compare-hf",
            "--steps=2",
            "--blocks=2",
            f"--json={out}",
        ]
    )
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["hf_mode"] == "own_process" and r["family"] == "funnel" and r["tokens_per_step"] == 64
    pids = {r["pids"]["xlgen"], r["pids"]["hf"], r["bench_pid"]}
    assert len(pids) == 3 and r["bench_pid"] == os.getpid()
    assert len(r["blocks"]) == 2 and len(r["warmup"]["rounds"]) == 1
    for rnd in [*r["warmup"]["rounds"], *r["blocks"]]:
        assert rnd["xlgen"]["pid"] == r["pids"]["xlgen"] and rnd["hf"]["pid"] == r["pids"]["hf"]
        for side in ("xlgen", "hf"):
            assert rnd[side]["tokens_per_sec"] > 0 and rnd[side]["matmul_peak_flops_per_sec"] > 0
            assert len(rnd[side]["load"]) == 3 and rnd[side]["os_threads"] >= 1
        assert rnd["hf"]["os_threads"] < rnd["xlgen"]["os_threads"]
    assert r["xlgen_blocks_tokens_per_sec"] == [b["xlgen"]["tokens_per_sec"] for b in r["blocks"]]
    assert r["ratio_blocks"] == [b["xlgen"]["tokens_per_sec"] / b["hf"]["tokens_per_sec"] for b in r["blocks"]]
    assert r["compile_s"] > 0 and r["warmup"]["sides"]["xlgen"]["compile_s"] == r["compile_s"]
    assert r["sides"]["hf"]["transformers"] == "4.34.1"
    assert "glibc.malloc" not in r["sides"]["hf"]["glibc_tunables"]


def test_hf_environment_drops_only_xlgens_malloc_tunables(monkeypatch):
    """HF's process starts with glibc's malloc defaults, as a user runs PyTorch: xlgen's tunables are taken out of
    GLIBC_TUNABLES, other tunables and a user's own malloc policy stay; xlgen's process gets the policy."""
    from xlgen import platforms

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=0:" + platforms.MALLOC_TUNABLES)
    assert compare.side_environment("hf")["GLIBC_TUNABLES"] == "glibc.cpu.x86_shstk=0"
    monkeypatch.setenv("GLIBC_TUNABLES", platforms.MALLOC_TUNABLES)
    assert "GLIBC_TUNABLES" not in compare.side_environment("hf")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert compare.side_environment("hf")["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.delenv("XLGEN_HOST_MALLOC", raising=False)
    if sys.platform.startswith("linux"):
        assert compare.side_environment("xlgen")["GLIBC_TUNABLES"] == platforms.MALLOC_TUNABLES


_FAULTS_PER_CALL = """
import resource, sys
from xlgen import platforms
applied = platforms.keep_freed_host_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.einsum("bnid,bnjd->bnij", a, b))  # 32 MiB float32 output per call
a, b = jnp.ones((4, 4, 512, 8)), jnp.ones((4, 4, 1024, 8))  # contraction width: no bearing on the output
for _ in range(10):
    f(a, b).block_until_ready()
faults = []
for _ in range(21):
    m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(a, b).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - m0)
print(applied, sorted(faults)[10])  # median: an occasional call still grows the heap (fragmentation)
"""


def _python(code, env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.split()


def test_host_buffers_are_reused_across_calls():
    """Under xlgen's host-malloc policy (what every xlgen command runs with), a jitted call's 32 MiB output reuses
    the pages freed by the previous call instead of faulting its 8,192 pages in again (median over calls; glibc
    defaults: ~8,900 faults per call): applied in process (`keep_freed_host_memory`, from_pretrained) or as the start-up
    environment (`host_malloc_environment`, the xlgen command). XLGEN_HOST_MALLOC=default opts out."""
    from xlgen import platforms

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc malloc policy: Linux only")
    applied, faults = _python(_FAULTS_PER_CALL, {})
    assert applied == "True" and float(faults) < 8192 * 0.05, faults
    env = platforms.host_malloc_environment({})
    applied, faults = _python(_FAULTS_PER_CALL, {"GLIBC_TUNABLES": env["GLIBC_TUNABLES"]})
    assert applied == "False" and float(faults) < 8192 * 0.05, faults  # tunables already in place: no mallopt
    opt_out = "from xlgen import platforms; print(platforms.keep_freed_host_memory())"
    assert _python(opt_out, {"XLGEN_HOST_MALLOC": "default"}) == ["False"]


def test_command_reexecutes_itself_with_the_malloc_policy():
    """The xlgen command re-executes its own command line once with the policy in GLIBC_TUNABLES (glibc reads
    tunables at start-up only); other tunables are kept, a user's malloc policy or the opt-out is left alone."""
    from xlgen import platforms

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc malloc policy: Linux only")
    code = "import os; from xlgen import platforms; print(os.environ.get('GLIBC_TUNABLES', '-')); platforms.reexec_with_host_malloc()"
    assert _python(code, {}) == ["-", platforms.MALLOC_TUNABLES]
    assert _python(code, {"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=0"}) == [
        "glibc.cpu.x86_shstk=0",
        "glibc.cpu.x86_shstk=0:" + platforms.MALLOC_TUNABLES,
    ]
    assert _python(code, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == ["glibc.malloc.arena_max=2"]
    assert _python(code, {"XLGEN_HOST_MALLOC": "default"}) == ["-"]


def test_ab_summary_pairs_each_round_with_the_first_arm():
    from xlgen.bench import ab

    rounds = [
        {"before": {"tokens_per_sec": 100.0}, "after": {"tokens_per_sec": 120.0}},
        {"before": {"tokens_per_sec": 50.0}, "after": {"tokens_per_sec": 55.0}},  # a slow round: ratio 1.1
        {"before": {"tokens_per_sec": 80.0}, "after": None},  # a failed process: no pair
    ]
    s = ab.summarize(["before", "after"], rounds)
    assert s["before"]["speed_ratio_to_before"] == 1.0 and s["before"]["tokens_per_sec"] == 80.0
    assert s["after"]["ratios"] == pytest.approx([1.2, 1.1])
    assert s["after"]["speed_ratio_to_before"] == pytest.approx(1.15)
    assert s["after"]["range"] == [55.0, 120.0]
