"""Small CPU reproductions of InitialGAN's claims (seed 004; docs/reproductions.md, "InitialGAN").

    python -m xlgen.reproductions.initialgan split    [--out=DIR]   PTB valid -> train / reference sentence files
    python -m xlgen.reproductions.initialgan replace  [--out=DIR --figures=docs]   LCR vs FED under word replacement
    python -m xlgen.reproductions.initialgan gan      [--out=DIR --seeds=0,1,2 --variants=...]   GAN runs + metrics
    python -m xlgen.reproductions.initialgan mle      [--out=DIR --seeds=0,1,2]   Transformer-XL MLE baseline
    python -m xlgen.reproductions.initialgan table    [--out=DIR]   the table of docs/reproductions.md

Workdirs and JSON go to --out (default workdirs/reproductions/initialgan); the JSON and samples of the runs in
docs/reproductions.md are copied to docs/reproductions/initialgan/.

Data: the Penn Treebank valid sentences of `../shared/data/text/ptb.valid.txt` (3,370 lines), split by seed 0 into
1,000 reference sentences and 2,370 training sentences (1,146 of them within the short setting's 19 words).

  replace  the Appendix experiment (Fig. 12): each word of the training sentences replaced, with probability p, by a
           word drawn uniformly from the training vocabulary; FED and LCR(τ) of the result against the reference
           set (LSA encoder fitted on the reference), p in 0..0.5, three replacement seeds.
  gan      `configs/textgan/initialgan.py:small` for each variant (initialgan; no_ds = no dropout sampling; ln =
           LayerNorm LSTM) and seed, trained in-process through `xlgen train`; 1,000 sampled sentences scored by
           `xlgen analyze textgen` against the reference set.
  mle      `configs/pretrain/txl_tiny.py` as a word-level LM on the GAN's training sentences (the 1,146 within 19
           words, one per line, <eos> between), sampled with temperature 1 (no top-k / top-p) from a <eos> prompt;
           the stream is cut into sentences at <eos> and those within 19 words kept (as the GAN's data).
  real     held-out real sentences (training sentences within 19 words) scored the same way: the data's own level.

Runs already in gan.json / mle.json are skipped, so an interrupted `gan` / `mle` continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTB_CANDIDATES = [  # the project's shared data beside the repository (a clone, or a worktree one level deeper)
    os.path.join(os.path.dirname(REPO), "shared", "data", "text", "ptb.valid.txt"),
    os.path.join(os.path.dirname(os.path.dirname(REPO)), "shared", "data", "text", "ptb.valid.txt"),
]
PTB = next((p for p in PTB_CANDIDATES if os.path.exists(p)), PTB_CANDIDATES[0])
TAUS = (0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8)
RATES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
VARIANTS = {
    "initialgan": [],
    "no_ds": ["--config.model.dropout_sampling=False"],
    "ln": ["--config.model.cell=ln"],
}
NUM_SAMPLES = 1000
MAX_WORDS = 19


def _write_lines(path: str, lines: List[str]) -> None:
    from data_pipelines import paths

    paths.atomic_write_text(path, "\n".join(lines) + "\n")


def split(out: str, source: str = PTB) -> Dict[str, str]:
    lines = [" ".join(line.split()) for line in open(source, encoding="utf-8")]
    lines = [s for s in lines if s]
    idx = np.random.default_rng(0).permutation(len(lines))
    ref = sorted(idx[:1000].tolist())
    train = sorted(idx[1000:].tolist())
    files = {
        "train": os.path.join(out, "train.txt"),
        "train_short": os.path.join(out, "train_short.txt"),
        "reference": os.path.join(out, "reference.txt"),
    }
    _write_lines(files["train"], [lines[i] for i in train])
    _write_lines(files["train_short"], [lines[i] for i in train if len(lines[i].split()) <= MAX_WORDS])
    _write_lines(files["reference"], [lines[i] for i in ref])
    return files


def replace_words(sentences: List[str], rate: float, vocab: List[str], seed: int) -> List[str]:
    rng = np.random.default_rng(seed)
    out = []
    for s in sentences:
        words = s.split()
        hit = rng.random(len(words)) < rate
        pick = rng.integers(0, len(vocab), len(words))
        out.append(" ".join(vocab[p] if h else w for w, h, p in zip(words, hit, pick)))
    return out


def replace_experiment(out: str, figures: str) -> Dict:
    from xlgen.analyze import textgen_metrics as tm
    from xlgen.analyze.sentence_encoders import LSAEncoder

    files = split(out)
    train = [s for s in open(files["train"]).read().splitlines() if s]
    ref = [s for s in open(files["reference"]).read().splitlines() if s]
    vocab = sorted({w for s in train for w in s.split()})
    enc = LSAEncoder(ref, dim=256)
    r = enc.encode(ref)
    res = {"encoder": enc.name, "rates": list(RATES), "taus": list(TAUS), "fed": {}, "lcr": {}}
    for rate in RATES:
        feds, lcrs = [], []
        for seed in (0, 1, 2):
            g = enc.encode(replace_words(train, rate, vocab, seed))
            feds.append(tm.frechet_distance(g, r))
            cov = tm.coverage(g, r, TAUS)
            lcrs.append([min(cov[t]) for t in TAUS])
        res["fed"][f"{rate:g}"] = {"mean": float(np.mean(feds)), "std": float(np.std(feds))}
        lcrs = np.asarray(lcrs)
        res["lcr"][f"{rate:g}"] = {
            f"{t:g}": {"mean": float(lcrs[:, i].mean()), "std": float(lcrs[:, i].std())} for i, t in enumerate(TAUS)
        }
    from data_pipelines import paths

    paths.write_json_atomic(os.path.join(out, "replace.json"), res)
    _plot_replace(res, os.path.join(figures, "repro_initialgan_replace.png"))
    return res


def _plot_replace(res: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from data_pipelines import paths

    rates = res["rates"]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    fed = np.array([res["fed"][f"{r:g}"]["mean"] for r in rates])
    ax[0].plot(rates, fed / fed[0], "k-o", label="FED / FED(0%)")
    for t in (0.5, 0.65, 0.7):
        lcr = np.array([res["lcr"][f"{r:g}"][f"{t:g}"]["mean"] for r in rates])
        ax[0].plot(rates, lcr / lcr[0], "-o", label=f"LCR(τ={t:g}) / LCR(0%)")
    ax[0].set_xlabel("share of words replaced")
    ax[0].axhline(1.0, color="0.7", lw=0.8)
    ax[0].set_title("relative to the unchanged sentences")
    ax[0].legend(fontsize=7)
    ax[1].plot(rates, fed, "k-o")
    ax[1].set_xlabel("share of words replaced")
    ax[1].set_ylabel("FED (LSA encoder)")
    fig.tight_layout()
    paths.atomic_write_figure(path, fig, dpi=120)
    plt.close(fig)


def _score(generated: List[str], ref_file: str, seed: int) -> Dict:
    from xlgen.analyze import textgen
    from xlgen.analyze.sentence_encoders import make_encoder

    ref = textgen.read_sentences(ref_file)
    gen = [s if s else "<empty>" for s in generated]
    return textgen.evaluate(gen, ref, make_encoder("lsa", ref), taus=TAUS, seed=seed)


def gan_runs(out: str, seeds: List[int], variants: List[str], platform: str) -> Dict:
    """Each (variant, seed): `xlgen train` of the small config (resumed if its workdir exists), 1,000 sentences from
    the final checkpoint, scored; runs already in gan.json are kept."""
    from xlgen.systems.initialgan import system
    from xlgen.train.workdir import Workdir

    files = split(out)
    results = _load(out, "gan.json")
    for v in variants:
        for seed in seeds:
            if f"{v}/{seed}" in results:
                continue
            wd = os.path.join(out, f"gan_{v}_s{seed}")
            argv = [
                "train",
                "--config=" + os.path.join(REPO, "configs", "textgan", "initialgan.py") + ":small",
                f"--config.data.train={files['train']}",
                f"--config.data.valid={files['reference']}",
                f"--config.seed={seed}",
                f"--config.data.seed={seed}",
                f"--workdir={wd}",
                f"--platform={platform}",
                *VARIANTS[v],
            ]
            train_s = _train(argv, wd)
            config, program, restored = Workdir(wd).open(sub="checkpoints")
            gen = system.sample_sentences(config, program, restored.state, NUM_SAMPLES, seed=1000 + seed)
            _write_lines(os.path.join(wd, "samples.txt"), gen)
            last = _last_train_record(wd)
            results[f"{v}/{seed}"] = {
                "step": int(restored.step),
                "train_seconds": round(train_s, 1),
                "empty_fraction": float(np.mean([not g for g in gen])),
                "mean_words": float(np.mean([len(g.split()) for g in gen])),
                "last_train_record": last,
                **_score(gen, files["reference"], seed),
            }
            _save(out, "gan.json", results)
    return results


def _train(argv: List[str], wd: str) -> float:
    """`xlgen train ARGV` in-process; its wall time in seconds."""
    from xlgen import cli

    t0 = time.time()
    if cli.main(argv) != 0:
        raise SystemExit(f"training {wd} failed")
    return time.time() - t0


def _last_train_record(wd: str) -> Dict:
    last = {}
    for line in open(os.path.join(wd, "metrics.jsonl"), encoding="utf-8"):
        r = json.loads(line)
        if "split" not in r and "source" not in r:
            last = r
    keep = ("step", "aligner/aligner_acc", "discriminator/wasserstein", "discriminator/lipschitz_penalty")
    return {k: last[k] for k in keep + ("generator/distinct_first_words", "generator_loss") if k in last}


def _load(out: str, name: str) -> Dict:
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else {}


def mle_runs(out: str, seeds: List[int], platform: str, steps: int = 1500) -> Dict:
    from xlgen.generate import decoder_for, load_for_generation

    files = split(out)
    # the GAN's training sentences (<= 19 words); the word vocabulary the lm pipeline builds from them: <unk>, <eos>,
    # then its words
    vocab_size = 2 + len({w for line in open(files["train_short"]) for w in line.split()} - {"<unk>", "<eos>"})
    results = _load(out, "mle.json")
    for seed in seeds:
        if f"mle/{seed}" in results:
            continue
        wd = os.path.join(out, f"mle_s{seed}")
        argv = [
            "train",
            "--config=" + os.path.join(REPO, "configs", "pretrain", "txl_tiny.py"),
            f"--config.data.source={files['train_short']}",
            f"--config.data.valid_source={files['reference']}",
            "--config.data.vocab=word",
            f"--config.model.vocab_size={vocab_size}",
            "--config.model.output_layer=softmax",
            f"--config.seed={seed}",
            f"--config.total_steps={steps}",
            "--config.eval_every_steps=-1",
            "--config.tensorboard=False",
            f"--workdir={wd}",
            f"--platform={platform}",
        ]
        train_s = _train(argv, wd)
        module, tok = load_for_generation(wd, None)
        dec = decoder_for(module, None)
        sents: List[str] = []
        chunk = 0
        while len(sents) < NUM_SAMPLES and chunk < 50:
            res = dec.generate(
                list(tok.encode("<eos>")),
                max_new_tokens=400,
                num_samples=8,
                seed=1000 * seed + chunk,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
            )
            for row in res["tokens"]:
                text = tok.decode(row.tolist())
                for s in text.split("\n")[:-1]:  # the prompt ends a sentence; each <eos> (decoded "\n") ends one
                    s = " ".join(s.split())
                    if s and len(s.split()) <= MAX_WORDS:
                        sents.append(s)
            chunk += 1
        gen = sents[:NUM_SAMPLES]
        _write_lines(os.path.join(wd, "samples.txt"), gen)
        results[f"mle/{seed}"] = {
            "steps": steps,
            "train_seconds": round(train_s, 1),
            "mean_words": float(np.mean([len(g.split()) for g in gen])),
            **_score(gen, files["reference"], seed),
        }
        _save(out, "mle.json", results)
    return results


def reference_row(out: str) -> Dict:
    """The metrics of held-out real sentences (training sentences within 19 words) against the reference."""
    files = split(out)
    train = [s for s in open(files["train"]).read().splitlines() if s and len(s.split()) <= MAX_WORDS]
    sents = train[:NUM_SAMPLES]
    return {"mean_words": float(np.mean([len(x.split()) for x in sents])), **_score(sents, files["reference"], 0)}


def _save(out: str, name: str, obj) -> None:
    from data_pipelines import paths

    paths.write_json_atomic(os.path.join(out, name), obj)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlgen.reproductions.initialgan")
    p.add_argument("what", choices=("split", "replace", "plot", "gan", "mle", "real", "table", "compare"))
    p.add_argument("--out", default=os.path.join(REPO, "workdirs", "reproductions", "initialgan"))
    p.add_argument("--figures", default=os.path.join(REPO, "docs"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--platform", default="cpu")
    p.add_argument("--mle_steps", type=int, default=1500)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.what == "split":
        print(split(args.out))
    elif args.what == "replace":
        res = replace_experiment(args.out, args.figures)
        for r in RATES:
            print(
                f"p={r:.2f}  FED {res['fed'][f'{r:g}']['mean']:.4f}  LCR(0.65) {res['lcr'][f'{r:g}']['0.65']['mean']:.4f}"
            )
    elif args.what == "plot":  # the replacement figure again from replace.json
        _plot_replace(_load(args.out, "replace.json"), os.path.join(args.figures, "repro_initialgan_replace.png"))
    elif args.what == "gan":
        gan_runs(args.out, seeds, args.variants.split(","), args.platform)
    elif args.what == "mle":
        mle_runs(args.out, seeds, args.platform, steps=args.mle_steps)
    elif args.what == "real":
        _save(args.out, "real.json", reference_row(args.out))
    elif args.what == "compare":
        print(compare(args.out))
    else:
        print(table(args.out))
    return 0


LABELS = {
    "training data": "training sentences (<= 19 words; real data)",
    "mle": "Transformer-XL MLE (temperature 1)",
    "initialgan": "InitialGAN (FN-LSTM, dropout sampling)",
    "no_ds": "InitialGAN without dropout sampling",
    "ln": "InitialGAN with LN-LSTM",
}


def _samples_file(out: str, key: str) -> str:
    model, seed = key.split("/")
    return os.path.join(out, f"mle_s{seed}" if model == "mle" else f"gan_{model}_s{seed}", "samples.txt")


def add_diversity(out: str) -> None:
    """Adds `distinct_sentences` (share of the samples that occur once or more, i.e. unique / total) and
    `top_sentence_share` (the most frequent sample's share) to each run of gan.json / mle.json from its samples."""
    for name in ("gan.json", "mle.json"):
        data = _load(out, name)
        for key, r in data.items():
            path = _samples_file(out, key)
            if not os.path.exists(path):
                continue
            lines = open(path, encoding="utf-8").read().split("\n")[:-1]
            counts: Dict[str, int] = {}
            for line in lines:
                counts[line] = counts.get(line, 0) + 1
            r["distinct_sentences"] = len(counts) / len(lines)
            r["top_sentence_share"] = max(counts.values()) / len(lines)
        if data:
            _save(out, name, data)


def rows(out: str) -> Dict[str, List[Dict]]:
    """{model: [result per seed]} of real.json, mle.json and gan.json."""
    out_rows: Dict[str, List[Dict]] = {}
    for name in ("real.json", "mle.json", "gan.json"):
        data = _load(out, name)
        if name == "real.json" and data:
            data = {"training data/0": data}
        for key, r in data.items():
            out_rows.setdefault(key.split("/")[0], []).append(r)
    return out_rows


def table(out: str) -> str:
    """The markdown table of docs/reproductions.md: mean ± std over seeds (population std), BLEU scores x 100."""
    keys = [("bleu", 100), ("self_bleu", 100), ("inverse_bleu", 100), ("fed", 1), ("lcr", 1)]
    add_diversity(out)
    head = "| model | seeds | BLEU-5 | Self-BLEU-5 | Inverse BLEU-5 | FED | LCR(0.65) | LCR(0.5) | LCR(0.4) | words |"
    head += " distinct | empty |"
    lines = [head, "|" + "---|" * 12]
    for model, rs in rows(out).items():
        cells = []
        for k, scale in keys:
            v = np.array([r[k] for r in rs]) * scale
            cells.append(f"{v.mean():.2f} ± {v.std():.2f}" if scale == 100 else f"{v.mean():.3f} ± {v.std():.3f}")
        for t in ("0.5", "0.4"):
            v = np.array([r["lcr_by_tau"][t] for r in rs])
            cells.append(f"{v.mean():.3f} ± {v.std():.3f}")
        for k, fmt in (("mean_words", "{:.1f}"), ("distinct_sentences", "{:.2f}"), ("empty_fraction", "{:.2f}")):
            v = [r[k] for r in rs if k in r]
            cells.append(fmt.format(np.mean(v)) if v else "")
        lines.append(f"| {LABELS.get(model, model)} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PAIRS = (("initialgan", "mle"), ("initialgan", "no_ds"), ("initialgan", "ln"))
METRICS = ("bleu", "self_bleu", "inverse_bleu", "fed", "lcr", "lcr@0.5", "mean_words", "distinct_sentences")


def _metric(r: Dict, k: str) -> float:
    return float(r["lcr_by_tau"][k.split("@")[1]]) if "@" in k else float(r[k])


def compare(out: str) -> str:
    """Per pair of the paper's claims and metric: the two means, their difference, the seeds' std of each, and
    whether the difference exceeds twice the larger std (a crude separation test at 3 seeds)."""
    add_diversity(out)
    rs = rows(out)
    lines = []
    for a, b in PAIRS:
        if a not in rs or b not in rs:
            continue
        for k in METRICS:
            va, vb = (np.array([_metric(r, k) for r in rs[m] if k in r or "@" in k]) for m in (a, b))
            if not len(va) or not len(vb):
                continue
            d = va.mean() - vb.mean()
            sep = abs(d) > 2 * max(va.std(), vb.std())
            lines.append(
                f"{a} vs {b}  {k:12s} {va.mean():.4f} ± {va.std():.4f}  vs  {vb.mean():.4f} ± {vb.std():.4f}"
                f"  diff {d:+.4f}  {'separated' if sep else 'within noise'}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
