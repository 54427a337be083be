"""The standard set's table: rows from `xlgen bench` JSON results, a before/after markdown table, and its
in-place update between the BEGIN/END markers of docs/performance.md."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional

from data_pipelines import paths
from xlgen.bench.compare import OWN_PROCESS, SAME_PROCESS


def _method(result: Dict[str, Any]) -> str:
    """How a result's HF side ran, for the note under the table ('' when it has no HF side)."""
    mode = result.get("hf_mode", "older bench")
    if mode == "older bench" and "hf_tokens_per_sec" not in result and "per_len" not in result:
        mode = None
    return {
        OWN_PROCESS: "HF in a process of its own, ",
        SAME_PROCESS: "HF in the bench's process, ",
        "older bench": "HF in the bench's process (older bench), ",
    }.get(mode, "")


def _fmt(x, f="{:.3g}"):
    return "—" if x is None else f.format(x)


def _hf(result: Dict[str, Any], cell: str) -> str:
    """An HF or ratio cell, labelled when HF ran inside the bench's own process."""
    return cell + " (same process)" if result.get("hf_mode") == SAME_PROCESS and cell != "—" else cell


def _rows(results: Dict[str, Any]) -> List[List[str]]:
    """Table rows (workload, xlgen, HF, ratio) from the standard set's JSON results."""
    rows = []
    x = results.get("xlnet_train")
    if x:
        rows.append(
            [
                "XLNet 6L d512 8h, b8 s256 m128, 43 targets, train",
                _fmt(x.get("xlgen_tokens_per_sec"), "{:.0f} tok/s"),
                _hf(x, _fmt(x.get("hf_tokens_per_sec"), "{:.0f} tok/s")),
                _hf(x, _fmt(x.get("ratio_xlgen_over_hf"), "{:.2f}×")),
            ]
        )
        rows.append(
            [
                "same, model FLOP/s ÷ measured f32 matmul peak (MFU)",
                _fmt(x.get("mfu_vs_measured_matmul_peak"), "{:.0%}"),
                "—",
                "—",
            ]
        )
    e = results.get("txl_eval")
    if e:
        per = e["per_len"]
        ls = sorted(per, key=int)
        rows.append(
            [
                "TXL 4L d256 cached eval, seg 64, mem l−64, l = " + " / ".join(ls) + " (ms/token)",
                " / ".join(_fmt(per[k].get("xlgen_ms_per_token"), "{:.3f}") for k in ls),
                _hf(e, " / ".join(_fmt(per[k].get("hf_ms_per_token"), "{:.3f}") for k in ls)),
                _hf(e, " / ".join(_fmt(per[k].get("ratio_xlgen_over_hf"), "{:.2f}×") for k in ls)),
            ]
        )
    f12, f444 = results.get("funnel_12l"), results.get("funnel_b444")
    for key, name in (
        ("funnel_12l", "Funnel MLM d256, b4 s512, 12 layers, train step"),
        ("funnel_b444", "Funnel MLM B4-4-4, same"),
    ):
        f = results.get(key)
        if f:
            rows.append(
                [
                    name,
                    _fmt(f.get("xlgen_step_s"), "{:.2f} s"),
                    _hf(f, _fmt(f.get("hf_step_s"), "{:.2f} s")),
                    _hf(f, _fmt(f.get("ratio_xlgen_over_hf"), "{:.2f}×")),
                ]
            )
    if f12 and f444 and f12.get("xlgen_step_s") and f444.get("xlgen_step_s"):
        hf_r = f444["hf_step_s"] / f12["hf_step_s"] if f12.get("hf_step_s") and f444.get("hf_step_s") else None
        rows.append(
            [
                "Funnel B4-4-4 ÷ 12-layer step time (paper 0.55×)",
                _fmt(f444["xlgen_step_s"] / f12["xlgen_step_s"], "{:.2f}×"),
                _fmt(hf_r, "{:.2f}×"),
                "—",
            ]
        )
    c = results.get("xlnet_large_compile")
    if c:
        rows.append(["XLNet-Large 24L scanned train step compile", _fmt(c.get("compile_s"), "{:.0f} s"), "—", "—"])
    return rows


def render_table(after: Dict[str, Any], before: Optional[Dict[str, Any]] = None) -> str:
    ra = _rows(after)
    rb = {r[0]: r for r in _rows(before)} if before else {}
    head = "| workload | xlgen | HF PyTorch | xlgen / HF |"
    if before:
        head = "| workload | before: xlgen | before: HF | before: ratio | after: xlgen | after: HF | after: ratio |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in ra:
        if before:
            b = rb.get(r[0], [r[0], "—", "—", "—"])
            lines.append("| " + " | ".join([r[0], *b[1:], *r[1:]]) + " |")
        else:
            lines.append("| " + " | ".join(r) + " |")
    return "\n".join(lines)


def load_dir(d: str, keys: Iterable[str]) -> Dict[str, Any]:
    """{key: result} of the `key.json` files of `d` (an `xlgen bench --standard` results directory)."""
    out = {}
    for key in keys:
        p = os.path.join(d, f"{key}.json")
        if os.path.exists(p):
            with open(p) as f:
                out[key] = json.load(f)
    return out


def _run_note(results: Dict[str, Any]) -> str:
    """Per workload: how HF ran, the load before and after, the measured peak."""
    parts = []
    for key, v in results.items():
        parts.append(
            f"{key}: {_method(v)}load {v.get('load_before')} → {v.get('load_after')}, "
            f"matmul peak {_fmt(v.get('matmul_peak_flops_per_sec', 0) / 1e9, '{:.0f}')} GFLOP/s"
        )
    return "; ".join(parts)


BEGIN, END = "<!-- xlgen bench: begin -->", "<!-- xlgen bench: end -->"


def write_into(path: str, after: Dict[str, Any], before: Optional[Dict[str, Any]], before_label: str) -> None:
    """Replace the table between BEGIN and END of the markdown file `path` (appended when absent) by the table of
    `after` (and `before`), with the per-workload method, load and peak below it. Results measured with both sides
    in one process are refused: the documented figures are own-process ones."""
    same = sorted(k for k, v in after.items() if v.get("hf_mode") == SAME_PROCESS)
    if same:
        raise ValueError(f"{', '.join(same)}: measured with HF in the bench's own process; not written into {path}")
    table = render_table(after, before)
    block = [BEGIN, "", table, ""]
    if before:
        block.append(f"Before: {before_label}. Per workload: {_run_note(before)}.")
        block.append("")
    block.append(f"After: this tree. Per workload: {_run_note(after)}.")
    block += ["", END]
    text = open(path).read() if os.path.exists(path) else "# Performance\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        _, post = rest.split(END, 1)
        text = pre + "\n".join(block) + post
    else:
        text = text.rstrip() + "\n\n" + "\n".join(block) + "\n"
    paths.atomic_write_text(path, text)
