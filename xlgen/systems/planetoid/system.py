"""Planetoid's registry record (`xlgen.registry.SYSTEMS["planetoid"]`) and its evaluation outputs.

`xlgen eval --workdir=W` writes W/eval_results.json ({"accuracy", "num_test", "step", "variant"}: accuracy on the
test nodes) and W/eval/embeddings.png (a 2-D t-SNE, as the thesis' Fig. 3.11, or PCA of the test nodes' embeddings e,
coloured by class; `config.eval.projection`).
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from data_pipelines import paths
from xlgen.models.family import Family
from xlgen.systems.planetoid import objective
from xlgen.systems.planetoid.model import Planetoid, PlanetoidConfig
from xlgen.train.report import Reporting


def evaluate(config, program, state, out_dir: str, full: bool):
    """{"accuracy", "num_test", "variant"} of the test nodes (`xlgen eval` writes them to eval_results.json); with
    `full`, also out_dir/embeddings.png."""
    g = objective.graph_of(config.data)
    x = objective._features(g)[g.test]
    model = program.make_model(state["params"], train=False)
    logits = np.asarray(model(g.test, x))
    acc = float(np.mean(logits.argmax(-1) == g.y[g.test]))
    if full:
        paths.makedirs(out_dir)
        emb = np.asarray(model.embed(g.test, x))
        title = f"Planetoid-{config.model.variant}: test-node embeddings (accuracy {acc:.3f})"
        plot_embeddings(emb, g.y[g.test], paths.join(out_dir, "embeddings.png"), config.eval.projection, title)
    return {"accuracy": acc, "num_test": int(len(g.test)), "variant": config.model.variant}


def plot_embeddings(emb: np.ndarray, y: np.ndarray, path: str, projection: str, title: str) -> None:
    """A 2-D projection (t-SNE or PCA) of embeddings [n, d], one colour per class y [n]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    if projection == "tsne":
        xy = TSNE(2, init="pca", random_state=0, perplexity=min(30.0, (len(emb) - 1) / 3)).fit_transform(emb)
    elif projection == "pca":
        xy = PCA(2).fit_transform(emb)
    else:
        raise ValueError(f"config.eval.projection={projection!r}: expected 'tsne' or 'pca'")
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(xy[:, 0], xy[:, 1], c=y, cmap="tab10", s=6)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    paths.atomic_write_bytes(path, buf.getvalue())


FAMILY = Family(
    name="planetoid",
    config_class=PlanetoidConfig,
    default_objective="planetoid",
    models={"planetoid": Planetoid},
    objectives={"planetoid": dataclasses.replace(objective.OBJECTIVE, evaluate=evaluate)},
    # a step: N1 labeled nodes + N2 context pairs; SGD with config.optimizer; no language-model objective options
    records=(Reporting(unit="examples", unused_keys=("objective_options",)),),
)
