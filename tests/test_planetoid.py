"""Planetoid (thesis §3.3): Algorithm 2's sampler against its definition, eq. 3.12 and the supervised loss by hand,
Planetoid's release format and the edge-list format on generated fixtures, label propagation on a hand-solved graph,
Algorithm 3's schedule, exact resume."""

import collections
import json
import math
import os
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from xlgen import cli
from xlgen.systems.planetoid import baselines
from xlgen.systems.planetoid import data as data_lib
from xlgen.systems.planetoid import sampler as S
from xlgen.systems.planetoid.model import Planetoid, PlanetoidConfig, context_loss, supervised_loss
from xlgen.train.workdir_model import restore_params

# a 6-node weighted graph with a dangling-free walk, labels on 4 nodes (classes 0, 0, 1, 2)
EDGES = [(0, 1, 1.0), (1, 2, 2.0), (2, 3, 1.0), (3, 0, 3.0), (3, 4, 1.0), (4, 5, 1.0), (5, 1, 0.5)]
N = 6


def _adj():
    r, c, w = zip(*EDGES)
    return data_lib.symmetric_adjacency(r, c, w, N)


def _sampler(**kw):
    return S.ContextSampler.build(_adj(), np.array([0, 1, 3, 5]), np.array([0, 0, 1, 2]), **kw)


def test_window_pairs():
    p = S.window_pairs(10, 3)
    assert len(p) == 34  # offsets +-1 (9 each way) and +-2 (8 each way)
    assert set(np.abs(p[:, 0] - p[:, 1])) == {1, 2}


def _exact_graph_pairs(adj, q, d):
    """P(i, c) of a positive graph context: uniform start, walk matrix P, uniform over the window pairs."""
    a = adj.toarray()
    P = a / a.sum(1, keepdims=True)
    marg = [np.full(N, 1 / N)]
    for _ in range(q):
        marg.append(marg[-1] @ P)
    out = np.zeros((N, N))
    pairs = S.window_pairs(q, d)
    for j, k in pairs:
        lo, hi = min(j, k), max(j, k)
        joint = marg[lo][:, None] * np.linalg.matrix_power(P, hi - lo)  # P(S_lo = a, S_hi = b)
        out += joint if j < k else joint.T
    return out / len(pairs)


def _both_labeled(i, c):
    lab = np.isin(np.arange(N), [0, 1, 3, 5])
    return lab[i] & lab[c]


def test_sampler_graph_contexts():
    n = 200_000
    i, c, gamma = _sampler(r1=5 / 6, r2=1.0, q=5, d=3).sample(n, np.random.default_rng(0))
    assert abs((gamma > 0).mean() - 5 / 6) < 4 * math.sqrt(5 / 36 / n)
    pos = gamma > 0
    emp = np.zeros((N, N))
    np.add.at(emp, (i[pos], c[pos]), 1 / pos.sum())
    assert np.abs(emp - _exact_graph_pairs(_adj(), 5, 3)).sum() < 0.02  # 2 x total variation
    # negatives: i as a positive's i (the walk marginal), c uniform over the nodes
    assert np.abs(np.bincount(c[~pos], minlength=N) / (~pos).sum() - 1 / N).max() < 0.01
    want_i = _exact_graph_pairs(_adj(), 5, 3).sum(1)
    assert np.abs(np.bincount(i[~pos], minlength=N) / (~pos).sum() - want_i).max() < 0.01


def test_sampler_label_contexts_and_mixture():
    n = 200_000
    labeled = {0: 0, 1: 0, 3: 1, 5: 2}
    i, c, gamma = _sampler(r1=0.5, r2=0.0).sample(n, np.random.default_rng(1))
    pos = collections.Counter(zip(i[gamma > 0], c[gamma > 0]))
    neg = collections.Counter(zip(i[gamma < 0], c[gamma < 0]))
    assert set(pos) == {(0, 1), (1, 0)}  # the only same-label pairs of distinct nodes
    assert set(neg) == {(a, b) for a in labeled for b in labeled if labeled[a] != labeled[b]}  # 10 ordered pairs
    for counts in (pos, neg):  # each uniform over its pair set
        f = np.array(list(counts.values())) / sum(counts.values())
        assert np.abs(f - 1 / len(counts)).max() < 0.01
    # r2 = 0.7: P(both labeled) = 0.7 P_graph(both labeled) + 0.3
    gi, gc, _ = _sampler(r2=1.0).sample(n, np.random.default_rng(2))
    mi, mc, _ = _sampler(r2=0.7).sample(n, np.random.default_rng(3))
    assert abs(_both_labeled(mi, mc).mean() - (0.7 * _both_labeled(gi, gc).mean() + 0.3)) < 0.01


