"""The Hugging Face side of a benchmark (transformers 4.34.1, PyTorch): the same model and the same batches as
xlgen's side, built by the family's `HFBench` hooks (`xlgen/models/<family>/hf_bench.py`), driven block by block
(`xlgen.bench.compare`), normally in a process of its own that never starts a JAX backend.

Sides have the interface of `xlgen.bench.xlgen_side`."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, Optional

from xlgen.bench import measure
from xlgen.bench.xlgen_side import PROMPT_TOKENS, prompt, stream


def require_torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(f"xlgen bench --compare-hf needs torch + transformers (pip install 'xlgen[parity]'): {e}")
    return torch


_NEEDS = {"train_model": "training", "memory_lm": "--eval / --generate", "load_memory_lm": "--eval / --generate"}


@dataclasses.dataclass(frozen=True)
class HFBench:
    """The Hugging Face PyTorch counterpart that `xlgen bench --compare-hf` measures against a family's model, a
    record in `Family.records` (`xlgen.registry`; in the family's own `hf_bench.py`). The functions import
    torch/transformers when called (a family's record never needs them); every field is optional.

        train_model     config -> a randomly initialised HF model (transformers 4.34.1) doing the training work of
                        `config.objective` on the same dimensions: `model(**inputs)` returns `.loss` (and `.mems`);
                        ValueError when that objective has no HF counterpart
        train_inputs    (the objective pipeline's batch, config) -> {HF keyword: NumPy array} of one training step
        carries_mems    the step's `out.mems` (detached) are fed back as `mems=` to the next step
        memory_lm       (config, directory) -> path of a random-weight HF language model with a segment-level memory
                        written there, loadable by `xlgen.from_pretrained(path, mem_len=M)` (`--eval`,
                        `--generate`)
        load_memory_lm  (path, mem_len) -> that model in transformers, in eval mode, with memory length mem_len
    """

    train_model: Optional[Callable[[Any], Any]] = None
    train_inputs: Optional[Callable[[Dict[str, Any], Any], Dict[str, Any]]] = None
    carries_mems: bool = False
    memory_lm: Optional[Callable[[Any, str], str]] = None
    load_memory_lm: Optional[Callable[[str, int], Any]] = None


class Unsupported(ValueError):
    """What the bench was asked cannot be measured for this config (no counterpart, bad sizes)."""


def hooks(config, need: str):
    """The family's `HFBench` with field `need` set; `Unsupported` naming the families that have it otherwise."""
    from xlgen import registry

    hb = registry.get(config.model.family).record(HFBench)
    if hb is None or getattr(hb, need) is None:
        have = [n for n in registry.names() if getattr(registry.get(n).record(HFBench), need, None) is not None]
        raise Unsupported(
            f"model.family={config.model.family!r} has no Hugging Face counterpart for {_NEEDS[need]} in the bench "
            f"(families that have one: {have})"
        )
    return hb


def pick_torch_threads(run, candidates=None) -> int:
    """Set torch's intra-op threads to the faster of 1 and all cores for `run()` (a short timed call). On a loaded
    shared machine PyTorch's OpenMP pool with all cores can be many times slower than one thread; the reference
    gets its better setting, so ratios are not inflated by it."""
    import torch

    cands = candidates or sorted({1, os.cpu_count() or 1})
    best, best_t = cands[0], float("inf")
    for n in cands:
        torch.set_num_threads(n)
        run()  # warm
        t = time.perf_counter()
        run()
        dt = time.perf_counter() - t
        if dt < best_t:
            best, best_t = n, dt
    torch.set_num_threads(best)
    return best


class Side:
    """What every HF side shares: torch's versions and default threads (before any thread choice) and the malloc
    settings at the start; PyTorch's matmul peak; the peak again and the process's peak host memory at the end."""

    def start(self) -> Dict[str, Any]:
        import transformers

        torch = self.torch = require_torch()
        return {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads_default": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        }

    def matmul_peak(self, reps: int) -> float:
        return measure.torch_matmul_peak(reps=reps)

    def finish(self) -> Dict[str, Any]:
        return {
            "matmul_peak_flops_per_sec_end": measure.torch_matmul_peak(),
            "peak_host_memory_gib": round(measure.peak_host_memory_gib(), 2),
        }


class Train(Side):
    """The family's HF model doing the same training step: model(**inputs) -> loss.backward -> clip -> AdamW, in
    train mode, on the batches of the objective's own pipeline (memory carried where the family says so). A block
    is `steps` steps with the first not counted, as on xlgen's side."""

    def __init__(self, config, *, steps: int):
        self.config, self.steps = config, int(steps)
        self.hooks = hooks(config, "train_model")
        self.step = 0
        self.mems = None

    def start(self) -> Dict[str, Any]:
        from xlgen import registry
        from xlgen.train import loop

        info = super().start()
        torch = self.torch
        torch.manual_seed(0)
        self.model = self.hooks.train_model(self.config)
        self.model.train()
        o = self.config.optimizer
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=float(o.learning_rate),
            eps=float(o.get("eps", 1e-6)),
            weight_decay=float(o.get("weight_decay", 0.0)),
        )
        self.clip = float(o.get("clip_norm", 0.0) or 0.0)
        self.pipeline = loop.make_pipeline(self.config, "train", process=(0, 1))
        self.tokens_per_step = registry.objective(self.config).tokens_per_step(self.config)  # as xlgen counts them
        return info

    def one_step(self) -> float:
        t = self.torch
        arrays = self.hooks.train_inputs(self.pipeline.batch(self.step), self.config)
        inputs = {k: t.as_tensor(v) for k, v in arrays.items()}
        if self.hooks.carries_mems and self.mems is not None:
            inputs["mems"] = self.mems
        out = self.model(**inputs)
        out.loss.backward()
        if self.clip > 0:
            t.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.hooks.carries_mems:
            self.mems = [m.detach() for m in out.mems]
        self.step += 1
        return float(out.loss.detach())

    def _block(self, steps: int) -> float:
        self.one_step()
        t = time.perf_counter()
        for _ in range(steps - 1):
            self.one_step()
        return (steps - 1) * self.tokens_per_step / (time.perf_counter() - t)

    def warmup(self) -> Dict[str, Any]:
        """The first block at torch's default threads, then the thread choice (`pick_torch_threads`)."""
        t = time.perf_counter()
        tps = self._block(self.steps)
        first_s = time.perf_counter() - t
        threads = pick_torch_threads(lambda: self._block(2))
        return {"first_block_s": round(first_s, 2), "tokens_per_sec": tps, "torch_threads": threads}

    def block(self) -> Dict[str, Any]:
        return {"tokens_per_sec": self._block(self.steps), "torch_threads": self.torch.get_num_threads()}


class Eval(Side):
    """The family's memory LM in transformers evaluating the same token stream as `xlgen_side.Eval`, same segments
    and memory length (HF semantics: zero memory of full length from the first segment)."""

    def __init__(self, config, *, path: str, segment: int, segments: int):
        self.config, self.path, self.segment, self.segments = config, path, segment, segments
        self.hooks = hooks(config, "load_memory_lm")
        self.models = {}

    def _run(self, total: int) -> float:
        t = self.torch
        model = self.models[total]
        ids = t.as_tensor(stream(self.config, total, self.segment, self.segments))
        mems = None
        start = time.perf_counter()
        with t.no_grad():
            for i in range(self.segments):
                mems = model(input_ids=ids[:, i * self.segment : (i + 1) * self.segment], mems=mems).mems
        return (time.perf_counter() - start) / ids.numel()

    def warmup(self, total: int) -> Dict[str, Any]:
        t = time.perf_counter()
        self.models[total] = self.hooks.load_memory_lm(self.path, total - self.segment)
        load_s = time.perf_counter() - t
        return {"load_s": round(load_s, 2), "torch_threads": pick_torch_threads(lambda: self._run(total))}

    def block(self, total: int) -> Dict[str, Any]:
        return {"s_per_token": self._run(total), "torch_threads": self.torch.get_num_threads()}


class Generate(Side):
    """`model.generate` (sampling, top-k 40, the memory carried) of the family's memory LM, same prompt and sizes as
    `xlgen_side.Generate`."""

    def __init__(self, config, *, path: str, mem_len: int, new_tokens: int, batch: int):
        self.config, self.path, self.mem_len, self.new_tokens, self.batch = config, path, mem_len, new_tokens, batch
        self.hooks = hooks(config, "load_memory_lm")
        self.i = 0

    def _run(self) -> float:
        t = self.torch
        self.i += 1
        ids = t.as_tensor([prompt(self.config)] * self.batch).reshape(self.batch, PROMPT_TOKENS)
        t.manual_seed(self.i)
        start = time.perf_counter()
        with t.no_grad():
            self.model.generate(ids, max_new_tokens=self.new_tokens, do_sample=True, top_k=40, pad_token_id=0)
        return (time.perf_counter() - start) / (self.new_tokens * self.batch)

    def warmup(self) -> Dict[str, Any]:
        self.model = self.hooks.load_memory_lm(self.path, self.mem_len)
        return {"torch_threads": pick_torch_threads(self._run)}

    def block(self) -> Dict[str, Any]:
        return {"s_per_token": self._run(), "torch_threads": self.torch.get_num_threads()}
