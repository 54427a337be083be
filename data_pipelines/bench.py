"""Input-pipeline benchmark: XLNet examples/s per process (one core).

  python -m data_pipelines.bench [--seq_len 512 --reuse_len 256 --num_predict 85 --batch_size 32 --steps 20]
  python -m data_pipelines.bench --checksums     the same corpus memory-mapped from .npy shards, read plain and
                                                 through `corpus.ChecksummedShard` (per-block CRC32 checks)

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
    ap.add_argument(
        "--checksums",
        action="store_true",
        help="compare batches/s reading memory-mapped shards plainly and through ChecksummedShard",
    )
    args = ap.parse_args(argv)
    if args.checksums:
        return checksum_cost(args)

    c = synthetic_corpus(4_000_000)
    return _measure(c, args, "XLNet examples/s per process")


def _pipeline(c, args):
    from data_pipelines.xlnet import XLNetPipeline

    return XLNetPipeline(
        c,
        global_batch_size=args.batch_size,
        seq_len=args.seq_len,
        reuse_len=args.reuse_len,
        perm_size=args.perm_size,
        num_predict=args.num_predict,
        bi_data=not args.uni,
        span_unit=args.span_unit,
    )


def checksum_cost(args):
    """Batches/s of the XLNet pipeline on the synthetic corpus saved as .npy shards (tokens uint16, sentence parity
    bool) and memory-mapped: read plainly, and through `ChecksummedShard` (what training reads). The first pass over
    the checked shards includes the CRC32 of every block it touches (each block once per process: a one-time cost
    of corpus bytes / CRC32 throughput, printed too); the timed passes after it measure the per-read overhead."""
    import tempfile
    import zlib

    from data_pipelines import corpus as corpus_lib

    base = synthetic_corpus(16_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for name, arr in (("tokens", base.shards[0].astype(np.uint16)), ("sentences", base.sent[0])):
            path = os.path.join(tmp, f"{name}.npy")
            np.save(path, arr)
            files.append(path)
        mapped = [np.load(f, mmap_mode="r") for f in files]
        crcs = [corpus_lib.shard_block_crcs(np.asarray(m).view(np.uint8)) for m in mapped]
        plain = corpus_lib.TokenCorpus([mapped[0]], [mapped[1]], base.tokenizer, "plain")
        t0 = time.perf_counter()
        checked = corpus_lib.TokenCorpus(
            [corpus_lib.ChecksummedShard(mapped[0], files[0], crcs[0])],
            [corpus_lib.ChecksummedShard(mapped[1], files[1], crcs[1])],
            base.tokenizer,
            "checked",
        )
        p = _pipeline(checked, args)
        p.batch(0)
        first = time.perf_counter() - t0
        nbytes = sum(m.nbytes for m in mapped)
        raw = np.concatenate([np.asarray(m).view(np.uint8) for m in mapped])
        t0 = time.perf_counter()
        zlib.crc32(raw)
        crc_gbs = nbytes / (time.perf_counter() - t0) / 1e9
        fraction = np.mean([s.checked.mean() for s in checked.shards + checked.sent])
        print(
            f"corpus {nbytes / 1e6:.0f} MB in {sum(len(c) for c in crcs)} blocks of "
            f"{corpus_lib.SHARD_BLOCK_BYTES >> 20} MiB; CRC32 {crc_gbs:.1f} GB/s (one-time check: "
            f"{1 / crc_gbs:.2f} s per GB read); first batch with checks {first:.2f}s ({fraction:.0%} of blocks checked)"
        )
        rates = {}
        for name, c in (("plain mmap", plain), ("checksummed", checked), ("plain mmap again", plain)):
            rates[name] = _measure(c, args, f"{name}: XLNet examples/s")
    b = args.batch_size
    print(
        f"batches/s: plain {rates['plain mmap'] / b:.2f} / {rates['plain mmap again'] / b:.2f}, checksummed "
        f"{rates['checksummed'] / b:.2f} ({rates['checksummed'] / max(rates['plain mmap'], rates['plain mmap again']) - 1:+.1%})"
    )
    return rates


def _measure(c, args, label):
    p = _pipeline(c, args)
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
        f"{label}: {n / dt:.0f}  (seq_len {args.seq_len}, reuse_len {args.reuse_len}, "
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
