"""`xlgen analyze compare`: a multi-seed comparison of runs, mean ± std per group and the two-sided Wilcoxon
rank-sum test of every group against a baseline (seed 001 §4.3.5: 11 seeds per head, the p-value over the 10
random seeds; Tables 4.8/4.9, 5.17, 5.18).

A group is a set of runs of one configuration with different seeds: workdirs (the metric is read from the last
evaluation record of each `metrics.jsonl`, or from a JSON file's key), or numbers given directly. std is the sample
standard deviation (ddof = 1), as the thesis's "mean ± SD" over seeds; the test is `scipy.stats.ranksums`
(normal approximation of the rank-sum statistic, two-sided, no tie correction), the test the thesis names.

    xlgen analyze compare --group=softmax=W1,W2,W3 --group=mos=W4,W5,W6 [--metric=loss] [--baseline=softmax]
                          [--values=thesis_softmax=57.08,57.10] [--json=FILE] [--png=FILE]

`--metric`: a key of the eval record (`loss`, `ppl`, `bpc`, ...), or `FILE.json:KEY` to read KEY from
`<workdir>/FILE.json` (e.g. `rank.json:rank` written by `xlgen analyze rank --json`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from xlgen.analyze.common import fail, save_figure, tool_parser, write_json


def summarize(values: Sequence[float]) -> Dict:
    """{"n", "mean", "std" (ddof 1; 0 for one value), "values"}."""
    v = np.asarray(values, np.float64)
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "values": [float(x) for x in v],
    }


def rank_sum_test(x: Sequence[float], y: Sequence[float]) -> Dict[str, float]:
    """Two-sided Wilcoxon rank-sum test (`scipy.stats.ranksums`): {"statistic", "p_value"}."""
    from scipy import stats

    r = stats.ranksums(np.asarray(x, np.float64), np.asarray(y, np.float64))
    return {"statistic": float(r.statistic), "p_value": float(r.pvalue)}


def compare(groups: Dict[str, Sequence[float]], baseline: str = "") -> Dict:
    """{"baseline", "groups": {name: summary}, "rank_sum": {name: test against the baseline}}."""
    if not groups:
        raise ValueError("no groups to compare")
    baseline = baseline or next(iter(groups))
    if baseline not in groups:
        raise ValueError(f"--baseline={baseline!r}: not one of the groups {list(groups)}")
    out = {"baseline": baseline, "groups": {k: summarize(v) for k, v in groups.items()}, "rank_sum": {}}
    for name, v in groups.items():
        if name != baseline:
            out["rank_sum"][name] = rank_sum_test(v, groups[baseline])
    return out


def read_metric(workdir: str, metric: str) -> float:
    """The metric of a run: KEY of the last eval record in metrics.jsonl, or FILE.json:KEY."""
    if ":" in metric:
        name, key = metric.split(":", 1)
        path = os.path.join(workdir, name)
        with open(path) as f:
            rec = json.load(f)
        if key not in rec:
            raise KeyError(f"{path}: no key {key!r}")
        return float(rec[key])
    path = os.path.join(workdir, "metrics.jsonl")
    last = None
    with open(path) as f:
        for line in f:
            if '"split"' in line:
                rec = json.loads(line)
                if metric in rec:
                    last = rec
    if last is None:
        raise KeyError(f"{path}: no evaluation record with {metric!r}")
    return float(last[metric])


def plot(path: str, result: Dict, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["groups"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(names), 4))
    for i, name in enumerate(names):
        g = result["groups"][name]
        v = np.asarray(g["values"])
        ax.scatter(np.full(v.size, i) + np.linspace(-0.12, 0.12, v.size), v, s=14, alpha=0.7)
        ax.errorbar(i + 0.3, g["mean"], yerr=g["std"], fmt="o", color="k", capsize=4)
        p = result["rank_sum"].get(name, {}).get("p_value")
        if p is not None:
            ax.annotate(f"p={p:.2g}", (i, v.max()), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(metric)
    ax.set_title(f"mean ± std over seeds; Wilcoxon rank-sum vs {result['baseline']}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _split(spec: str, what: str):
    if "=" not in spec:
        raise ValueError(f"--{what}={spec!r}: expected NAME=ITEM,ITEM,...")
    name, items = spec.split("=", 1)
    return name, [x for x in items.split(",") if x]


def main(argv: Optional[List[str]] = None) -> int:
    p = tool_parser("compare", __doc__, png="each group's values, mean and std", platform=False)
    p.add_argument("--group", action="append", default=[], help="NAME=WORKDIR,WORKDIR,... (one run per seed)")
    p.add_argument("--values", action="append", default=[], help="NAME=X,X,... (numbers given directly)")
    p.add_argument("--metric", default="loss", help="eval-record key, or FILE.json:KEY inside each workdir")
    p.add_argument("--baseline", default="", help="group the others are tested against (default: the first)")
    args = p.parse_args(argv)
    groups: Dict[str, List[float]] = {}
    try:
        for spec in args.group:
            name, dirs = _split(spec, "group")
            groups[name] = [read_metric(d, args.metric) for d in dirs]
        for spec in args.values:
            name, items = _split(spec, "values")
            try:
                groups[name] = [float(x) for x in items]
            except ValueError:
                raise ValueError(f"--values={spec!r}: not numbers") from None
        result = compare(groups, args.baseline)
    except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError) as e:
        return fail("compare", e)
    result["metric"] = args.metric
    for name, g in result["groups"].items():
        test = result["rank_sum"].get(name)
        tail = f"  rank-sum p = {test['p_value']:.3g} vs {result['baseline']}" if test else "  (baseline)"
        print(f"{name}: {g['mean']:.4f} ± {g['std']:.4f} (n = {g['n']}){tail}")
    if args.json:
        write_json(args.json, result)
    if args.png:
        plot(args.png, result, args.metric)
        print(f"png: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
