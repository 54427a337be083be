"""Planetoid's training objective: Algorithm 3 as one loss on one parameter set whose term is picked by the step.

Algorithm 3 alternates T1 SGD steps on L_s (batches of N1 labeled nodes) and T2 steps on L_u (batches of N2 context
triples), after `pretrain_steps` steps on L_u alone. Both terms update the same parameters, so this is a
single-player objective: batch s carries both a labeled batch and a context batch (each a pure function of seed and
s) and `phase` = SUPERVISED or CONTEXT from the schedule; the loss is the phase's term and the learning rate the
phase's rate (`sup_learning_rate`, `ctx_learning_rate`: the thesis tunes the two steps separately). With plain SGD
(the thesis' optimiser, the default) this is exactly Algorithm 3; the unused term's gradient is zero, so a sparse
embedding row moves only when its term uses it. No multi-player machinery (separate optimisers per player) is needed.

Batch layout (N1 = data.supervised_batch_size, N2 = data.context_batch_size, F = features):
    sup_ids [N1] int32, sup_x [N1, F] f32, sup_y [N1] int32
    ctx_i [N2] int32, ctx_x [N2, F] f32 (rows of i; -I only, else [N2, 0]), ctx_c [N2] int32, ctx_gamma [N2] f32
    phase [] int32
"""

from __future__ import annotations

from typing import Dict

import jax.numpy as jnp
import numpy as np

from xlgen.systems.planetoid import data as data_lib
from xlgen.systems.planetoid import sampler as sampler_lib
from xlgen.systems.planetoid.model import Planetoid, context_loss, supervised_loss


class PlanetoidPipeline:
    """Batches of one run: `batch(step)` is a pure function of (data.seed, step)."""

    def __init__(self, graph: data_lib.Graph, data_config, variant: str):
        self.graph = graph
        self.cfg = data_config
        self.variant = variant
        # -I is trained on labeled and unlabeled nodes only: test nodes leave the walk graph and the negatives
        nodes = np.r_[graph.labeled, graph.unlabeled] if variant == "I" else None
        self.sampler = sampler_lib.ContextSampler.build(
            graph.adj,
            graph.labeled,
            graph.y[graph.labeled],
            nodes=nodes,
            r1=float(data_config.r1),
            r2=float(data_config.r2),
            q=int(data_config.q),
            d=int(data_config.d),
        )
        self.features = (
            np.asarray(graph.x.todense(), np.float32) if variant != "G" else np.zeros((graph.num_nodes, 0), np.float32)
        )

    def phase(self, step: int) -> int:
        c = self.cfg
        return sampler_lib.phase(step, int(c.pretrain_steps), int(c.t1), int(c.t2))

    def batch(self, step: int) -> Dict[str, np.ndarray]:
        c, seed = self.cfg, int(self.cfg.seed)
        sup = sampler_lib.labeled_batch(self.graph.labeled, seed, step, int(c.supervised_batch_size))
        i, ctx, gamma = self.sampler.batch(seed, step, int(c.context_batch_size))
        ctx_x = self.features[i] if self.variant == "I" else np.zeros((len(i), 0), np.float32)
        return {
            "sup_ids": sup.astype(np.int32),
            "sup_x": self.features[sup],
            "sup_y": self.graph.y[sup].astype(np.int32),
            "ctx_i": i.astype(np.int32),
            "ctx_x": ctx_x,
            "ctx_c": ctx.astype(np.int32),
            "ctx_gamma": gamma.astype(np.float32),
            "phase": np.asarray(self.phase(step), np.int32),
        }

    def eval_batch(self, ids: np.ndarray) -> Dict[str, np.ndarray]:
        return {"ids": ids.astype(np.int32), "x": self.features[ids], "y": self.graph.y[ids].astype(np.int32)}


def loss(model: Planetoid, batch):
    """(the phase's term, metrics): L_s on SUPERVISED steps, L_u (eq. 3.12) on CONTEXT steps."""
    l_s, acc = supervised_loss(model, batch["sup_ids"], batch["sup_x"], batch["sup_y"])
    l_u = context_loss(model, batch["ctx_i"], batch["ctx_x"], batch["ctx_c"], batch["ctx_gamma"])
    sup = (batch["phase"] == sampler_lib.SUPERVISED).astype(jnp.float32)
    total = sup * l_s + (1.0 - sup) * l_u
    return total, {"supervised_loss": l_s, "context_loss": l_u, "train_accuracy": acc, "phase": batch["phase"]}


def learning_rate(optimizer_config, pipeline: PlanetoidPipeline):
    """Step -> the phase's learning rate (an optax schedule: optax passes the update count, equal to the step)."""
    import jax

    sup_lr, ctx_lr = float(optimizer_config.sup_learning_rate), float(optimizer_config.ctx_learning_rate)
    c = pipeline.cfg
    pre, t1, t2 = int(c.pretrain_steps), int(c.t1), int(c.t2)

    def schedule(count):
        after = count - pre
        sup = (count >= pre) & (jax.numpy.mod(after, t1 + t2) < t1)
        return jnp.where(sup, sup_lr, ctx_lr)

    return schedule