def test_sampler_restricted_nodes_and_purity():
    s = _sampler(r1=0.5, r2=0.8, q=10, d=3, nodes=np.array([0, 1, 2, 3, 5]))  # node 4 held out (as -I's test nodes)
    i, c, _ = s.batch(7, 11, 5000)
    assert 4 not in set(i) | set(c)
    a, b = s.batch(7, 11, 300), s.batch(7, 11, 300)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(s.batch(7, 12, 300)[0], a[0])


def test_sampler_without_edges_stays_put():
    # -I on a graph whose training nodes share no edge (karate with 2 labels per class): walks stay at their start
    s = _sampler(r2=1.0, nodes=np.array([0, 2, 4]))  # no edge among 0, 2, 4
    i, c, gamma = s.sample(500, np.random.default_rng(0))
    assert set(i) <= {0, 2, 4} and np.all(c[gamma > 0] == i[gamma > 0])


def test_labeled_batches_are_epochs():
    labeled = np.arange(10, 30)
    seen = np.concatenate([S.labeled_batch(labeled, 3, s, 8) for s in range(5)])  # 40 = two passes
    assert sorted(seen[:20]) == list(labeled) and sorted(seen[20:]) == list(labeled)
    assert np.array_equal(S.labeled_batch(labeled, 3, 2, 8), seen[16:24])


def test_schedule():
    got = [S.phase(s, 3, 2, 1) for s in range(9)]
    assert got == [S.CONTEXT] * 3 + [S.SUPERVISED, S.SUPERVISED, S.CONTEXT] * 2


def _tiny_model(variant="G", classes=2):
    import jax.numpy as jnp
    from flax import nnx

    cfg = PlanetoidConfig(variant, embedding_dim=2, embedding_hidden=2, node_lr_multiplier=1.0)
    m = Planetoid(cfg, num_nodes=3, num_features=0, num_classes=classes, rngs=nnx.Rngs(0))
    m.embedding[...] = jnp.array([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    m.context[...] = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    m.embedding_layer.kernel[...] = jnp.eye(2)
    m.embedding_layer.bias[...] = jnp.zeros(2)
    m.out.kernel[...] = jnp.eye(2)
    m.out.bias[...] = jnp.zeros(2)
    return m


def test_context_loss_by_hand():
    import jax.numpy as jnp

    m = _tiny_model()
    # (i=0, c=0, +1): w.e = 2 -> -log s(2);  (i=1, c=1, -1): w.e = 1 -> -log s(-1)
    got = context_loss(m, jnp.array([0, 1]), None, jnp.array([0, 1]), jnp.array([1.0, -1.0]))
    want = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))) / 2
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_supervised_loss_by_hand():
    import jax.numpy as jnp

    m = _tiny_model()
    # logits = relu(e): node 2 -> [2, 0] with y = 0: log(1 + e^-2); node 1 -> [1, 1] with y = 1: log 2
    loss, acc = supervised_loss(m, jnp.array([2, 1]), None, jnp.array([0, 1]))
    assert float(loss) == pytest.approx((math.log1p(math.exp(-2.0)) + math.log(2.0)) / 2, rel=1e-6)
    assert float(acc) == pytest.approx(0.5)  # ties resolve to class 0


