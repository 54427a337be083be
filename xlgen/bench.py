"""`xlgen bench`: measured speed through the user paths, optionally against Hugging Face PyTorch in the same run.

    xlgen bench --config=PATH [--config.KEY=VALUE ...] [--steps=N] [--blocks=K] [--compare-hf] [--json=FILE]
    xlgen bench --config=PATH --eval --mem_lens=128,256,512 [--segment=64] [--compare-hf]    (Transformer-XL)
    xlgen bench --config=PATH --generate [--new_tokens=128 --gen_batch=1 --gen_mem_len=128] [--compare-hf]  (TXL sampling)
    xlgen bench --standard [--into=docs/performance.md] [--before=DIR]    the standard set (`make bench`)

Train (default): `xlgen train`'s own loop (`xlgen.train.loop.train`, the real data pipeline) runs in blocks of
`--steps` steps into a temporary workdir; each block resumes the previous one and the loop's `metrics.jsonl`
`tokens_per_sec` (the first step of a block, which absorbs the restore, is excluded by the loop) is the block's
figure. With `--compare-hf` a block of the same work in transformers 4.34.1 (same dims, batch, the same batches from
the same pipeline, AdamW + clipping, train mode) follows each xlgen block, so both sides see the same machine load;
medians over the blocks are reported. Compilation is measured separately (AOT `lower().compile()` of the train
step with the persistent compilation cache off). Model FLOP/s use the analytic count (`xlgen.flops`); MFU is against
the f32 matmul peak of JAX on this machine, measured in the same run. `--steps=0` measures compilation only (e.g.
the 24-layer scanned XLNet-Large step).

Eval (`--eval`, Transformer-XL): a random-weight `TransfoXLLMHeadModel` is written as a HF directory, loaded by both
`xlgen.from_pretrained(dir, mem_len=M)` and transformers, and both evaluate the same token stream in segments of
`--segment` tokens with memory M = l - segment for each total context l in `--mem_lens` (HF semantics: zero
memory of length M from the first segment, so shapes are fixed); ms/token and tokens/s, interleaved blocks of
`--segments_per_block` segments each (32: one block is ~0.3 s of xlgen work, long enough that a scheduling hiccup of
this shared machine does not decide the block).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from data_pipelines import paths
from xlgen import platforms

# ----------------------------------------------------------------------------------------------------------------
# Machine measurements
# ----------------------------------------------------------------------------------------------------------------


def load_average() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def peak_host_memory_gib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """Best f32 FLOP/s of a jitted [n,n]x[n,n] matmul chain on the default JAX device (what the model can hope for)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    k = 4

    @jax.jit
    def chain(a, b):
        for _ in range(k):
            a = (a @ b) * 0.03
        return a

    chain(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        chain(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return k * 2.0 * n**3 / best


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


class CompileEvents:
    """JAX's own compile-time events (jax.monitoring) while started: tracing and XLA backend compilation."""

    def __init__(self):
        import jax

        self.on, self.records = False, []
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **kw):
        if self.on:
            self.records.append((event, float(duration), kw.get("fun_name")))

    def start(self):
        self.on = True

    def stop(self):
        self.on = False

    def summary(self) -> Dict[str, Any]:
        comp = [d for e, d, _ in self.records if e.endswith("/backend_compile_duration")]
        trace = [d for e, d, _ in self.records if e.endswith("/jaxpr_trace_duration")]
        return {
            "compile_s": round(max(comp, default=0.0), 2),
            "compile_total_s": round(sum(comp), 2),
            "num_compiles": len(comp),
            "trace_s": round(sum(trace), 2),
        }


def _median(xs: List[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face counterparts (transformers 4.34.1, PyTorch)
# ----------------------------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(f"xlgen bench --compare-hf needs torch + transformers (pip install 'xlgen[parity]'): {e}")
    return torch


class HFTrain:
    """The same training work in HF PyTorch: model(**batch) -> loss.backward -> clip -> AdamW, in train mode."""

    def __init__(self, config):
        torch = _torch()
        import transformers as tr

        torch.manual_seed(0)
        self.torch, self.config = torch, config
        m, d = config.model, config.data
        fam = m.family
        if fam == "xlnet":
            hcfg = tr.XLNetConfig(
                vocab_size=int(m.vocab_size),
                d_model=int(m.d_model),
                n_layer=int(m.n_layer),
                n_head=int(m.n_head),
                d_inner=int(m.d_inner),
                ff_activation=m.ff_activation,
                untie_r=bool(m.untie_r),
                attn_type=m.attn_type,
                initializer_range=float(m.initializer_range),
                layer_norm_eps=float(m.layer_norm_eps),
                dropout=float(m.dropout),
                mem_len=int(m.mem_len or 0) or None,
                reuse_len=int(m.reuse_len) if m.get("reuse_len") else None,
                use_mems_train=True,
                bi_data=bool(m.bi_data),
                clamp_len=int(m.clamp_len),
                same_length=bool(m.same_length),
            )
            self.model = tr.XLNetLMHeadModel(hcfg)
        elif fam == "funnel":
            if config.objective != "funnel_mlm":
                raise SystemExit(f"--compare-hf: objective {config.objective!r} has no HF counterpart (funnel_mlm has)")
            hcfg = tr.FunnelConfig(
                vocab_size=int(m.vocab_size),
                block_sizes=list(m.block_sizes),
                block_repeats=list(m.get("block_repeats") or [1] * len(m.block_sizes)),
                num_decoder_layers=int(m.num_decoder_layers),
                d_model=int(m.d_model),
                n_head=int(m.n_head),
                d_head=int(m.d_head),
                d_inner=int(m.d_inner),
                hidden_act=m.hidden_act,
                hidden_dropout=float(m.dropout),
                attention_dropout=float(m.dropatt),
                activation_dropout=float(m.dropact),
                layer_norm_eps=float(m.layer_norm_eps),
                pooling_type=m.pooling_type,
                attention_type=m.attention_type,
                separate_cls=bool(m.separate_cls),
                truncate_seq=bool(m.truncate_seq),
                pool_q_only=bool(m.pool_q_only),
            )
            self.model = tr.FunnelForMaskedLM(hcfg)
        else:
            raise SystemExit(f"--compare-hf for training: family {fam!r} not supported (xlnet, funnel)")
        self.family = fam
        self.model.train()
        o = config.optimizer
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=float(o.learning_rate),
            eps=float(o.get("eps", 1e-6)),
            weight_decay=float(o.get("weight_decay", 0.0)),
        )
        self.clip = float(o.get("clip_norm", 0.0) or 0.0)
        self.mems = None
        from xlgen.train import loop

        self.pipe = loop.make_pipeline(config, "train")
        self.tokens_per_step = int(d.batch_size) * int(d.seq_len)
        self.step = 0

    def _inputs(self, s: int) -> Dict[str, Any]:
        t = self.torch
        b = self.pipe.batch(s)
        if self.family == "xlnet":
            return dict(
                input_ids=t.as_tensor(b["input_ids"], dtype=t.long),
                token_type_ids=t.as_tensor(b["token_type_ids"], dtype=t.long),
                perm_mask=t.as_tensor(b["perm_mask"], dtype=t.float32),
                target_mapping=t.as_tensor(b["target_mapping"], dtype=t.float32),
                labels=t.as_tensor(b["target_ids"], dtype=t.long),
            )
        labels = b["labels"].copy()
        labels[b["label_mask"] == 0] = -100
        return dict(
            input_ids=t.as_tensor(b["input_ids"], dtype=t.long),
            token_type_ids=t.as_tensor(b["token_type_ids"], dtype=t.long),
            attention_mask=t.as_tensor(b["attention_mask"], dtype=t.long),
            labels=t.as_tensor(labels, dtype=t.long),
        )

    def one_step(self):
        inputs = self._inputs(self.step)
        if self.family == "xlnet" and self.mems is not None:
            inputs["mems"] = self.mems
        out = self.model(**inputs)
        out.loss.backward()
        if self.clip > 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.family == "xlnet":
            self.mems = [m.detach() for m in out.mems]
        self.step += 1
        return float(out.loss)

    def block(self, steps: int) -> float:
        """tokens/s over `steps` steps (after the previous block; the batch is built inside, as xlgen's loop)."""
        t = time.perf_counter()
        for _ in range(steps):
            self.one_step()
        return steps * self.tokens_per_step / (time.perf_counter() - t)


# ----------------------------------------------------------------------------------------------------------------
# Train benchmark (xlgen train's loop)
# ----------------------------------------------------------------------------------------------------------------


def _bench_config(config, steps: int, blocks: int):
    c = config.copy_and_resolve_references()
    c.log_every_steps = max(steps, 1)
    c.eval_every_steps = 0
    c.checkpoint.every_steps = 0
    c.checkpoint.keep = 1
    c.checkpoint.async_save = False
    c.total_steps = max(steps, 1) * (blocks + 2)  # warm-up block, uncounted round, measured blocks
    if "tensorboard" in c:
        c.tensorboard = False
    return c


def _last_tokens_per_sec(workdir: str, step: int) -> Optional[float]:
    val = None
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step") == step and "tokens_per_sec" in r and "split" not in r:
                val = float(r["tokens_per_sec"])
    return val


def bench_train(config, *, steps: int, blocks: int, compare_hf: bool, peak: float) -> Dict[str, Any]:
    import jax

    from xlgen import sharding
    from xlgen.train import loop
    from xlgen.train.program import build_program

    c = _bench_config(config, steps, blocks)
    mesh = sharding.make_mesh(c.mesh)
    events = CompileEvents()
    t, cpu = time.perf_counter(), time.process_time()
    program = build_program(c, mesh)
    res: Dict[str, Any] = {
        "family": c.model.family,
        "objective": c.get("objective"),
        "tokens_per_step": program.tokens_per_step,
        "model_flops_per_step": program.analytic_flops_per_step,
        "devices": len(mesh.devices.flat),
    }
    if steps <= 0:  # compile only: AOT lower + compile of the train step
        with jax.set_mesh(mesh):
            lowered = program.train_step.lower(*program.abstract_args())
            res["trace_lower_s"] = round(time.perf_counter() - t, 2)
            t, cpu = time.perf_counter(), time.process_time()
            lowered.compile()
        res["compile_s"] = round(time.perf_counter() - t, 2)
        res["compile_cpu_s"] = round(time.process_time() - cpu, 2)
        print(f"[bench] trace+lower {res['trace_lower_s']:.1f} s, compile {res['compile_s']:.1f} s", flush=True)
        return res
    hf = HFTrain(c) if compare_hf else None
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="xlgen-bench-") as wd:
        t, cpu = time.perf_counter(), time.process_time()
        events.start()
        loop.train(c, wd, stop_at=steps)  # warm-up block: trace + compile of the real train step + first steps
        events.stop()
        res["first_block_s"] = round(time.perf_counter() - t, 2)
        res["first_block_cpu_s"] = round(time.process_time() - cpu, 2)
        res.update(events.summary())
        print(
            f"[bench] compile {res['compile_s']:.1f} s (largest program; all compiles {res['compile_total_s']:.1f} s, "
            f"tracing {res['trace_s']:.1f} s)",
            flush=True,
        )
        if hf is not None:
            res["hf_torch_threads"] = pick_torch_threads(lambda: hf.block(1))
        # One interleaved round, not counted: both sides' host heaps settle into their steady-state allocation
        # pattern (the first steps after start-up still grow it; see xlgen/platforms.py, "Host memory").
        loop.train(c, wd, stop_at=steps * 2)
        if hf is not None:
            hf.block(steps)
        for k in range(blocks):
            end = steps * (k + 3)
            loop.train(c, wd, stop_at=end)
            ours.append(_last_tokens_per_sec(wd, end))
            msg = f"[bench] block {k + 1}/{blocks}: xlgen {ours[-1]:.1f} tok/s"
            if hf is not None:
                theirs.append(hf.block(steps))
                msg += f", HF {theirs[-1]:.1f} tok/s, ratio {ours[-1] / theirs[-1]:.2f}"
            print(msg + f"  (load {load_average()[0]})", flush=True)
    tps = _median(ours)
    res["xlgen_tokens_per_sec"] = tps
    res["xlgen_blocks_tokens_per_sec"] = ours
    res["xlgen_steps_per_sec"] = tps / program.tokens_per_step if tps else None
    res["xlgen_step_s"] = program.tokens_per_step / tps if tps else None
    if tps and program.analytic_flops_per_step:
        flops = program.analytic_flops_per_step * tps / program.tokens_per_step
        res["model_flops_per_sec"] = flops
        res["mfu_vs_measured_matmul_peak"] = flops / (peak * res["devices"])
        res["matmul_bound_step_s"] = program.analytic_flops_per_step / (peak * res["devices"])
    if hf is not None:
        htps = _median(theirs)
        res["hf_tokens_per_sec"] = htps
        res["hf_blocks_tokens_per_sec"] = theirs
        res["hf_step_s"] = program.tokens_per_step / htps
        res["ratio_xlgen_over_hf"] = tps / htps
        res["ratio_blocks"] = [a / b for a, b in zip(ours, theirs)]
    return res


# ----------------------------------------------------------------------------------------------------------------
# Cached evaluation benchmark (Transformer-XL through from_pretrained)
# ----------------------------------------------------------------------------------------------------------------


def _hf_txl_dir(config, root: str) -> str:
    torch = _torch()
    import transformers as tr

    m = config.model
    torch.manual_seed(0)
    hcfg = tr.TransfoXLConfig(
        vocab_size=int(m.vocab_size),
        cutoffs=list(m.cutoffs),
        d_model=int(m.d_model),
        d_embed=int(m.d_embed),
        n_head=int(m.n_head),
        d_head=int(m.d_head),
        d_inner=int(m.d_inner),
        div_val=int(m.div_val),
        n_layer=int(m.n_layer),
        mem_len=int(m.mem_len),
        clamp_len=int(m.clamp_len) if int(m.clamp_len) > 0 else 1000,
        same_length=bool(m.same_length),
        untie_r=bool(m.untie_r),
        adaptive=True,
        dropout=0.0,
        dropatt=0.0,
        init_std=float(m.init_std),
        proj_init_std=float(m.proj_init_std),
        layer_norm_epsilon=float(m.layer_norm_epsilon),
        tie_word_embeddings=bool(m.tie_word_embeddings),
    )
    model = tr.TransfoXLLMHeadModel(hcfg)
    path = os.path.join(root, "hf_txl")
    model.save_pretrained(path, safe_serialization=True)
    return path


def bench_eval(
    config, *, mem_lens: List[int], segment: int, blocks: int, compare_hf: bool, segments_per_block: int = 32
) -> Dict[str, Any]:
    import jax
    import numpy as np

    import xlgen

    if config.model.family != "transformer_xl":
        raise SystemExit("xlgen bench --eval: cached evaluation is measured for Transformer-XL configs")
    torch = _torch() if compare_hf else None
    out: Dict[str, Any] = {
        "family": "transformer_xl",
        "segment": segment,
        "segments_per_block": segments_per_block,
        "per_len": {},
    }
    rng = np.random.default_rng(0)
    n_seg = segments_per_block
    with tempfile.TemporaryDirectory(prefix="xlgen-bench-") as root:
        path = _hf_txl_dir(config, root)
        if compare_hf:
            import transformers as tr

            hf = tr.TransfoXLLMHeadModel.from_pretrained(path).eval()
        for total in mem_lens:
            mem = int(total) - segment
            if mem < 0:
                raise SystemExit(f"--mem_lens: {total} is shorter than the segment ({segment})")
            t = time.perf_counter()
            ours_model = xlgen.from_pretrained(path, mem_len=mem)
            load_s = time.perf_counter() - t
            ids = rng.integers(0, int(config.model.vocab_size), size=(1, segment * n_seg)).astype(np.int64)
            segs = [ids[:, i * segment : (i + 1) * segment] for i in range(n_seg)]

            def run_ours():
                mems, last = None, None
                t = time.perf_counter()
                for s in segs:
                    o = ours_model(input_ids=s, mems=mems)
                    mems, last = o.mems, o.log_probs
                jax.block_until_ready(last)
                return (time.perf_counter() - t) / (segment * n_seg)

            def run_hf():
                if hf.transformer.mem_len != mem:
                    hf.reset_memory_length(mem)
                mems = None
                t = time.perf_counter()
                with torch.no_grad():
                    for s in segs:
                        o = hf(input_ids=torch.as_tensor(s), mems=mems)
                        mems = o.mems
                return (time.perf_counter() - t) / (segment * n_seg)

            t = time.perf_counter()
            run_ours()  # compiles
            first_s = time.perf_counter() - t
            if compare_hf:
                out["hf_torch_threads"] = pick_torch_threads(run_hf)
            a, b = [], []
            for _ in range(blocks):
                a.append(run_ours())
                if compare_hf:
                    b.append(run_hf())
            rec = {
                "mem_len": mem,
                "load_s": round(load_s, 2),
                "first_pass_s": round(first_s, 2),
                "xlgen_compiles": ours_model._forward._cache_size(),
                "xlgen_ms_per_token": 1e3 * _median(a),
                "xlgen_tokens_per_sec": 1.0 / _median(a),
            }
            if compare_hf:
                rec["hf_ms_per_token"] = 1e3 * _median(b)
                rec["hf_tokens_per_sec"] = 1.0 / _median(b)
                rec["ratio_xlgen_over_hf"] = _median(b) / _median(a)
                rec["ratio_blocks"] = [y / x for x, y in zip(a, b)]
            out["per_len"][str(total)] = rec
            print(
                f"[bench] l={total} (mem {mem}): xlgen {rec['xlgen_ms_per_token']:.3f} ms/token"
                + (
                    f", HF {rec['hf_ms_per_token']:.3f} ms/token, ratio {rec['ratio_xlgen_over_hf']:.2f}"
                    if compare_hf
                    else ""
                )
                + f"  (compiles {rec['xlgen_compiles']}, load {load_average()[0]})",
                flush=True,
            )
    return out


# ----------------------------------------------------------------------------------------------------------------
# Benchmark (`xlgen bench --generate`)
# ----------------------------------------------------------------------------------------------------------------


def bench_generate(
    config, *, mem_len: int, new_tokens: int, batch: int, blocks: int, compare_hf: bool
) -> Dict[str, Any]:
    """Sampling speed of a random-weight Transformer-XL of `config.model` (top-k 40, prompt 8 tokens): xlgen's
    incremental decoder vs HF `TransfoXLLMHeadModel.generate` (which also carries `mems`), in interleaved blocks,
    tokens/s over the whole generation (prompt included, xlgen's compile excluded)."""
    import numpy as np

    import xlgen
    from xlgen.export import unwrap
    from xlgen.generate import TXLDecoder

    if config.model.family != "transformer_xl":
        raise SystemExit("xlgen bench --generate: sampling is measured for Transformer-XL configs")
    prompt = list(np.random.default_rng(0).integers(0, int(config.model.vocab_size), 8))
    out: Dict[str, Any] = {"mem_len": mem_len, "new_tokens": new_tokens, "batch": batch}
    with tempfile.TemporaryDirectory(prefix="xlgen-bench-gen-") as root:
        path = _hf_txl_dir(config, root)
        dec = TXLDecoder(unwrap(xlgen.from_pretrained(path)), mem_len)
        kw = dict(max_new_tokens=new_tokens, num_samples=batch, top_k=40)
        first = dec.generate(prompt, seed=0, **kw)  # compiles
        out["xlgen_compile_s"] = round(first["prefill_s"] + first["compile_s"], 2)

        def run_ours(i):
            t = time.perf_counter()
            dec.generate(prompt, seed=i, **kw)
            return (time.perf_counter() - t) / (new_tokens * batch)

        if compare_hf:
            torch = _torch()
            import transformers as tr

            hf = tr.TransfoXLLMHeadModel.from_pretrained(path).eval()
            hf.reset_memory_length(mem_len)
            ids = torch.as_tensor(np.tile(np.asarray(prompt)[None], (batch, 1)))

            def run_hf(i=0):
                torch.manual_seed(i)
                t = time.perf_counter()
                with torch.no_grad():
                    hf.generate(ids, max_new_tokens=new_tokens, do_sample=True, top_k=40, pad_token_id=0)
                return (time.perf_counter() - t) / (new_tokens * batch)

            out["hf_torch_threads"] = pick_torch_threads(run_hf)
        a, b = [], []
        for i in range(blocks):
            a.append(run_ours(i + 1))
            if compare_hf:
                b.append(run_hf(i + 1))
        out["xlgen_tokens_per_sec"] = 1.0 / _median(a)
        out["xlgen_step_compiles"] = dec.step_compilations()
        if compare_hf:
            out["hf_tokens_per_sec"] = 1.0 / _median(b)
            out["ratio_xlgen_over_hf"] = _median(b) / _median(a)
    print(
        f"[bench] generate {batch} x {new_tokens} tokens, mem {mem_len}: xlgen {out['xlgen_tokens_per_sec']:.0f} tokens/s"
        + (
            f", HF {out['hf_tokens_per_sec']:.0f} tokens/s, ratio {out['ratio_xlgen_over_hf']:.2f}"
            if compare_hf
            else ""
        )
        + f"  (step compiles {out['xlgen_step_compiles']}, load {load_average()[0]})",
        flush=True,
    )
    return out


# ----------------------------------------------------------------------------------------------------------------
# The standard set (`make bench`) and docs/performance.md
# ----------------------------------------------------------------------------------------------------------------

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
# 5 blocks of 4 steps (3 measured) per side: with 3 blocks of 2 measured steps (until session 8) one slow block
# of either side moved a run's median ratio by up to 0.3
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
            "--steps=0",
        ],
    ),
]


