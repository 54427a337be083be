"""`xlgen bench` reporting: the generated before/after table and its in-place update of docs/performance.md."""

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
