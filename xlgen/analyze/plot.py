"""`xlgen plot --workdir=DIR [--workdir=DIR2 ...] [--out=PNG]`: training curves from `metrics.jsonl` (matplotlib).

One figure, one panel per quantity against the step: training loss (and each player's loss, `<player>_loss`, of a
multi-player system), learning rate, tokens/s, and each evaluation
metric (eval loss, ppl, bpc, accuracy, f1, ...; one line per split), and where the wall time went (the goodput
records of each attempt, `xlgen.train.goodput`: stacked seconds per category, the run's goodput in the title).
Several workdirs are overlaid (legend = the workdir's name). Written to `DIR/plots/training.png` (one workdir) or `DIR/plots/compare.png` (several; the first
workdir), or `--out`, replacing the file if it exists. Prints the path.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

from data_pipelines import paths

TRAIN_PANELS = (("loss", "training loss"), ("learning_rate", "learning rate"), ("tokens_per_sec", "tokens / s"))
SKIP_EVAL = {"step", "split", "time", "wall_time"}
GOODPUT = "goodput"  # the `split` of the per-attempt goodput records (not an evaluation)


def _num(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def read_run(workdir: str) -> List[Dict]:
    from xlgen.train import metrics as metrics_lib

    path = paths.join(workdir, "metrics.jsonl")
    if not paths.as_path(path).exists():
        raise FileNotFoundError(f"{path}: no such file (is {workdir} an xlgen workdir that has logged a step?)")
    return metrics_lib.read_metrics(path)


def _series(records: List[Dict], key: str, split: Optional[str]):
    xs, ys = [], []
    for r in records:
        if r.get("split") != split:
            continue
        y = _num(r.get(key))
        if y is not None and "step" in r:
            xs.append(int(r["step"]))
            ys.append(y)
    return xs, ys


def _goodput_panel(ax, runs: Dict[str, List[Dict]], names: Dict[str, str]) -> None:
    """Stacked bars: each attempt's seconds per goodput category (one group of bars per workdir); the title gives
    each run's goodput over all its attempts."""
    from xlgen.train.goodput import CATEGORIES, goodput_of

    colors = dict(zip(CATEGORIES, ("tab:green", "tab:blue", "tab:orange", "tab:purple", "tab:cyan", "tab:red", "0.6")))
    width = 0.8 / len(runs)
    titles = []
    for i, (w, recs) in enumerate(runs.items()):
        attempts = {}
        for r in recs:
            if r.get("split") == GOODPUT and isinstance(r.get("time_s"), dict):
                attempts[int(r.get("attempt", len(attempts) + 1))] = r["time_s"]
        if not attempts:
            continue
        xs = sorted(attempts)
        bottom = [0.0] * len(xs)
        for c in CATEGORIES:
            ys = [float(attempts[a].get(c, 0.0) or 0.0) for a in xs]
            if any(ys):
                ax.bar(
                    [x + i * width for x in xs],
                    ys,
                    width,
                    bottom=bottom,
                    color=colors[c],
                    label=c.replace("_", " ") if i == 0 else None,
                )
                bottom = [b + y for b, y in zip(bottom, ys)]
        total = {c: sum(float(attempts[a].get(c, 0.0) or 0.0) for a in xs) for c in CATEGORIES}
        titles.append(f"{names[w]} {100 * (goodput_of(total) or 0.0):.1f}%")
    ax.set_title("goodput: " + ", ".join(titles) if titles else "wall time per attempt")
    ax.set_xlabel("attempt")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, axis="y")
    if ax.patches:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes, color="gray")


def plot(workdirs: Sequence[str], out: Optional[str] = None) -> str:
    """Write the figure for `workdirs`; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {w: read_run(w) for w in workdirs}
    names = {w: os.path.basename(os.path.normpath(str(w))) or str(w) for w in workdirs}
    if len(set(names.values())) < len(names):
        names = {w: str(w) for w in workdirs}
    eval_keys: List[str] = []
    for recs in runs.values():
        for r in recs:
            if r.get("split") and r.get("split") != GOODPUT:
                for k, v in r.items():
                    if k not in SKIP_EVAL and _num(v) is not None and k not in eval_keys:
                        eval_keys.append(k)
    # a multi-player system logs each player's loss as `<player>_loss`: one panel per player after the first loss
    player_keys = sorted(
        {k for recs in runs.values() for r in recs if not r.get("split") for k in r if k.endswith("_loss")}
    )
    train_panels = [(k, title, None) for k, title in TRAIN_PANELS]
    train_panels[1:1] = [(k, f"training {k.replace('_', ' ')}", None) for k in player_keys]
    panels = train_panels + [(k, f"eval {k}", "eval") for k in eval_keys]
    if any(r.get("split") == GOODPUT for recs in runs.values() for r in recs):
        panels.append((GOODPUT, "wall time per attempt", GOODPUT))
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (key, title, kind) in zip(axes.flat, panels):
        if kind == GOODPUT:
            _goodput_panel(ax, runs, names)
            continue
        for w, recs in runs.items():
            if kind is None:
                xs, ys = _series(recs, key, None)
                if xs:
                    ax.plot(xs, ys, label=names[w], linewidth=1.2)
            else:
                for split in sorted({r["split"] for r in recs if r.get("split") and r["split"] != GOODPUT}):
                    xs, ys = _series(recs, key, split)
                    if xs:
                        ax.plot(xs, ys, marker="o", markersize=3, label=f"{names[w]} ({split})")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(", ".join(names[w] for w in workdirs))
    fig.tight_layout()
    if out is None:
        out = paths.join(workdirs[0], "plots", "training.png" if len(workdirs) == 1 else "compare.png")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    paths.atomic_write_bytes(out, buf.getvalue())  # replaces an existing PNG (re-plotting a run)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="xlgen plot", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", action="append", required=True, help="a run directory (repeat to overlay runs)")
    p.add_argument("--out", default=None, help="PNG path (default: WORKDIR/plots/training.png)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if not all(w.strip() for w in args.workdir):
            raise ValueError("--workdir is empty: give a directory path")
        if args.out:  # an existing file that is not an earlier figure is not replaced
            from data_pipelines import output_paths

            output_paths.check_output_file(args.out, "--out")
        out = plot([paths.display(w) for w in args.workdir], args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"xlgen plot: error: {e}", file=sys.stderr)
        return 2
    print(f"plot: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
