"""Planetoid's objective: Algorithm 3 as one loss on one parameter set, the term picked by the step.

Algorithm 3 alternates T1 SGD steps on L_s (batches of N1 labeled nodes) and T2 steps on L_u (batches of N2 context
triples), after `pretrain_steps` steps on L_u alone (the pre-training that initialises the embeddings). Both terms
update the same parameters, so this is a single-player objective (no per-player optimisers): batch s carries a
labeled batch and a context batch, each a pure function of (data.seed, s), and per-row weights from the schedule,

    loss(s) = sum_i sup_w_i (-log p(y_i | x_i, e_i)) / N1 + sum_j ctx_w_j (-log sigma(gamma_j w_c^T e_i)) / N2

with sup_w = 1, ctx_w = 0 on a supervised step and sup_w = 0, ctx_w = data.context_weight on a context step. With
plain SGD (the thesis' optimiser; `optimizer.name=sgd`) a context step is then exactly an SGD step on L_u at
context_weight x the learning rate: the two learning rates the thesis tunes separately. The unused term's gradient
is zero, so a node's table row moves only when its term uses it.

Batches hold both context streams of Algorithm 2: `ctx_*` over every node (-T, -G: transductive, test nodes are in
the graph) and `ictx_*` over the training nodes only (-I: inductive methods train on labeled and unlabeled nodes;
test nodes leave the walk graph and the negatives). The model reads the stream of its variant, so the data stream
does not depend on the model config.

Train batch (N1 = data.supervised_batch_size, N2 = data.context_batch_size, F = features):
    sup_ids [N1] int32, sup_x [N1, F] f32, sup_y [N1] int32, sup_w [N1] f32
    ctx_i, ctx_c [N2] int32, ctx_gamma, ctx_w [N2] f32;  ictx_i, ictx_c [N2] int32, ictx_x [N2, F], ictx_gamma [N2]
Eval batch (split "test", eval_batch_size rows, the last one padded with weight 0):
    ids [B] int32, x [B, F] f32, y [B] int32, w [B] f32
"""

from __future__ import annotations

import functools
import math
from typing import Dict

import jax.numpy as jnp
import numpy as np

from xlgen.models.family import Objective
from xlgen.systems.planetoid import data as data_lib
from xlgen.systems.planetoid import sampler as sampler_lib
from xlgen.systems.planetoid.model import Planetoid, PlanetoidConfig, context_nll, supervised_nll

_DATA_KEYS = ("format", "dir", "name", "labels_per_class", "num_test", "split_seed")


def graph_of(data_config) -> data_lib.Graph:
    """The run's graph (read once per process)."""
    return _graph(tuple(data_config[k] for k in _DATA_KEYS))


@functools.lru_cache(maxsize=4)
def _graph(key) -> data_lib.Graph:
    return data_lib.load(dict(zip(_DATA_KEYS, key)))


def _features(g: data_lib.Graph) -> np.ndarray:
    return np.asarray(g.x.todense(), np.float32)


class PlanetoidPipeline:
    """`batch(step)`: a pure function of (data.seed, step). Split "train": the training batches; any other split:
    the test nodes in `eval_batch_size` chunks (`num_steps` of them)."""

    def __init__(self, data_config, split: str = "train", process_index: int = 0, process_count: int = 1):
        if process_count > 1 and int(data_config.supervised_batch_size) != int(data_config.context_batch_size):
            raise ValueError("multi-process Planetoid runs need data.supervised_batch_size == data.context_batch_size")
        self.cfg = data_config
        self.split = split
        self.graph = g = graph_of(data_config)
        self.features = _features(g)
        if split == "train":
            kw = dict(r1=float(data_config.r1), r2=float(data_config.r2), q=int(data_config.q), d=int(data_config.d))
            labels = g.y[g.labeled]
            self.sampler = sampler_lib.ContextSampler.build(g.adj, g.labeled, labels, **kw)
            train_nodes = np.r_[g.labeled, g.unlabeled]
            self.inductive = sampler_lib.ContextSampler.build(g.adj, g.labeled, labels, nodes=train_nodes, **kw)
            self.global_batch_size = self.local_batch_size = int(data_config.supervised_batch_size)
            self.num_steps = None
        else:
            self.global_batch_size = self.local_batch_size = int(data_config.eval_batch_size)
            self.num_steps = math.ceil(len(g.test) / self.global_batch_size)

    def phase(self, step: int) -> int:
        c = self.cfg
        return sampler_lib.phase(step, int(c.pretrain_steps), int(c.t1), int(c.t2))

    def batch(self, step: int) -> Dict[str, np.ndarray]:
        return self._train_batch(step) if self.split == "train" else self._eval_batch(step)

    def _train_batch(self, step: int) -> Dict[str, np.ndarray]:
        c, seed = self.cfg, int(self.cfg.seed)
        n1, n2 = int(c.supervised_batch_size), int(c.context_batch_size)
        sup = sampler_lib.labeled_batch(self.graph.labeled, seed, step, n1)
        supervised = self.phase(step) == sampler_lib.SUPERVISED
        i, ctx, gamma = self.sampler.batch(seed, step, n2)
        ii, ic, ig = self.inductive.batch(seed + 1, step, n2)
        return {
            "sup_ids": sup.astype(np.int32),
            "sup_x": self.features[sup],
            "sup_y": self.graph.y[sup].astype(np.int32),
            "sup_w": np.full(n1, float(supervised), np.float32),
            "ctx_i": i.astype(np.int32),
            "ctx_c": ctx.astype(np.int32),
            "ctx_gamma": gamma.astype(np.float32),
            "ctx_w": np.full(n2, 0.0 if supervised else float(c.context_weight), np.float32),
            "ictx_i": ii.astype(np.int32),
            "ictx_x": self.features[ii],
            "ictx_c": ic.astype(np.int32),
            "ictx_gamma": ig.astype(np.float32),
        }

    def _eval_batch(self, step: int) -> Dict[str, np.ndarray]:
        b = self.global_batch_size
        ids = self.graph.test[step * b : (step + 1) * b]
        w = np.r_[np.ones(len(ids)), np.zeros(b - len(ids))].astype(np.float32)
        ids = np.r_[ids, np.full(b - len(ids), ids[0] if len(ids) else 0)].astype(np.int64)
        return {"ids": ids.astype(np.int32), "x": self.features[ids], "y": self.graph.y[ids].astype(np.int32), "w": w}


