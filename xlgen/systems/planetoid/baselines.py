"""The baselines of Table 3.6 that are cheap here, each -> accuracy on the graph's test nodes.

feat             Feat: a linear softmax on the features x of the labeled nodes (scikit-learn's multinomial
                 LogisticRegression), no graph                                               (inductive)
label_propagation  LP (Zhu & Ghahramani): labels spread over the graph, clamped on the labeled nodes
                 (scikit-learn's LabelPropagation with the graph as its kernel; a self-loop per node keeps
                 isolated nodes defined)                                                    (transductive)
graph_embedding  GraphEmb (DeepWalk, "adapted to our Skipgram implementation" as the thesis did): node
                 embeddings trained on eq. 3.12 with graph contexts only (Planetoid-G's context step with
                 r2 = 1 and no supervised step), then a linear softmax on the labeled nodes' embeddings
                                                                                            (transductive)
"""

from __future__ import annotations

import tempfile

import numpy as np
import scipy.sparse as sp

from xlgen.systems.planetoid import data as data_lib


def _logreg(train_x, train_y, test_x, seed: int):
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=2000, random_state=seed)
    return clf.fit(train_x, train_y).predict(test_x)


def feat(g: data_lib.Graph, seed: int = 0) -> float:
    if g.x.shape[1] == 0:
        raise ValueError("Feat needs node features; the graph has none")
    pred = _logreg(g.x[g.labeled], g.y[g.labeled], g.x[g.test], seed)
    return float(np.mean(pred == g.y[g.test]))


def propagate(adj: sp.spmatrix, labeled: np.ndarray, labels: np.ndarray, max_iter: int = 1000) -> np.ndarray:
    """Label propagation: predicted class of every node (labeled nodes keep their labels)."""
    from sklearn.semi_supervised import LabelPropagation

    n = adj.shape[0]
    w = sp.csr_matrix(adj, dtype=np.float64) + sp.identity(n, format="csr")

    def kernel(a, b):  # rows/cols are node ids carried in the one-column "feature" matrix
        return w[a[:, 0].astype(np.int64)][:, b[:, 0].astype(np.int64)].tocsr()

    y = np.full(n, -1, np.int64)
    y[labeled] = labels
    lp = LabelPropagation(kernel=kernel, max_iter=max_iter, tol=1e-6)
    return lp.fit(np.arange(n, dtype=np.float64)[:, None], y).transduction_


def label_propagation(g: data_lib.Graph) -> float:
    pred = propagate(g.adj, g.labeled, g.y[g.labeled])
    return float(np.mean(pred[g.test] == g.y[g.test]))


def graph_embedding(config, seed: int = 0) -> float:
    """GraphEmb on the graph named by `config` (a Planetoid config): `config.total_steps` context steps with graph
    contexts only (the same trainer, loop and checkpoints as Planetoid), then logistic regression on the
    embeddings of the labeled nodes."""
    from xlgen.systems.planetoid import objective
    from xlgen.train import loop
    from xlgen.train.workdir_model import restore_params

    c = config.copy_and_resolve_references()
    c.model.variant = "G"
    c.data.r2 = 1.0
    c.data.pretrain_steps = int(c.total_steps)  # every step a context step
    c.seed = seed
    with tempfile.TemporaryDirectory() as wd:
        loop.train(c, wd)
        _, program, params, _ = restore_params(wd)
    g = objective.graph_of(c.data)
    emb = np.asarray(program.make_model(params, train=False).embed(np.arange(g.num_nodes), None))
    pred = _logreg(emb[g.labeled], g.y[g.labeled], emb[g.test], seed)
    return float(np.mean(pred == g.y[g.test]))
