"""Evaluation-memory sweeps: `xlgen eval --workdir=DIR --config.eval.mem_len=64,128,256,512`.

Restores the latest checkpoint once and evaluates it once per memory length (each exactly as `xlgen eval` with
that `eval.mem_len`: same pipeline, steps, same_length / clamp_len; metrics.jsonl is left alone) and writes

    <workdir>/eval_mem_len_sweep.json   {"step", "split", "same_length", "eval_tgt_len", "metric",
                                         "results": [{"mem_len", "loss", "ppl", ("bpc")}, ...]}
    <workdir>/eval_mem_len_sweep.png    ppl (or bpc) against evaluation memory length

Transformer-XL trains with M = L and evaluates with longer memory (Dai thesis §3.2, Table 2.6's "Attn Len"): the
sweep shows how far the model profits from a longer memory. `--json=PATH` / `--png=PATH` on the eval command
line are not needed; the files sit next to metrics.jsonl.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any, Dict, List, Optional

from data_pipelines import paths

log = logging.getLogger("xlgen")


def parse_mem_lens(text: str) -> List[int]:
    """ "64,128,256" -> [64, 128, 256] (sorted, unique); a clear error otherwise."""
    try:
        values = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--config.eval.mem_len={text}: expected integers separated by commas, e.g. 64,128,256")
    if not values or min(values) < 0:
        raise ValueError(f"--config.eval.mem_len={text}: expected non-negative memory lengths")
    return values


def plot_sweep(result: Dict[str, Any], path: str) -> None:
    """PNG of the sweep's metric against eval memory length (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    xs = [r["mem_len"] for r in result["results"]]
    ys = [r[metric] for r in result["results"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    ax.plot(xs, ys, "o-")
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    if min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation memory length (mem_len)")
    ax.set_ylabel(f"{result['split']} {metric}")
    ax.set_title(f"step {result['step']}: {metric} vs eval memory (segment {result['eval_tgt_len']})", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.atomic_write_figure(path, fig)
    plt.close(fig)


def run(config, workdir: str, mem_lens: List[int], json_path: Optional[str] = None) -> Dict[str, Any]:
    """Evaluate `workdir`'s latest checkpoint with each eval memory length; write the JSON and PNG."""
    import jax

    from xlgen import registry, sharding
    from xlgen.train import loop
    from xlgen.train.checkpointing import Checkpointer
    from xlgen.train.program import build_program

    probe = copy.deepcopy(config)
    probe.eval.mem_len = 3
    shape = registry.objective(config).mems_shape(probe, "eval")
    if shape is None or shape[2] != 3:
        raise ValueError(
            f"eval.mem_len sweeps apply to objectives whose evaluation memory length is eval.mem_len (Transformer-XL "
            f"language models); objective {registry.objective(config).name!r} has none"
        )
    if 0 in mem_lens and config.eval.same_length:
        raise ValueError(
            "eval.mem_len=0 with eval.same_length=True masks every key; use --config.eval.same_length=False"
        )
    ckpt_dir = paths.join(workdir, "checkpoints")
    if not paths.as_path(ckpt_dir).is_dir():
        raise FileNotFoundError(f"{workdir}: no checkpoints/ directory (train first)")
    loop.check_workdir_compatible(config, workdir)
    mesh = sharding.make_mesh(config.mesh)
    results, params, step = [], None, None
    pipe = loop.make_pipeline(config, config.eval.split)
    for m in mem_lens:
        cfg = copy.deepcopy(config)
        cfg.eval.mem_len = int(m)
        program = build_program(cfg, mesh)  # (outside the mesh context, as loop.evaluate)
        with jax.set_mesh(mesh):
            if params is None:  # parameters do not depend on the eval memory: restore once
                ckpt = Checkpointer(ckpt_dir, keep=0, async_save=False)
                restored = ckpt.restore_latest(program.abstract_state(), None)
                ckpt.close()
                if restored is None:
                    raise FileNotFoundError(f"{ckpt_dir}: no checkpoint to evaluate")
                state, _, _, step = restored
                params = program.params_of(state)
            res = loop.run_eval(program, params, pipe, loop._eval_steps(cfg, pipe))
        log.info("eval mem_len %d: %s", m, "  ".join(f"{k} {v:.5g}" for k, v in res.items()))
        results.append({"mem_len": int(m), **res})
    metric = "bpc" if "bpc" in results[0] else "ppl"
    out = {
        "workdir": str(workdir),
        "step": step,
        "split": config.eval.split,
        "same_length": config.eval.same_length,
        "clamp_len": config.eval.clamp_len,
        "eval_tgt_len": int(config.data.eval_tgt_len),
        "train_mem_len": int(config.model.mem_len),
        "metric": metric,
        "results": results,
    }
    json_path = json_path or paths.join(workdir, "eval_mem_len_sweep.json")
    if paths.is_remote(json_path):  # pragma: no cover - gs:// workdirs: write through epath
        paths.as_path(json_path).write_text(json.dumps(out, indent=2))
    else:
        paths.atomic_write_text(json_path, json.dumps(out, indent=2) + "\n")
        plot_sweep(out, os.path.splitext(json_path)[0] + ".png")
    out["json"] = json_path
    return out
