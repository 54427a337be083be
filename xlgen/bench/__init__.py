"""`xlgen bench`: measured speed through the user paths, optionally against Hugging Face PyTorch, each side in a
process of its own.

    xlgen bench --config=PATH [--config.KEY=VALUE ...] [--steps=N] [--blocks=K] [--compare-hf] [--json=FILE]
    xlgen bench --config=PATH --eval --mem_lens=128,256,512 [--segment=64] [--compare-hf]    (Transformer-XL)
    xlgen bench --config=PATH --generate [--new_tokens=128 --gen_batch=1 --gen_mem_len=128] [--compare-hf]  (TXL sampling)
    xlgen bench --standard [--into=docs/performance.md] [--before=DIR]    the standard set (`make bench`)

Modules: `measure` (load, threads, matmul peak, compile events), `xlgen_side` (xlgen's train loop, cached
evaluation, sampling), `hf` (the same work in transformers, built by the family's `HFBench` hooks), `worker` (a side
in a process of its own), `compare` (the sides alternated A B A B in steady-state blocks), `render` (the table of
docs/performance.md), `standard` (the standard set), `cli` (this command).

Train (default): `xlgen train`'s program and loop (`xlgen.train.loop.run`, the real data pipeline) run in blocks
of `--steps` steps on a temporary workdir, each block resuming the previous one; the loop's `metrics.jsonl`
`tokens_per_sec` is the block's figure (a block's first step, which absorbs the restore, is not counted; HF's side
likewise). With `--compare-hf` the same work runs in transformers 4.34.1 (same dims, batch, the same batches from
the same pipeline, AdamW + clipping, train mode) in another process, its blocks alternating with xlgen's. The
warm-up (compilation and the first block, PyTorch's thread choice, then `--warmup` alternated rounds) is reported
and not counted; medians over `--blocks` measured blocks are the result. Compilation is taken from JAX's compile
events with the persistent compilation cache off. Model FLOP/s use the analytic count (`xlgen.flops`); MFU is
against the f32 matmul peak of JAX measured in xlgen's process at its start and end. `--steps=0` measures
compilation only (AOT `lower().compile()`, e.g. the 24-layer scanned XLNet-Large step). `--same-process` runs both
sides in this process (the older method; labelled `hf_mode: same_process` in the JSON, never written into docs).

Eval (`--eval`, families whose `HFBench` has a memory LM: Transformer-XL): a random-weight HF directory is loaded by
`xlgen.from_pretrained(dir, mem_len=M)` and by transformers, and both evaluate the same token stream in segments of
`--segment` tokens with memory M = l - segment for each total context l in `--mem_lens` (HF semantics: zero memory
of length M from the first segment, so shapes are fixed); ms/token and tokens/s, alternating blocks of
`--segments_per_block` segments each.
"""


def main(argv=None) -> int:
    from xlgen.bench.cli import main as cli_main

    return cli_main(argv)