def test_scale_gradient_and_step_weights():
    import jax
    import jax.numpy as jnp

    from xlgen.systems.planetoid import objective
    from xlgen.systems.planetoid.model import scale_gradient

    x = jnp.array([0.3, -1.2])
    y, g = jax.value_and_grad(lambda v: jnp.sum(scale_gradient(v, 7.0) ** 2))(x)
    assert float(y) == pytest.approx(float(jnp.sum(x**2)))
    np.testing.assert_allclose(np.asarray(g), 7.0 * 2 * np.asarray(x), rtol=1e-6)
    # a supervised step (sup_w 1, ctx_w 0) leaves w_c untouched; a context step leaves the output layer untouched
    from flax import nnx

    m = _tiny_model()
    batch = {
        "sup_ids": jnp.array([2, 1]),
        "sup_x": None,
        "sup_y": jnp.array([0, 1]),
        "ctx_i": jnp.array([0, 1]),
        "ctx_c": jnp.array([0, 1]),
        "ctx_gamma": jnp.array([1.0, -1.0]),
    }

    def grads(sw, cw):
        b = dict(batch, sup_w=jnp.full(2, sw), ctx_w=jnp.full(2, cw))
        gd, params = nnx.split(m, nnx.Param)
        return jax.grad(lambda p: objective.loss(nnx.merge(gd, p), b, None, None, None)[0])(params)

    sup, ctx = grads(1.0, 0.0), grads(0.0, 3.0)
    assert not np.any(np.asarray(sup["context"][...])) and np.any(np.asarray(sup["out"]["kernel"][...]))
    assert not np.any(np.asarray(ctx["out"]["kernel"][...])) and np.any(np.asarray(ctx["context"][...]))


def _release_fixture(d):
    """A Citeseer-like release: 3 classes, 4 labeled + 3 unlabeled allx rows, 3 test rows listed out of order, and
    graph node 10 with no feature row (an isolated Citeseer node)."""
    F = 4
    rng = np.random.default_rng(0)
    allx = sp.csr_matrix(rng.random((7, F)).round(2))
    tx = sp.csr_matrix(rng.random((3, F)).round(2))
    ally = np.eye(3)[[0, 1, 2, 0, 1, 2, 0]]
    ty = np.eye(3)[[2, 1, 0]]
    graph = collections.defaultdict(list, {0: [1, 9], 1: [0], 2: [8], 7: [8], 8: [2, 7], 9: [0], 10: []})
    parts = dict(x=allx[:4], y=ally[:4], allx=allx, ally=ally, tx=tx, ty=ty, graph=graph)
    for k, v in parts.items():
        with open(f"{d}/ind.fx.{k}", "wb") as f:
            pickle.dump(v, f, protocol=2)
    with open(f"{d}/ind.fx.test.index", "w") as f:
        f.write("9\n7\n8\n")
    return allx, tx


def test_release_reader(tmp_path):
    allx, tx = _release_fixture(tmp_path)
    g = data_lib.read_release(str(tmp_path), "fx")
    assert g.num_nodes == 11 and g.num_classes == 3
    assert list(g.labeled) == [0, 1, 2, 3] and list(g.test) == [9, 7, 8]
    np.testing.assert_allclose(g.x[:7].toarray(), allx.toarray())
    np.testing.assert_allclose(g.x[[9, 7, 8]].toarray(), tx.toarray())  # tx row k is node test.index[k]
    assert list(g.y) == [0, 1, 2, 0, 1, 2, 0, 1, 0, 2, -1]
    a = g.adj.toarray()
    assert (a == a.T).all() and a[0, 9] == 1 and a[8, 2] == 1 and a.sum() == 8  # 4 undirected edges
    assert g.x[10].nnz == 0
    assert list(g.unlabeled) == [4, 5, 6, 10]


