"""Latency of one deployed model in three runtimes, each in a process of its own (docs/deploy.md):

    python -m xlgen.deploy.bench --out=DIR                 # every runtime x batch size, one process each
    python -m xlgen.deploy.bench --runtime=R --batch=B --out=DIR   # one measurement (R: xlgen | onnxruntime | torch)

The model: an XLNet sequence classifier (6 layers, d_model 256, 4 heads, d_inner 1024, vocabulary 32,000,
2 labels), random weights from a fixed seed, inputs of length 128. xlgen runs the deployed function jitted
(`xlgen.deploy.Served.fn`), onnxruntime the `--to-onnx` graph (the same function translated), torch the same weights in transformers 4.34.1
(`torch.no_grad`). Figure: the median wall time of one call after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

MODEL = dict(vocab_size=32000, d_model=256, n_layer=6, n_head=4, d_head=64, d_inner=1024)
LENGTH = 128
RUNTIMES = ("xlgen", "onnxruntime", "torch")
BATCHES = (1, 32)


def served():
    """The benchmark's deployed function (the same weights in every process)."""
    from flax import nnx

    from xlgen import deploy
    from xlgen.config import load_config
    from xlgen.finetune.objective import FINETUNE
    from xlgen.models.params import materialize

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    overrides = ["task=glue/sst2", f"data.max_seq_length={LENGTH}", "data.eval_batch_size=1"]
    overrides += [f"model.{k}={v}" for k, v in MODEL.items()]
    config = load_config(os.path.join(repo, "configs/finetune/tiny.py"), [f"--config.{o}" for o in overrides])
    rng = np.random.default_rng(0)
    value = lambda name, shape: rng.normal(size=shape) * 0.02 + name.endswith("scale")
    module = materialize(nnx.eval_shape(lambda: FINETUNE.make_model(config, nnx.Rngs(0), False)), value)
    module.eval()
    return deploy.served_module(config, module, kind_of_run="finetune")


def timed(call, batch: int) -> float:
    for _ in range(3):
        call()
    n = 30 if batch == 1 else 8
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(runtime: str, batch: int, out_dir: str) -> float:
    s = served()
    arrays = s.example({"batch": batch, "length": LENGTH}, seed=1)
    if runtime == "xlgen":
        import jax

        fn = jax.jit(s.fn)
        return timed(lambda: jax.block_until_ready(fn(*arrays)), batch)
    if runtime == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(os.path.join(out_dir, "model.onnx"), providers=["CPUExecutionProvider"])
        feed = {spec.name: a for spec, a in zip(s.inputs, arrays)}
        return timed(lambda: session.run(None, feed), batch)
    import torch

    model = hf_model(s.module)
    names = [spec.name for spec in s.inputs]
    tensors = {
        n: torch.from_numpy(a.astype(np.int64 if n != "attention_mask" else np.float32)) for n, a in zip(names, arrays)
    }

    def call():
        with torch.no_grad():
            model(**tensors)

    return timed(call, batch)


def hf_model(module):
    """The transformers model equal to an xlgen module (`xlgen.interop.export.to_hf`), in eval mode."""
    import torch
    import transformers

    from xlgen import registry
    from xlgen.pretrained import Interop

    hf_config, state_dict = registry.family_of(module).record(Interop).to_hf(module)
    cfg_class = transformers.AutoConfig.for_model(hf_config["model_type"]).__class__
    cfg = cfg_class.from_dict({k: v for k, v in hf_config.items() if k != "model_type"})
    model = getattr(transformers, hf_config["architectures"][0])(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state_dict.items()}, strict=True)
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.deploy.bench")
    p.add_argument("--out", required=True, help="directory for model.onnx and results.json")
    p.add_argument("--runtime", choices=RUNTIMES)
    p.add_argument("--batch", type=int)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.runtime:
        seconds = measure(args.runtime, args.batch, args.out)
        print(json.dumps({"runtime": args.runtime, "batch": args.batch, "seconds": seconds}))
        return 0
    from xlgen.deploy import onnx_graph as deploy_onnx

    payload = deploy_onnx.export_onnx(served())[0]
    with open(os.path.join(args.out, "model.onnx"), "wb") as f:
        f.write(payload)
    results = []
    for batch in BATCHES:
        for runtime in RUNTIMES:
            cmd = [sys.executable, "-m", "xlgen.deploy.bench", f"--out={args.out}", f"--runtime={runtime}"]
            p = subprocess.run(cmd + [f"--batch={batch}"], capture_output=True, text=True, check=True)
            results.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"batch {batch:>2}  {runtime:<12} {results[-1]['seconds'] * 1e3:8.2f} ms", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
