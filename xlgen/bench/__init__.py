"""`xlgen bench`: measured speed through the user paths, optionally against Hugging Face PyTorch, each side in a
process of its own (the command and its method: `xlgen.bench.cli`).

Modules: `measure` (load, threads, matmul peak, compile events), `xlgen_side` (xlgen's train loop, cached
evaluation, sampling), `hf` (the same work in transformers, built by the family's `HFBench` hooks), `worker` (a side
in a process of its own), `compare` (the sides alternated A B A B in steady-state blocks), `render` (the table of
docs/performance.md), `standard` (the standard set, `make bench`), `cli` (the command).
"""


def main(argv=None) -> int:
    from xlgen.bench.cli import main as cli_main

    return cli_main(argv)
