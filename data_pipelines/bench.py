"""Input-pipeline benchmark: XLNet examples/s per process (one core).

  python -m data_pipelines.bench [--seq_len 512 --reuse_len 256 --num_predict 85 --batch_size 32 --steps 20]

Defaults are the XLNet-Large settings (seq_len 512, reuse_len 256, perm_size 256, num_predict 85, bi_data). The
corpus is synthetic (a SentencePiece-like stream of 32k ids with ~1.3 pieces per word and ~25-word sentences),
so the figure measures the pipeline, not disk or tokenization. Run it pinned to one core, e.g. `taskset -c 0`.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def synthetic_corpus(num_tokens: int, vocab_size: int = 32000, seed: int = 0):
    from data_pipelines import corpus as corpus_lib
    from data_pipelines.vocab import XLNET_SPECIALS

    class _Tok:  # a 32k vocabulary where ~75% of the pieces start a word, like XLNet's spiece.model
        kind = "synthetic"
        special_ids = {"unk": 0, "cls": 3, "sep": 4, "pad": 5, "mask": 6, "eod": 7, "eop": 8, "eos": None}

        def __init__(self):
            self.vocab_size = vocab_size
            self._start = np.random.default_rng(1).random(vocab_size) < 0.75
            self._start[: len(XLNET_SPECIALS)] = True

        def is_start_table(self):
            return self._start

    r = np.random.default_rng(seed)
    ids = r.integers(9, vocab_size, size=num_tokens).astype(np.int32)
    sent_len = r.integers(5, 60, size=num_tokens // 5)
    parity = np.repeat(np.arange(len(sent_len)) % 2 == 0, sent_len)[:num_tokens]
    return corpus_lib.TokenCorpus([ids], [parity], _Tok(), "synthetic")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--reuse_len", type=int, default=256)
    ap.add_argument("--perm_size", type=int, default=256)
    ap.add_argument("--num_predict", type=int, default=85)
    ap.add_argument("--batch_size", type=int, default=32, help="rows materialised by this process per step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="report the best of this many timed runs")
    ap.add_argument("--span_unit", default="word", choices=["word", "piece"])
    ap.add_argument("--uni", action="store_true", help="bi_data=False")
    args = ap.parse_args(argv)

    from data_pipelines.xlnet import XLNetPipeline

    c = synthetic_corpus(4_000_000)
    p = XLNetPipeline(
        c,
        global_batch_size=args.batch_size,
        seq_len=args.seq_len,
        reuse_len=args.reuse_len,
        perm_size=args.perm_size,
        num_predict=args.num_predict,
        bi_data=not args.uni,
        span_unit=args.span_unit,
    )
    p.batch(0)  # warm-up
    times, cpu = [], []
    for r in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for s in range(1 + r * args.steps, 1 + (r + 1) * args.steps):
            p.batch(s)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    dt = min(times)
    n = args.steps * args.batch_size
    print(
        f"XLNet examples/s per process: {n / dt:.0f}  (seq_len {args.seq_len}, reuse_len {args.reuse_len}, "
        f"perm_size {args.perm_size}, num_predict {args.num_predict}, bi_data {not args.uni}, "
        f"span_unit {args.span_unit}, {args.batch_size} rows/step, best of {args.repeats} x {args.steps} steps: "
        f"{dt:.2f}s; all runs {[round(n / t) for t in times]} ex/s)"
    )
    print(
        f"per CPU-second of this process (insensitive to other processes sharing the core): "
        f"{n / min(cpu):.0f} examples/s; 1-min load average {os.getloadavg()[0]:.1f}"
    )
    return n / dt


if __name__ == "__main__":
    main()
