"""The standard set (`make bench`): the workloads of docs/performance.md's table, each run as its own `xlgen bench`
command with HF in a process of its own, and the table regenerated from their JSON."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

from xlgen import platforms
from xlgen.bench import render

_XLNET = "configs/pretrain/xlnet_tiny.py"
_XLNET_6L = [
    "--config.model.d_model=512",
    "--config.model.n_layer=6",
    "--config.model.n_head=8",
    "--config.model.d_head=64",
    "--config.model.d_inner=2048",
    "--config.model.mem_len=128",
    "--config.model.reuse_len=128",
    "--config.data.batch_size=8",
    "--config.data.seq_len=256",
    "--config.data.reuse_len=128",
    "--config.data.perm_size=128",
    "--config.data.num_predict=43",
]
_FUNNEL = "configs/pretrain/funnel_tiny.py"
_FUNNEL_512 = [
    "--config.model.d_model=256",
    "--config.model.n_head=4",
    "--config.model.d_head=64",
    "--config.model.d_inner=1024",
    "--config.data.batch_size=4",
    "--config.data.seq_len=512",
]
# 5 blocks of 4 steps (3 measured) per side: with 3 blocks of 2 measured steps one slow block
# of either side moves a run's median ratio by up to 0.3
_FUNNEL_BLOCKS = ["--compare-hf", "--steps=4", "--blocks=5"]
_TXL = "configs/pretrain/txl_tiny.py"
_TXL_4L = [
    "--config.model.d_model=256",
    "--config.model.d_embed=256",
    "--config.model.n_head=4",
    "--config.model.d_head=64",
    "--config.model.d_inner=1024",
    "--config.model.n_layer=4",
]

STANDARD = [
    # (key, title, argv)
    (
        "xlnet_train",
        "XLNet 6L d512 8h, batch 8, seq 256, mem 128, 43 targets, AdamW, train (tokens/s)",
        ["--config=" + _XLNET, *_XLNET_6L, "--compare-hf", "--steps=4", "--blocks=3"],
    ),
    (
        "txl_eval",
        "Transformer-XL 4L d256 cached eval, segments of 64, memory l-64, batch 1 (ms/token)",
        ["--config=" + _TXL, *_TXL_4L, "--eval", "--mem_lens=128,256,512", "--compare-hf", "--blocks=15"],
    ),
    (
        "funnel_12l",
        "Funnel MLM d256 4h, batch 4, seq 512, 12 unpooled layers (block_sizes (12,)), train step (s)",
        ["--config=" + _FUNNEL, *_FUNNEL_512, "--config.model.block_sizes=(12,)", *_FUNNEL_BLOCKS],
    ),
    (
        "funnel_b444",
        "Funnel MLM B4-4-4, same (s)",
        ["--config=" + _FUNNEL, *_FUNNEL_512, "--config.model.block_sizes=(4,4,4)", *_FUNNEL_BLOCKS],
    ),
    (
        "xlnet_large_compile",
        "24-layer scanned XLNet-Large train step (remat, batch 8, seq 512, one CPU device), compile time (s)",
        [
            "--config=configs/pretrain/xlnet_large.py",
            "--config.model.scan_layers=True",
            "--config.mesh.fsdp=1",
            "--config.data.batch_size=8",
            "--config.model.scores_dtype=float32",  # the program this workload has always timed
            "--config.model.softmax_dtype=float32",
            "--config.model.remat=full",
            "--steps=0",
        ],
    ),
]

KEYS = [key for key, _, _ in STANDARD]


def run_standard(
    out_dir: str, into: Optional[str], before: Optional[str], only: Optional[List[str]] = None, label=None
) -> int:
    """Each workload of STANDARD as its own `xlgen bench` command (JSON into out_dir), then the table (into the
    markdown file `into`, with `before`'s results as the before column)."""
    os.makedirs(out_dir, exist_ok=True)
    for key, title, argv in STANDARD:
        if only and key not in only:
            continue
        print(f"\n=== {key}: {title}", flush=True)
        cmd = [sys.executable, "-m", "xlgen.bench", *argv, f"--json={os.path.join(out_dir, key + '.json')}"]
        rc = subprocess.call(cmd, env=platforms.host_malloc_environment())  # None: this environment as it is
        if rc != 0:
            print(f"[bench] {key} failed (exit {rc})", file=sys.stderr)
    after = render.load_dir(out_dir, KEYS)
    prev = render.load_dir(before, KEYS) if before else None
    print("\n" + render.render_table(after, prev))
    if into:
        render.write_into(into, after, prev, label or f"results in {before}")
        print(f"\nwrote {into}")
    return 0