def test_release_roundtrip_and_errors(tmp_path):
    g = data_lib.digits_knn_graph(k=5, labels_per_class=3, num_test=50, seed=0)
    data_lib.write_release(str(tmp_path), "d", g)
    h = data_lib.read_release(str(tmp_path), "d")
    order = np.r_[g.labeled, g.unlabeled, g.test]
    assert (h.adj != g.adj[order][:, order]).nnz == 0
    assert np.array_equal(h.y, g.y[order]) and len(h.labeled) == 30 and len(h.test) == 50
    (tmp_path / "ind.d.ty").unlink()
    with pytest.raises(data_lib.DataError, match=r"ind\.d\.ty: no such file"):
        data_lib.read_release(str(tmp_path), "d")
    (tmp_path / "ind.d.ty").write_bytes(b"not a pickle")
    with pytest.raises(data_lib.DataError, match=r"ind\.d\.ty: not a readable pickle"):
        data_lib.read_release(str(tmp_path), "d")


def test_edgelist_reader(tmp_path):
    (tmp_path / "edges.txt").write_text("# comment\n0 1\n1 2 0.5\n2 0\n1 0\n3 4\n")
    (tmp_path / "labels.txt").write_text("0\n0\n1\n1\n\n")
    g = data_lib.read_edgelist(str(tmp_path), labels_per_class=1, num_test=2, split_seed=0)
    assert g.x.shape == (5, 0) and list(g.y) == [0, 0, 1, 1, -1]
    assert g.adj[1, 2] == 0.5 and g.adj[0, 1] == 1 and g.adj.nnz == 8
    assert len(g.labeled) == 2 and set(g.y[g.labeled]) == {0, 1} and len(set(g.test) & set(g.labeled)) == 0
    (tmp_path / "edges.txt").write_text("0 1\n0 x\n")
    with pytest.raises(data_lib.DataError, match=r"edges\.txt:2:"):
        data_lib.read_edgelist(str(tmp_path), 1, 2, 0)


def test_label_propagation_path_graph():
    # path 0-1-2-3-4-5, ends clamped to classes 0 and 1: the harmonic solution is linear, P(1) = i / 5
    adj = data_lib.symmetric_adjacency(range(5), range(1, 6), np.ones(5), 6)
    pred = baselines.propagate(adj, np.array([0, 5]), np.array([0, 1]))
    assert list(pred) == [0, 0, 0, 1, 1, 1]


def _train_args(tmp_path, variant, steps):
    d = tmp_path / "graph"
    if not d.exists():
        data_lib.write_release(str(d), "digits", data_lib.digits_knn_graph(k=5, labels_per_class=5, num_test=200))
    over = {
        "model.variant": variant,
        "data.dir": str(d),
        "data.name": "digits",
        "data.pretrain_steps": 10,
        "data.supervised_batch_size": 32,
        "data.context_batch_size": 32,
        "model.embedding_dim": 8,
        "model.feature_hidden": 8,
        "model.embedding_hidden": 8,
        "total_steps": steps,
        "log_every_steps": 1,
        "checkpoint.every_steps": 10,
        "mesh.num_devices": 1,
        "eval.projection": "pca",
    }
    return ["--config=configs/ssl/planetoid.py"] + [f"--config.{k}={v}" for k, v in over.items()]


def _losses(wd):
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "split" not in r}


@pytest.mark.parametrize("variant", ["T", "I"])
def test_train_resume_eval(tmp_path, variant):
    args = _train_args(tmp_path, variant, 30)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert cli.main(["train", *args, f"--workdir={a}"]) == 0
    assert cli.main(["train", *args, f"--workdir={b}", "--stop_at_step=13"]) == 0
    assert cli.main(["train", *args, f"--workdir={b}"]) == 0  # the same command resumes
    la, lb = _losses(a), _losses(b)
    assert sorted(lb) == list(range(1, 31)) and all(la[s] == lb[s] for s in range(14, 31))
    _, _, pa, sa = restore_params(a)
    _, _, pb, sb = restore_params(b)
    assert sa == sb == 30 and pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(np.asarray(pa[k]), np.asarray(pb[k]))
    assert cli.main(["eval", f"--workdir={a}"]) == 0
    with open(os.path.join(a, "eval_results.json")) as f:
        r = json.load(f)
    assert r["num_test"] == 200 and r["step"] == 30 and r["variant"] == variant and 0 <= r["accuracy"] <= 1
    assert os.path.getsize(os.path.join(a, "eval", "embeddings.png")) > 1000
