"""`xlgen bench` reporting: the generated before/after table and its in-place update of docs/performance.md."""

import os
import subprocess
import sys

import pytest

from xlgen import bench

AFTER = {
    "xlnet_train": {
        "xlgen_tokens_per_sec": 1500.0,
        "hf_tokens_per_sec": 700.0,
        "ratio_xlgen_over_hf": 1500.0 / 700.0,
        "mfu_vs_measured_matmul_peak": 0.61,
        "load_before": [3.0],
        "load_after": [3.5],
        "matmul_peak_flops_per_sec": 2e11,
    },
    "txl_eval": {"per_len": {"128": {"xlgen_ms_per_token": 0.05, "hf_ms_per_token": 0.1, "ratio_xlgen_over_hf": 2.0}}},
    "funnel_12l": {"xlgen_step_s": 1.0, "hf_step_s": 1.7, "ratio_xlgen_over_hf": 1.7},
    "funnel_b444": {"xlgen_step_s": 0.5, "hf_step_s": 1.1, "ratio_xlgen_over_hf": 2.2},
    "xlnet_large_compile": {"compile_s": 42.0},
}


def test_table_rows_and_in_place_update(tmp_path):
    rows = {r[0]: r for r in bench._rows(AFTER)}
    assert rows["XLNet 6L d512 8h, b8 s256 m128, 43 targets, train"][1:] == ["1500 tok/s", "700 tok/s", "2.14×"]
    assert rows["same, model FLOP/s ÷ measured f32 matmul peak (MFU)"][1] == "61%"
    assert rows["Funnel B4-4-4 ÷ 12-layer step time (paper 0.55×)"][1:3] == ["0.50×", "0.65×"]
    assert rows["XLNet-Large 24L scanned train step compile"][1] == "42 s"
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nintro\n\n{bench.BEGIN}\nold table\n{bench.END}\n\n## Profiles\nkept\n")
    before = {"xlnet_train": {**AFTER["xlnet_train"], "xlgen_tokens_per_sec": 800.0, "ratio_xlgen_over_hf": 1.14}}
    bench.write_into(str(doc), AFTER, before, "commit 19f3fa0")
    text = doc.read_text()
    assert (
        "old table" not in text and text.startswith("# Performance\n\nintro") and text.endswith("## Profiles\nkept\n")
    )
    assert "| workload | before: xlgen | before: HF | before: ratio | after: xlgen | after: HF | after: ratio |" in text
    assert "| 800 tok/s | 700 tok/s | 1.14× | 1500 tok/s | 700 tok/s | 2.14× |" in text
    assert "Before: commit 19f3fa0" in text


_FAULTS_PER_CALL = """
import resource, sys
from xlgen import platforms
applied = platforms.keep_freed_host_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.einsum("bnid,bnjd->bnij", a, b))  # 32 MiB float32 output per call
a, b = jnp.ones((4, 4, 512, 64)), jnp.ones((4, 4, 1024, 64))
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
    assert _python(_FAULTS_PER_CALL, {"XLGEN_HOST_MALLOC": "default"})[0] == "False"


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
