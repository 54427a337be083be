"""Planetoid runs: train (resuming from the workdir's latest checkpoint) and evaluate (accuracy on the test nodes).

train(config, workdir)     config.json, metrics.jsonl, checkpoints/ (Orbax via xlgen/checkpointing.py)
evaluate(config, workdir)  eval_results.json {"accuracy", "num_test", "step", "variant"} and embeddings.png
                           (2-D t-SNE or PCA of the test nodes' embeddings e, coloured by class)
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from data_pipelines import paths
from xlgen import config as config_lib
from xlgen.checkpointing import Checkpointer
from xlgen.systems.planetoid import data as data_lib
from xlgen.systems.planetoid import objective
from xlgen.systems.planetoid.model import Planetoid, PlanetoidConfig

log = logging.getLogger("xlgen")


def model_config(config, graph: data_lib.Graph) -> PlanetoidConfig:
    m = config.model
    return PlanetoidConfig(
        variant=m.variant,
        num_nodes=graph.num_nodes,
        num_features=graph.x.shape[1] if m.variant != "G" else 0,
        num_classes=graph.num_classes,
        embedding_dim=int(m.embedding_dim),
        feature_hidden=int(m.feature_hidden),
        embedding_hidden=int(m.embedding_hidden),
    )


NODE_TABLES = ("embedding", "context")  # the per-node tables e and w_c


def _optimizer(config, pipeline, params):
    """SGD (or Adam) at the phase's learning rate; the per-node tables e and w_c at `node_lr_multiplier` times it.
    A mean over N rows gives each table row 1/N of a per-example step (word2vec's SGD is per pair), so the tables
    need a larger rate than the shared dense layers, which every example moves."""
    lr = objective.learning_rate(config.optimizer, pipeline)
    name = config.optimizer.name
    if name not in ("sgd", "adam"):
        raise ValueError(f"config.optimizer.name={name!r}: expected 'sgd' or 'adam'")
    base = optax.sgd(lr) if name == "sgd" else optax.adam(lr)
    mask = jax.tree_util.tree_map_with_path(
        lambda path, _: any(getattr(k, "key", None) in NODE_TABLES for k in path), params
    )
    return optax.chain(optax.masked(optax.scale(float(config.optimizer.node_lr_multiplier)), mask), base)


class Run:
    """The pieces of one run: graph, pipeline, model definition, optimiser, jitted step."""

    def __init__(self, config):
        self.config = config
        if config.model.variant not in ("T", "I", "G"):
            raise ValueError(f"config.model.variant={config.model.variant!r}: expected 'T', 'I' or 'G'")
        self.graph = data_lib.load(config.data)
        if config.model.variant != "G" and self.graph.x.shape[1] == 0:
            raise ValueError(f"config.model.variant={config.model.variant}: the graph has no features (use G)")
        self.pipeline = objective.PlanetoidPipeline(self.graph, config.data, config.model.variant)
        self.cfg = model_config(config, self.graph)

    def init(self):
        model = Planetoid(self.cfg, rngs=nnx.Rngs(int(self.config.seed)))
        graphdef, params = nnx.split(model, nnx.Param)
        self.tx = _optimizer(self.config, self.pipeline, params)
        return graphdef, {"params": params, "opt": self.tx.init(params)}

    def make_step(self, graphdef):
        tx = self.tx

        @jax.jit
        def step(state, batch):
            def f(params):
                return objective.loss(nnx.merge(graphdef, params), batch)

            (l, metrics), grads = jax.value_and_grad(f, has_aux=True)(state["params"])
            updates, opt = tx.update(grads, state["opt"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, dict(metrics, loss=l)

        return step


def _checkpointer(workdir: str, config) -> Checkpointer:
    return Checkpointer(paths.join(workdir, "checkpoints"), keep=int(config.checkpoint.keep), async_save=False)


def train(config, workdir: str, stop_at: Optional[int] = None) -> Dict[str, Any]:
    run = Run(config)
    paths.makedirs(workdir)
    config_lib.write_resolved_config(config, workdir, kind="planetoid")
    graphdef, state = run.init()
    ckpt = _checkpointer(workdir, config)
    start = 0
    restored = ckpt.restore_latest(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state), None)
    if restored is not None:
        state, _, _, start = restored
        log.info("resumed from step %d", start)
    step_fn = run.make_step(graphdef)
    total = int(config.total_steps)
    end = min(total, stop_at) if stop_at is not None else total
    metrics_path = paths.join(workdir, "metrics.jsonl")
    lines = []
    t0 = time.time()
    for s in range(start, end):
        state, m = step_fn(state, run.pipeline.batch(s))
        if (s + 1) % int(config.log_every_steps) == 0 or s + 1 == end:
            rec = {k: float(v) for k, v in jax.device_get(m).items()}
            rec.update(step=s + 1, learning_rate=float(objective.learning_rate(config.optimizer, run.pipeline)(s)))
            rec["tokens_per_sec"] = (
                (s + 1 - start) * (run.pipeline.cfg.supervised_batch_size) / max(time.time() - t0, 1e-9)
            )
            lines.append(json.dumps(rec))
        if (s + 1) % int(config.checkpoint.every_steps) == 0 and s + 1 < end:
            ckpt.save(s + 1, state, None, {"step": s + 1})
    if end > start:
        ckpt.save(end, state, None, {"step": end})
    ckpt.close()
    if lines:
        old = paths.read_text(metrics_path) if paths.as_path(metrics_path).exists() else ""
        paths.atomic_write_text(metrics_path, old + "\n".join(lines) + "\n")
    return {"workdir": paths.display(workdir), "step": end}


def restore(config, workdir: str):
    """(run, model, step) of the latest checkpoint of `workdir` (config None: the workdir's config.json)."""
    if config is None:
        config = config_lib.read_workdir_config(workdir)
        if config is None:
            raise FileNotFoundError(f"{workdir}: no config.json (not an xlgen workdir)")
    run = Run(config)
    graphdef, state = run.init()
    ckpt = _checkpointer(workdir, config)
    restored = ckpt.restore_latest(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state), None)
    ckpt.close()
    if restored is None:
        raise FileNotFoundError(f"{workdir}/checkpoints: no checkpoint to evaluate")
    state, _, _, step = restored
    return run, nnx.merge(graphdef, state["params"]), int(step)


def evaluate(config, workdir: str, *, plot: bool = True) -> Dict[str, Any]:
    """Accuracy of the latest checkpoint on the test nodes -> eval_results.json (and embeddings.png)."""
    run, model, step = restore(config, workdir)
    config = run.config
    b = run.pipeline.eval_batch(run.graph.test)
    logits = jax.jit(lambda m, i, x: m(i, x))(model, b["ids"], b["x"])
    acc = float(jnp.mean(jnp.argmax(logits, -1) == b["y"]))
    out = {"accuracy": acc, "num_test": int(len(b["ids"])), "step": int(step), "variant": config.model.variant}
    paths.write_json_atomic(paths.join(workdir, "eval_results.json"), out)
    if plot:
        emb = np.asarray(model.embed(b["ids"], b["x"]))
        plot_embeddings(
            emb,
            b["y"],
            paths.join(workdir, "embeddings.png"),
            config.eval.projection,
            f"Planetoid-{config.model.variant}: test-node embeddings (accuracy {acc:.3f})",
        )
    return out


def plot_embeddings(emb: np.ndarray, y: np.ndarray, path: str, projection: str, title: str) -> None:
    """A 2-D projection (t-SNE as the thesis' Fig. 3.11, or PCA) of embeddings, one colour per class."""
    import io

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
