"""Small CPU reproductions of the softmax-bottleneck / spectrum-control claims (docs/reproductions.md).

    python -m xlgen.reproductions.output_layers rank      [--out=DIR --figures=docs --steps=N --platform=cpu]
    python -m xlgen.reproductions.output_layers spectrum  [...]
    python -m xlgen.reproductions.output_layers ppl       [--seeds=0,1,2 ...]
    python -m xlgen.reproductions.output_layers mixtures  [...]
    python -m xlgen.reproductions.output_layers seeds     [--seeds=0,1,2,3,4 ...]
    python -m xlgen.reproductions.output_layers sc_adaptive [--seeds=0 ...]
    python -m xlgen.reproductions.output_layers all

All runs are `configs/pretrain/txl_tiny.py` (2-layer Transformer-XL, character LM on the embedded tinyshakespeare,
vocabulary 74, batch 8 x 32, memory 32) trained in-process with `xlgen.train.loop.train`, then analysed with the
`xlgen analyze` functions. Results go to `<out>/<experiment>.json` (default out: workdirs/reproductions) and the
figures to `<figures>/repro_*.png`.

  rank      (a) d_model = d_embed = 16 (softmax bound d+2 = 18 < V = 74): softmax, MoC, MoS (K=4), DOC (3 + 1),
            SigSoftmax, GSS(-1.5, 2.5); Press rank of Q (float32 eps) on 1,000 held-out contexts, ε-effective
            ranks, the expected pairwise KLD (000 Table A.11), valid bpc; Press-rank robustness (001 Alg. 5.1/5.2)
            on the MoS Q; Q's normalised singular values on a linear axis (001 Fig. 5.10).
  spectrum  (b) d = 64: softmax vs softmax with spectrum control (orthogonality λ1 = λ2 = 1, polynomial prior
            c1 = the baseline's σ_1, γ = 0.5, λ = 10); normalised singular values, I1 / I2.
  ppl       (c) d = 64: softmax and GSS(-1.5, 2.5) with d_inner 320 vs MoS (K = 4) with d_inner 256, parameters
            matched to < 1%; valid bpc over seeds (mean, std, min, max).
  mixtures  (d) d = 16: MoS rank and bpc against K ∈ {1, 2, 4, 8} (no dropout) and against the MoS dropout
            {0, 0.15, 0.3} at K = 4 (001 Tables 5.6/5.7).
  seeds     (e) d = 64, every seed of --seeds (default 5): softmax, GSS, MoS (K=4), DOC (3 + 1) at matched
            parameters, and LMS-PLIF learned vs frozen (LMS-PLIF†, `optimizer.param_groups`); mean ± std and the
            Wilcoxon rank-sum p-value (`xlgen analyze compare`) against softmax, and PLIF† against PLIF.
  sc_adaptive (f) word-level tinyshakespeare (lower-cased, whitespace words, V = 23,643), Transformer-XL d = 64 with
            the adaptive softmax (cutoffs 2,000 / 8,000, div_val 1): baseline vs spectrum control on E = U diag(σ)
            Vᵀ (seed 002 Table 2's setting, scaled down): valid ppl, output-embedding spectrum, I1 / I2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

DEFAULT_STEPS = {"rank": 1000, "spectrum": 1000, "ppl": 500, "mixtures": 1000, "seeds": 500, "sc_adaptive": 1000}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "pretrain", "txl_tiny.py")

COMMON = {
    "tensorboard": "False",
    "log_every_steps": "100",
    "eval_every_steps": "-1",
    "eval.steps": "100",
    "checkpoint.every_steps": "100000",
    "mesh.num_devices": "1",
}
SMALL_D = {
    "model.d_model": "16",
    "model.d_embed": "16",
    "model.n_head": "2",
    "model.d_head": "8",
    "model.d_inner": "64",
}


def run(workdir: str, overrides: Dict[str, str]) -> Dict:
    """Train `txl_tiny.py` with `overrides` into `workdir` (resumes / skips if already complete); the final eval."""
    from xlgen import config as config_lib
    from xlgen.train import loop

    over = {**COMMON, **overrides}
    config = config_lib.load_config(CONFIG, over)
    t0 = time.time()
    summary = loop.train(config, workdir)
    ev = summary.get("eval")
    if ev is None:  # already trained: evaluate the latest checkpoint
        ev = loop.evaluate(config, workdir)
    return {"workdir": workdir, "overrides": over, "eval": ev, "wall_s": round(time.time() - t0, 1)}


def n_params(overrides: Dict[str, str]) -> int:
    """Parameters of the language model a run with `overrides` trains (abstract: nothing allocated)."""
    import jax
    from flax import nnx

    from xlgen import config as config_lib
    from xlgen import registry

    config = config_lib.load_config(CONFIG, {**COMMON, **overrides})
    make = registry.get(config.model.family).models["lm"]
    abstract = nnx.eval_shape(lambda: make(registry.model_config(config), rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))


def _save(out: str, name: str, obj) -> str:
    from data_pipelines.paths import write_json_atomic

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    write_json_atomic(path, obj)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------------------------------------------


RANK_LAYERS = {
    "softmax": {"model.output_layer": "softmax"},
    "moc": {"model.output_layer": "moc", "model.output.n_experts": "4"},
    "mos": {"model.output_layer": "mos", "model.output.n_experts": "4"},
    "doc": {"model.output_layer": "doc", "model.output.doc_counts": "(3, 1)"},
    "sigsoftmax": {"model.output_layer": "sigsoftmax"},
    "gss": {"model.output_layer": "gss", "model.output.c": "-1.5", "model.output.k": "2.5"},
}


def exp_rank(args) -> Dict:
    from xlgen.analyze import kld
    from xlgen.analyze.common import load_model
    from xlgen.analyze.rank import analyze, collect_log_probs, plot_linear
    from xlgen.analyze.robustness import robustness_report

    results = {}
    curves = {}
    for name, over in RANK_LAYERS.items():
        wd = os.path.join(args.out, "rank", name)
        res = run(wd, {**SMALL_D, **over, "total_steps": str(args.steps)})
        rep = analyze(wd, contexts=1000)
        s = rep.pop("singular_values")
        curves[name] = (s / s[0]).tolist()
        res.update({k: rep[k] for k in ("rank", "bound", "d", "rank_numpy_tolerance", "effective_rank", "shape")})
        res["n_params"] = n_params({**SMALL_D, **over})
        res["expected_pairwise_kld"] = kld.analyze(wd, contexts=1000)["expected_pairwise_kld"]
        results[name] = res
        print(
            f"[rank] {name}: rank {rep['rank']} (bound {rep['bound']}), pairwise KLD "
            f"{res['expected_pairwise_kld']:.4f}, valid bpc {res['eval']['bpc']:.4f}",
            flush=True,
        )
    config, model, _ = load_model(os.path.join(args.out, "rank", "mos"))
    q = collect_log_probs(config, model, contexts=1000, split=config.eval.split)
    robust = robustness_report(q, keep=10, iterations=10, noise=(1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 1e-16, 1e-20))
    print("[rank] robustness (MoS Q): " + json.dumps([(r["c"], r["press_rank"]) for r in robust["noise"]]), flush=True)
    _save(args.out, "rank", {"results": results, "normalized_singular_values": curves, "robustness_mos": robust})
    plot_linear(
        os.path.join(args.figures, "repro_rank_linear.png"),
        {k: np.asarray(v) for k, v in curves.items()},
        "(a) normalised singular values of Q, linear (001 Fig. 5.10)",
        top=74,
        ymax=0.2,
    )
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, s in curves.items():
        ax.semilogy(np.arange(1, len(s) + 1), s, lw=1.4, label=f"{name} (rank {results[name]['rank']})")
    bound = results["softmax"]["bound"]
    ax.axvline(bound, color="k", ls="--", lw=0.8, label=f"softmax bound d+2 = {bound}")
    ax.set_xlabel("index k")
    ax.set_ylabel("σ_k / σ_1 of Q (1000 contexts x 74)")
    ax.set_title("(a) log-probability matrix spectrum, d = 16")
    ax.legend(fontsize=8)
    fig.tight_layout()
    from xlgen.analyze.common import save_figure

    save_figure(fig, os.path.join(args.figures, "repro_rank.png"))
    return results


def sc_overrides(c1: float) -> Dict[str, str]:
    """Spectrum control as in (b) and (f): orthogonality λ1 = λ2 = 1, polynomial prior c1 k^(-0.5) with λ = 10."""
    return {
        "model.output.spectrum_control": "True",
        "model.output.sc_lambda_u_fro": "1.0",
        "model.output.sc_lambda_v_fro": "1.0",
        "model.output.sc_prior": "poly",
        "model.output.sc_c1": f"{c1:.6g}",
        "model.output.sc_gamma": "0.5",
        "model.output.sc_lambda_prior": "10.0",
    }


def exp_spectrum(args) -> Dict:
    from xlgen.analyze.common import load_model, output_embedding
    from xlgen.analyze.spectrum import plot_spectra, spectrum_report

    base_wd = os.path.join(args.out, "spectrum", "softmax")
    base = run(base_wd, {"model.output_layer": "softmax", "total_steps": str(args.steps)})
    _, model, _ = load_model(base_wd)
    w_base, _ = output_embedding(model)
    rep_base = spectrum_report(w_base)
    c1 = rep_base["singular_values"][0]
    sc_over = {"model.output_layer": "softmax", **sc_overrides(c1), "total_steps": str(args.steps)}
    sc_wd = os.path.join(args.out, "spectrum", "spectrum_control")
    sc = run(sc_wd, sc_over)
    _, model, _ = load_model(sc_wd)
    w_sc, _ = output_embedding(model)
    rep_sc = spectrum_report(w_sc)
    results = {"softmax": {**base, **rep_base}, "spectrum_control": {**sc, **rep_sc}}
    for name, r in results.items():
        s = np.asarray(r["normalized_singular_values"])
        print(
            f"[spectrum] {name}: I1 {r['I1']:.4f} I2 {r['I2']:.4f} σ_10/σ_1 {s[9]:.4f} σ_64/σ_1 {s[-1]:.4f} "
            f"valid bpc {r['eval']['bpc']:.4f}",
            flush=True,
        )
    _save(args.out, "spectrum", results)
    plot_spectra(
        os.path.join(args.figures, "repro_spectrum.png"),
        {k: np.asarray(v["singular_values"]) for k, v in results.items()},
        title="(b) output embedding spectrum, d = 64",
    )
    return results


PPL_LAYERS = {
    "softmax": {"model.output_layer": "softmax", "model.d_inner": "320"},
    "gss": {"model.output_layer": "gss", "model.output.c": "-1.5", "model.output.k": "2.5", "model.d_inner": "320"},
    "mos": {"model.output_layer": "mos", "model.output.n_experts": "4", "model.d_inner": "256"},
}


def exp_ppl(args) -> Dict:
    seeds = [int(s) for s in args.seeds.split(",")]
    results: Dict[str, Dict] = {}
    for name, over in PPL_LAYERS.items():
        runs: List[Dict] = []
        for seed in seeds:
            wd = os.path.join(args.out, "ppl", f"{name}_seed{seed}")
            runs.append(run(wd, {**over, "seed": str(seed), "total_steps": str(args.steps)}))
            print(f"[ppl] {name} seed {seed}: valid bpc {runs[-1]['eval']['bpc']:.4f}", flush=True)
        bpc = np.array([r["eval"]["bpc"] for r in runs])
        results[name] = {
            "n_params": n_params(over),
            "bpc": bpc.tolist(),
            "mean": float(bpc.mean()),
            "std": float(bpc.std(ddof=1)) if len(bpc) > 1 else 0.0,
            "min": float(bpc.min()),
            "max": float(bpc.max()),
            "runs": runs,
        }
    _save(args.out, "ppl", results)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for i, (name, r) in enumerate(results.items()):
        ax.scatter([i] * len(r["bpc"]), r["bpc"], s=25)
        ax.errorbar([i + 0.15], [r["mean"]], yerr=[r["std"]], fmt="o", color="k", capsize=3)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels([f"{n}\n{r['n_params'] / 1e3:.1f}K params" for n, r in results.items()])
    ax.set_ylabel("valid bpc (lower is better)")
    ax.set_title(f"(c) {len(seeds)} seeds, {args.steps} steps")
    fig.tight_layout()
    from xlgen.analyze.common import save_figure

    save_figure(fig, os.path.join(args.figures, "repro_ppl.png"))
    return results


MIXTURES = {
    **{f"K{k}": {"model.output.n_experts": str(k), "model.output.expert_dropout": "0.0"} for k in (1, 2, 4, 8)},
    **{f"K4_drop{d}": {"model.output.n_experts": "4", "model.output.expert_dropout": d} for d in ("0.15", "0.3")},
}


def exp_mixtures(args) -> Dict:
    from xlgen.analyze.rank import analyze

    results = {}
    for name, over in MIXTURES.items():
        wd = os.path.join(args.out, "mixtures", name)
        full = {**SMALL_D, "model.output_layer": "mos", **over}
        res = run(wd, {**full, "total_steps": str(args.steps)})
        rep = analyze(wd, contexts=1000)
        rep.pop("singular_values")
        res.update({k: rep[k] for k in ("rank", "bound", "effective_rank")})
        res["n_params"] = n_params(full)
        results[name] = res
        print(f"[mixtures] {name}: rank {rep['rank']}, valid bpc {res['eval']['bpc']:.4f}", flush=True)
    _save(args.out, "mixtures", results)
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(8.4, 3.6))
    ks = [1, 2, 4, 8]
    ax[0].plot(ks, [results[f"K{k}"]["rank"] for k in ks], "o-", label="Press rank")
    ax[0].axhline(results["K1"]["bound"], color="k", ls="--", lw=0.8, label="softmax bound d+2")
    ax[0].set_xlabel("mixture components K (dropout 0)")
    ax[0].set_ylabel("rank of Q")
    ax[0].legend(fontsize=8)
    drops = [("0", "K4"), ("0.15", "K4_drop0.15"), ("0.3", "K4_drop0.3")]
    ax[1].plot([float(d) for d, _ in drops], [results[n]["rank"] for _, n in drops], "o-")
    ax[1].set_xlabel("MoS dropout (K = 4)")
    ax[1].set_ylabel("rank of Q")
    fig.suptitle("(d) MoS rank against K and dropout, d = 16")
    fig.tight_layout()
    from xlgen.analyze.common import save_figure

    save_figure(fig, os.path.join(args.figures, "repro_mixtures.png"))
    return results


PLIF = {"model.output_layer": "plif", "model.d_inner": "320"}
SEED_LAYERS = {
    "softmax": PPL_LAYERS["softmax"],
    "gss": PPL_LAYERS["gss"],
    "mos": PPL_LAYERS["mos"],
    "doc": {"model.output_layer": "doc", "model.output.doc_counts": "(3, 1)", "model.d_inner": "256"},
    "plif": PLIF,
    "plif_frozen": {**PLIF, "optimizer.param_groups": "({'pattern': 'slope_logits', 'frozen': True},)"},
}


def exp_seeds(args) -> Dict:
    from xlgen.analyze.compare import compare

    seeds = [int(s) for s in args.seeds.split(",")]
    bpc: Dict[str, List[float]] = {}
    runs: Dict[str, List[Dict]] = {}
    for name, over in SEED_LAYERS.items():
        runs[name] = []
        for seed in seeds:
            wd = os.path.join(args.out, "seeds", f"{name}_seed{seed}")
            runs[name].append(run(wd, {**over, "seed": str(seed), "total_steps": str(args.steps)}))
            print(f"[seeds] {name} seed {seed}: valid bpc {runs[name][-1]['eval']['bpc']:.4f}", flush=True)
        bpc[name] = [r["eval"]["bpc"] for r in runs[name]]
    vs_softmax = compare(bpc, "softmax")
    plif = compare({"plif": bpc["plif"], "plif_frozen": bpc["plif_frozen"]}, "plif")
    results = {
        "steps": args.steps,
        "seeds": seeds,
        "n_params": {name: n_params(over) for name, over in SEED_LAYERS.items()},
        "vs_softmax": vs_softmax,
        "plif_frozen_vs_plif": plif,
        "runs": runs,
    }
    _save(args.out, "seeds", results)
    from xlgen.analyze.compare import plot

    plot(os.path.join(args.figures, "repro_seeds.png"), vs_softmax, f"valid bpc, {args.steps} steps")
    return results


def exp_sc_adaptive(args) -> Dict:
    from xlgen.analyze.common import load_model, output_embedding
    from xlgen.analyze.spectrum import plot_spectra, spectrum_report

    word = {
        "data.vocab": "word",
        "data.lower": "True",
        "model.vocab_size": "23643",
        "model.cutoffs": "(2000, 8000)",
        "model.div_val": "1",
        "model.output_layer": "adaptive",
        "eval.metric": "ppl",
    }
    seeds = [int(s) for s in args.seeds.split(",")]
    results: Dict[str, Dict] = {"baseline": {"runs": []}, "spectrum_control": {"runs": []}}
    for seed in seeds:
        base_wd = os.path.join(args.out, "sc_adaptive", f"baseline_seed{seed}")
        base = run(base_wd, {**word, "seed": str(seed), "total_steps": str(args.steps)})
        w_base, _ = output_embedding(load_model(base_wd)[1])
        rep_base = spectrum_report(w_base, sample=0)
        c1 = rep_base["singular_values"][0]
        sc_over = {**word, **sc_overrides(c1), "seed": str(seed), "total_steps": str(args.steps)}
        sc_wd = os.path.join(args.out, "sc_adaptive", f"spectrum_control_seed{seed}")
        sc = run(sc_wd, sc_over)
        w_sc, _ = output_embedding(load_model(sc_wd)[1])
        rep_sc = spectrum_report(w_sc, sample=0)
        for name, r, rep in (("baseline", base, rep_base), ("spectrum_control", sc, rep_sc)):
            s = rep["normalized_singular_values"]
            results[name]["runs"].append(
                {
                    **r,
                    "sigma_1": rep["singular_values"][0],
                    "sigma_10_over_1": s[9],
                    "sigma_d_over_1": s[-1],
                    "I1": rep["I1"],
                    "I2": rep["I2"],
                    "effective_rank": rep["effective_rank"],
                    "singular_values": rep["singular_values"],
                }
            )
            print(
                f"[sc_adaptive] {name} seed {seed}: valid ppl {r['eval']['ppl']:.2f}  I1 {rep['I1']:.4f}  "
                f"I2 {rep['I2']:.4f}  σ_10/σ_1 {s[9]:.4f}",
                flush=True,
            )
    _save(args.out, "sc_adaptive", results)
    plot_spectra(
        os.path.join(args.figures, "repro_sc_adaptive.png"),
        {k: np.asarray(v["runs"][0]["singular_values"]) for k, v in results.items()},
        title="(f) word-level, adaptive softmax: output embedding spectrum",
    )
    return results


EXPERIMENTS = {
    "rank": exp_rank,
    "spectrum": exp_spectrum,
    "ppl": exp_ppl,
    "mixtures": exp_mixtures,
    "seeds": exp_seeds,
    "sc_adaptive": exp_sc_adaptive,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m xlgen.reproductions.output_layers", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    p.add_argument("--out", default=os.path.join(REPO, "workdirs", "reproductions"))
    p.add_argument("--figures", default=os.path.join(REPO, "docs"))
    p.add_argument("--steps", type=int, default=0, help="training steps (default: rank 1000, spectrum 1000, ppl 500)")
    p.add_argument("--seeds", default="", help="default: 0,1,2 (ppl), 0,1,2,3,4 (seeds), 0 (sc_adaptive)")
    p.add_argument("--platform", default="cpu")
    args = p.parse_args(argv)
    from xlgen.analyze.common import setup

    setup(args.platform)
    os.makedirs(args.figures, exist_ok=True)
    todo = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    steps, seeds = args.steps, args.seeds
    for name in todo:
        args.steps = steps or DEFAULT_STEPS[name]
        args.seeds = seeds or {"seeds": "0,1,2,3,4", "sc_adaptive": "0"}.get(name, "0,1,2")
        EXPERIMENTS[name](args)
    print(json.dumps({"done": todo, "out": args.out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