def model_config(config) -> PlanetoidConfig:
    return PlanetoidConfig(**{k: v for k, v in config.model.to_dict().items() if k != "family"})


def make_model(config, rngs, train: bool = True) -> Planetoid:
    cfg = model_config(config)
    g = graph_of(config.data)
    if cfg.variant != "G" and g.x.shape[1] == 0:
        raise ValueError(f"config.model.variant={cfg.variant}: the graph has no node features (use variant G)")
    return Planetoid(cfg, g.num_nodes, g.x.shape[1], g.num_classes, rngs=rngs)


def batch_shapes(config, split: str):
    f = graph_of(config.data).x.shape[1]
    d = config.data
    if split != "train":
        b = int(d.eval_batch_size)
        return {"ids": ((b,), np.int32), "x": ((b, f), np.float32), "y": ((b,), np.int32), "w": ((b,), np.float32)}
    n1, n2 = int(d.supervised_batch_size), int(d.context_batch_size)
    return {
        "sup_ids": ((n1,), np.int32),
        "sup_x": ((n1, f), np.float32),
        "sup_y": ((n1,), np.int32),
        "sup_w": ((n1,), np.float32),
        "ctx_i": ((n2,), np.int32),
        "ctx_c": ((n2,), np.int32),
        "ctx_gamma": ((n2,), np.float32),
        "ctx_w": ((n2,), np.float32),
        "ictx_i": ((n2,), np.int32),
        "ictx_x": ((n2, f), np.float32),
        "ictx_c": ((n2,), np.int32),
        "ictx_gamma": ((n2,), np.float32),
    }


def loss(model: Planetoid, batch, mems, rng, config):
    """(weighted L_s + L_u of the step, metrics, None): module docstring."""
    nll, correct = supervised_nll(model, batch["sup_ids"], batch["sup_x"], batch["sup_y"])
    p = "ictx_" if model.cfg.variant == "I" else "ctx_"
    x = batch["ictx_x"] if p == "ictx_" else None
    ctx = context_nll(model, batch[p + "i"], x, batch[p + "c"], batch[p + "gamma"])
    total = jnp.mean(batch["sup_w"] * nll) + jnp.mean(batch["ctx_w"] * ctx)
    metrics = {"supervised_loss": nll.mean(), "context_loss": ctx.mean(), "train_accuracy": correct.mean()}
    return total, metrics, None


def eval_loss(model: Planetoid, batch, mems, config):
    """(number of correct test nodes, number of test nodes, None): the mean is the accuracy."""
    _, correct = supervised_nll(model, batch["ids"], batch["x"], batch["y"])
    return jnp.sum(batch["w"] * correct), jnp.sum(batch["w"]), None


OBJECTIVE = Objective(
    name="planetoid",
    make_model=make_model,
    batch_shapes=batch_shapes,
    loss=loss,
    eval_loss=eval_loss,
    pipeline=PlanetoidPipeline,
    eval_metrics=lambda mean, config: {"accuracy": mean},
    tokens_per_step=lambda config: int(config.data.supervised_batch_size) + int(config.data.context_batch_size),
)