def _fmt(x, f="{:.3g}"):
    return "—" if x is None else f.format(x)


def _rows(results: Dict[str, Any]) -> List[List[str]]:
    """Table rows (workload, xlgen, HF, ratio) from the standard set's JSON results."""
    rows = []
    x = results.get("xlnet_train")
    if x:
        rows.append(
            [
                "XLNet 6L d512 8h, b8 s256 m128, 43 targets, train",
                _fmt(x.get("xlgen_tokens_per_sec"), "{:.0f} tok/s"),
                _fmt(x.get("hf_tokens_per_sec"), "{:.0f} tok/s"),
                _fmt(x.get("ratio_xlgen_over_hf"), "{:.2f}×"),
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
                " / ".join(_fmt(per[k].get("hf_ms_per_token"), "{:.3f}") for k in ls),
                " / ".join(_fmt(per[k].get("ratio_xlgen_over_hf"), "{:.2f}×") for k in ls),
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
                    _fmt(f.get("hf_step_s"), "{:.2f} s"),
                    _fmt(f.get("ratio_xlgen_over_hf"), "{:.2f}×"),
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


def _load_dir(d: str) -> Dict[str, Any]:
    out = {}
    for key, _, _ in STANDARD:
        p = os.path.join(d, f"{key}.json")
        if os.path.exists(p):
            with open(p) as f:
                out[key] = json.load(f)
    return out


def _load_note(results: Dict[str, Any]) -> str:
    parts = []
    for key, v in results.items():
        parts.append(
            f"{key}: load {v.get('load_before')} → {v.get('load_after')}, "
            f"matmul peak {_fmt(v.get('matmul_peak_flops_per_sec', 0) / 1e9, '{:.0f}')} GFLOP/s"
        )
    return "; ".join(parts)


BEGIN, END = "<!-- xlgen bench: begin -->", "<!-- xlgen bench: end -->"


def write_into(path: str, after: Dict[str, Any], before: Optional[Dict[str, Any]], before_label: str) -> None:
    table = render_table(after, before)
    block = [BEGIN, "", table, ""]
    if before:
        block.append(f"Before: {before_label}. Load and measured peak per workload: {_load_note(before)}.")
        block.append("")
    block.append(f"After: this tree. Load and measured peak per workload: {_load_note(after)}.")
    block += ["", END]
    text = open(path).read() if os.path.exists(path) else "# Performance\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        _, post = rest.split(END, 1)
        text = pre + "\n".join(block) + post
    else:
        text = text.rstrip() + "\n\n" + "\n".join(block) + "\n"
    paths.atomic_write_text(path, text)


def run_standard(
    out_dir: str, into: Optional[str], before: Optional[str], only: Optional[List[str]] = None, label=None
) -> int:
    os.makedirs(out_dir, exist_ok=True)
    for key, title, argv in STANDARD:
        if only and key not in only:
            continue
        print(f"\n=== {key}: {title}", flush=True)
        cmd = [sys.executable, "-m", "xlgen.bench", *argv, f"--json={os.path.join(out_dir, key + '.json')}"]
        rc = subprocess.call(cmd, env=platforms.host_malloc_environment())  # None: this environment as it is
        if rc != 0:
            print(f"[bench] {key} failed (exit {rc})", file=sys.stderr)
    after = _load_dir(out_dir)
    prev = _load_dir(before) if before else None
    print("\n" + render_table(after, prev))
    if into:
        write_into(into, after, prev, label or f"results in {before}")
        print(f"\nwrote {into}")
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xlgen bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", help="config file with get_config()")
    p.add_argument("--steps", type=int, default=6, help="train steps per block (0: compile only)")
    p.add_argument("--blocks", type=int, default=3, help="interleaved measurement blocks (medians reported)")
    p.add_argument("--compare-hf", "--compare_hf", dest="compare_hf", action="store_true")
    p.add_argument("--eval", action="store_true", help="cached evaluation (Transformer-XL) instead of training")
    p.add_argument("--mem_lens", default="128,256,512", help="total contexts l (memory = l - segment)")
    p.add_argument("--segment", type=int, default=64)
    p.add_argument("--segments_per_block", type=int, default=32, help="--eval: segments per measured block (each side)")
    p.add_argument("--generate", action="store_true", help="sampling speed (Transformer-XL, xlgen.generate)")
    p.add_argument("--new_tokens", type=int, default=128, help="--generate: tokens sampled per block")
    p.add_argument("--gen_batch", type=int, default=1, help="--generate: samples per batch")
    p.add_argument("--gen_mem_len", type=int, default=128, help="--generate: decoding memory length")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--platform", default=None)
    p.add_argument("--standard", action="store_true", help="run the standard set (make bench)")
    p.add_argument("--out_dir", default="bench_results", help="--standard: JSON results directory")
    p.add_argument("--into", default=None, help="--standard: regenerate the table in this markdown file")
    p.add_argument("--before", default=None, help="--standard: a results directory for the 'before' column")
    p.add_argument("--before_label", default=None, help="--standard: what the 'before' column is (e.g. a commit)")
    p.add_argument("--only", default=None, help="--standard: comma-separated workload keys")
    p.add_argument("--report", action="store_true", help="--standard: only re-render from --out_dir")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen import config as config_lib

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2
    args = _parser().parse_args(rest)
    if args.standard:
        if args.report:
            after = _load_dir(args.out_dir)
            prev = _load_dir(args.before) if args.before else None
            print(render_table(after, prev))
            if args.into:
                write_into(args.into, after, prev, args.before_label or f"results in {args.before}")
            return 0
        return run_standard(
            args.out_dir, args.into, args.before, args.only.split(",") if args.only else None, args.before_label
        )
    if not args.config:
        print("xlgen bench: error: --config is required (or --standard)", file=sys.stderr)
        return 2
    try:
        config = config_lib.load_config(args.config, overrides)
    except config_lib.ConfigError as e:
        print(f"xlgen bench: error: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("XLGEN_COMPILATION_CACHE", "off")  # compile times are real, not cache loads
    try:
        from xlgen.runtime import default_platform, setup_runtime
    except ImportError:  # older trees (bench run on a checkout of an earlier commit for the "before" column)
        from xlgen.cli import _default_platform as default_platform
        from xlgen.cli import setup_runtime

    setup_runtime(args.platform or default_platform(), "off")
    import jax

    res: Dict[str, Any] = {
        "config": args.config,
        "overrides": overrides,
        "load_before": load_average(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "host_malloc": platforms.host_malloc_policy(),
    }
    peak = matmul_peak()
    print(f"[bench] f32 matmul peak (JAX, this run): {peak / 1e9:.1f} GFLOP/s  (load {load_average()[0]})", flush=True)
    if args.generate:
        res["generate"] = bench_generate(
            config,
            mem_len=args.gen_mem_len,
            new_tokens=args.new_tokens,
            batch=args.gen_batch,
            blocks=args.blocks,
            compare_hf=args.compare_hf,
        )
    elif args.eval:
        lens = [int(x) for x in args.mem_lens.split(",") if x]
        res.update(
            bench_eval(
                config,
                mem_lens=lens,
                segment=args.segment,
                blocks=args.blocks,
                compare_hf=args.compare_hf,
                segments_per_block=args.segments_per_block,
            )
        )
    else:
        res.update(bench_train(config, steps=args.steps, blocks=args.blocks, compare_hf=args.compare_hf, peak=peak))
    peak2 = matmul_peak()
    res["matmul_peak_flops_per_sec"] = max(peak, peak2)
    res["matmul_peak_flops_per_sec_start_end"] = [peak, peak2]
    if "model_flops_per_sec" in res:  # against the better of the two peak measurements
        res["mfu_vs_measured_matmul_peak"] = res["model_flops_per_sec"] / (
            res["matmul_peak_flops_per_sec"] * res["devices"]
        )
        res["matmul_bound_step_s"] = res["model_flops_per_step"] / (res["matmul_peak_flops_per_sec"] * res["devices"])
    res["load_after"] = load_average()
    res["peak_host_memory_gib"] = round(peak_host_memory_gib(), 2)
    print(
        json.dumps(
            {k: v for k, v in res.items() if not isinstance(v, dict) or k in ("per_len", "generate")},
            indent=1,
            default=str,
        )
    )
    if args.json:
        paths.atomic_write_text(args.json, json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    platforms.reexec_with_host_malloc()
    sys.exit(main())
