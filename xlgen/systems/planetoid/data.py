"""Graphs for Planetoid (thesis §3.3): readers, the labeled/unlabeled/test split, and local stand-in graphs.

A `Graph` holds N nodes: a symmetric adjacency `adj` (scipy CSR, a_ij = a_ji), features `x` [N, F] (scipy CSR;
F = 0 for graph-only data), `y` [N] int (-1 where unknown), and the split as index arrays `labeled` (the L nodes
whose labels training sees), `test` (evaluated, labels hidden from training) and `unlabeled` (the rest).

Formats (`config.data.format`):

  planetoid  Planetoid's release (Citeseer / Cora / Pubmed): DIR/ind.NAME.{x,y,tx,ty,allx,ally,graph,test.index}.
             x, tx, allx: scipy sparse feature rows (labeled / test / labeled+unlabeled, allx[:len(y)] = x);
             y, ty, ally: one-hot numpy label rows; graph: {node: [neighbour, ...]} (a defaultdict, pickled by
             Python 2, so read with encoding="latin1"); test.index: one graph node index per line, the node of
             each tx/ty row in order. Nodes 0..len(allx)-1 are allx's rows, the labeled nodes are 0..len(y)-1.
             Graph nodes with no feature row (Citeseer's isolated nodes) get zero features and label -1.
  edgelist   DIR/edges.txt ("i j" or "i j w" a line, '#' comments), DIR/labels.txt (one label a line per node;
             '-1' or '' = unknown), optional DIR/features.npz (scipy sparse) or DIR/features.npy (dense). The split
             is drawn as Planetoid's: `labels_per_class` labeled nodes per class and `num_test` test nodes, uniformly
             from the labeled pool, by `split_seed`.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle

import numpy as np
import scipy.sparse as sp

from data_pipelines import paths

RELEASE_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")


@dataclasses.dataclass(frozen=True)
class Graph:
    adj: sp.csr_matrix  # [N, N] symmetric, nonnegative weights
    x: sp.csr_matrix  # [N, F] (F = 0: no features)
    y: np.ndarray  # [N] int64, -1 = unknown
    labeled: np.ndarray  # [L] node ids whose labels training uses
    test: np.ndarray  # [T] node ids evaluated
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.adj.shape[0]

    @property
    def unlabeled(self) -> np.ndarray:
        mask = np.ones(self.num_nodes, bool)
        mask[self.labeled] = False
        mask[self.test] = False
        return np.flatnonzero(mask)


class DataError(ValueError):
    """Bad input data: the message names the file (and line or key)."""


def symmetric_adjacency(rows, cols, weights, n: int) -> sp.csr_matrix:
    """a_ij = a_ji = the largest weight given for (i, j) or (j, i) (citations: a_ij = a_ji = 1, however often or in
    which direction an edge is listed)."""
    r = np.r_[np.asarray(rows, np.int64), np.asarray(cols, np.int64)]
    c = np.r_[np.asarray(cols, np.int64), np.asarray(rows, np.int64)]
    w = np.tile(np.asarray(weights, np.float64), 2)
    if not len(w):
        return sp.csr_matrix((n, n))
    key = r * n + c
    order = np.argsort(key, kind="stable")
    key, w = key[order], w[order]
    first = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    key, w = key[first], np.maximum.reduceat(w, first)
    return sp.csr_matrix((w, (key // n, key % n)), shape=(n, n))


def _unpickle(path: str):
    try:
        return pickle.load(io.BytesIO(paths.read_bytes(path)), encoding="latin1")
    except FileNotFoundError:
        raise DataError(
            f"{path}: no such file (Planetoid's release format needs ind.NAME.{{{','.join(RELEASE_PARTS)},test.index}})"
        )
    except Exception as e:  # a truncated or foreign pickle
        raise DataError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from e


def _labels(onehot, path: str) -> np.ndarray:
    a = np.asarray(onehot.todense() if sp.issparse(onehot) else onehot)
    if a.ndim != 2:
        raise DataError(f"{path}: expected one-hot label rows [n, classes], got shape {a.shape}")
    y = a.argmax(1).astype(np.int64)
    y[a.sum(1) == 0] = -1
    return y


def read_release(directory: str, name: str) -> Graph:
    """Planetoid's `ind.NAME.*` files as a Graph (labeled = the rows of y, test = test.index)."""
    p = {k: paths.join(directory, f"ind.{name}.{k}") for k in RELEASE_PARTS + ("test.index",)}
    obj = {k: _unpickle(p[k]) for k in RELEASE_PARTS}
    try:
        lines = paths.read_text(p["test.index"]).splitlines()
    except FileNotFoundError:
        raise DataError(f"{p['test.index']}: no such file")
    test = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                test.append(int(line))
            except ValueError:
                raise DataError(f"{p['test.index']}:{n}: not a node index: {line.strip()!r}")
    test = np.asarray(test, np.int64)
    allx, tx, x = (sp.csr_matrix(obj[k]) for k in ("allx", "tx", "x"))
    y, ty, ally = (_labels(obj[k], p[k]) for k in ("y", "ty", "ally"))
    if tx.shape[0] != len(test) or len(ty) != len(test):
        raise DataError(f"{p['tx']}: {tx.shape[0]} rows, ty {len(ty)} rows, test.index {len(test)} lines (must agree)")
    if allx.shape[0] != len(ally) or x.shape[0] != len(y) or len(y) > allx.shape[0]:
        raise DataError(f"{p['allx']}: {allx.shape[0]} rows, ally {len(ally)}, x {x.shape[0]}, y {len(y)} (must agree)")
    graph = obj["graph"]
    if not isinstance(graph, dict):
        raise DataError(f"{p['graph']}: expected a dict {{node: [neighbours]}}, got {type(graph).__name__}")
    src, dst = [], []
    for i, nbrs in graph.items():
        for j in nbrs:
            src.append(int(i))
            dst.append(int(j))
    top = max([allx.shape[0] - 1, int(test.max(initial=-1))] + [int(k) for k in graph] + src + dst)
    n = top + 1
    feats = sp.lil_matrix((n, allx.shape[1]), dtype=np.float32)
    feats[: allx.shape[0]] = allx
    feats[test] = tx
    labels = np.full(n, -1, np.int64)
    labels[: len(ally)] = ally
    labels[test] = ty
    adj = symmetric_adjacency(src, dst, np.ones(len(src)), n)
    classes = max(np.asarray(obj["y"]).shape[1], np.asarray(obj["ty"]).shape[1])
    return Graph(adj, feats.tocsr(), labels, np.arange(len(y)), test, int(classes))


def write_release(directory: str, name: str, g: Graph) -> None:
    """Write `g` in Planetoid's release format (nodes renumbered so labeled come first, then the unlabeled, then
    the test nodes), so `read_release` returns the same graph up to that renumbering. Used by tests and by the
    stand-in reproductions, which then run exactly the command a user runs on the real files."""
    order = np.r_[g.labeled, g.unlabeled, g.test]
    new = np.empty(g.num_nodes, np.int64)
    new[order] = np.arange(g.num_nodes)
    onehot = np.eye(g.num_classes, dtype=np.int32)
    nl, na = len(g.labeled), len(g.labeled) + len(g.unlabeled)
    x = g.x[order].tocsr()
    coo = g.adj.tocoo()
    graph = collections.defaultdict(list)
    for i, j in zip(new[coo.row], new[coo.col]):
        graph[int(i)].append(int(j))
    parts = {
        "x": x[:nl],
        "y": onehot[g.y[order[:nl]]],
        "allx": x[:na],
        "ally": np.where(g.y[order[:na], None] >= 0, onehot[np.maximum(g.y[order[:na]], 0)], 0),
        "tx": x[na:],
        "ty": onehot[g.y[order[na:]]],
        "graph": graph,
    }
    paths.makedirs(directory)
    for k, v in parts.items():
        paths.atomic_write_bytes(paths.join(directory, f"ind.{name}.{k}"), pickle.dumps(v, protocol=2))
    paths.atomic_write_text(
        paths.join(directory, f"ind.{name}.test.index"), "".join(f"{i}\n" for i in range(na, g.num_nodes))
    )


def planetoid_split(y: np.ndarray, labels_per_class: int, num_test: int, seed: int):
    """Planetoid's split: `labels_per_class` labeled nodes per class, then `num_test` test nodes uniformly from
    the remaining nodes with a known label; returns (labeled, test) sorted node ids."""
    rng = np.random.default_rng(seed)
    known = np.flatnonzero(y >= 0)
    labeled = []
    for c in np.unique(y[known]):
        pool = known[y[known] == c]
        if len(pool) < labels_per_class:
            raise DataError(
                f"class {c} has {len(pool)} labeled nodes, fewer than labels_per_class={labels_per_class} (the "
                f"default suits Cora-sized graphs; for a small graph lower --config.data.labels_per_class)"
            )
        labeled.append(rng.choice(pool, labels_per_class, replace=False))
    labeled = np.sort(np.concatenate(labeled))
    rest = np.setdiff1d(known, labeled)
    if len(rest) < num_test:
        raise DataError(
            f"{len(rest)} nodes with labels remain after the labeled draw, fewer than num_test={num_test} (the "
            f"default suits Cora-sized graphs; for this graph set --config.data.num_test={len(rest)} or fewer)"
        )
    return labeled, np.sort(rng.choice(rest, num_test, replace=False))


def read_edgelist(directory: str, labels_per_class: int, num_test: int, split_seed: int) -> Graph:
    """The plain format (module docstring)."""
    lab_path = paths.join(directory, "labels.txt")
    y = []
    for n, line in enumerate(paths.read_text(lab_path).splitlines(), 1):
        s = line.strip()
        try:
            y.append(int(s) if s else -1)
        except ValueError:
            raise DataError(f"{lab_path}:{n}: not an integer label: {s!r}")
    y = np.asarray(y, np.int64)
    n_nodes = len(y)
    e_path = paths.join(directory, "edges.txt")
    rows, cols, w = [], [], []
    for n, line in enumerate(paths.read_text(e_path).splitlines(), 1):
        s = line.split("#", 1)[0].split()
        if not s:
            continue
        try:
            i, j = int(s[0]), int(s[1])
            wt = float(s[2]) if len(s) > 2 else 1.0
        except (ValueError, IndexError):
            raise DataError(f"{e_path}:{n}: expected 'i j [weight]', got {line.strip()!r}")
        if not (0 <= i < n_nodes and 0 <= j < n_nodes) or wt < 0:
            raise DataError(f"{e_path}:{n}: node out of range 0..{n_nodes - 1} (labels.txt) or negative weight")
        rows.append(i)
        cols.append(j)
        w.append(wt)
    x = _read_features(directory, n_nodes)
    labeled, test = planetoid_split(y, labels_per_class, num_test, split_seed)
    return Graph(symmetric_adjacency(rows, cols, w, n_nodes), x, y, labeled, test, int(y.max()) + 1)


def _read_features(directory: str, n_nodes: int) -> sp.csr_matrix:
    for fname in ("features.npz", "features.npy"):
        p = paths.join(directory, fname)
        if not paths.as_path(p).exists():
            continue
        raw = io.BytesIO(paths.read_bytes(p))
        try:
            x = sp.load_npz(raw) if fname.endswith(".npz") else np.load(raw, allow_pickle=False)
        except Exception as e:
            raise DataError(f"{p}: not a readable {'scipy sparse .npz' if fname.endswith('z') else '.npy'} ({e})")
        if x.ndim != 2 or x.shape[0] != n_nodes:
            raise DataError(f"{p}: shape {x.shape}, expected [{n_nodes} (nodes in labels.txt), features]")
        return sp.csr_matrix(x, dtype=np.float32)
    return sp.csr_matrix((n_nodes, 0), dtype=np.float32)


def load(data_config) -> Graph:
    """The graph named by `config.data` (format, dir, name, and for edgelist the split settings)."""
    c = data_config
    if not c["dir"]:
        raise DataError("config.data.dir is empty: the directory of the graph files")
    if c["format"] == "planetoid":
        return read_release(c["dir"], c["name"])
    if c["format"] == "edgelist":
        return read_edgelist(c["dir"], int(c["labels_per_class"]), int(c["num_test"]), int(c["split_seed"]))
    raise DataError(f"config.data.format={c['format']!r}: expected 'planetoid' or 'edgelist'")


# -- local stand-ins (for when the real Citeseer / Cora / Pubmed files are not at hand) ---------------------------


def digits_knn_graph(k: int = 10, labels_per_class: int = 20, num_test: int = 1000, seed: int = 0) -> Graph:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes, 64 pixel features) with a symmetric k-nearest-neighbour
    graph over the pixels: a stand-in for a citation graph (here the graph is derived from the features, so it
    carries less information beyond x than citations do)."""
    from sklearn.datasets import load_digits
    from sklearn.neighbors import kneighbors_graph

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    knn = kneighbors_graph(x, k, mode="connectivity", include_self=False).tocoo()
    y = d.target.astype(np.int64)
    labeled, test = planetoid_split(y, labels_per_class, num_test, seed)
    adj = symmetric_adjacency(knn.row, knn.col, np.ones(knn.nnz), len(y))
    return Graph(adj, sp.csr_matrix(x), y, labeled, test, 10)


def karate_graph(labels_per_class: int = 2, seed: int = 0) -> Graph:
    """Zachary's karate club (networkx; 34 nodes, 78 edges, the two factions as classes), without features: the
    stand-in for Planetoid-G. `labels_per_class` labeled nodes per faction; every other node is a test node."""
    import networkx as nx

    g = nx.karate_club_graph()
    y = np.array([0 if g.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(g.number_of_nodes())], np.int64)
    e = np.array(list(g.edges()), np.int64)
    n = len(y)
    labeled, test = planetoid_split(y, labels_per_class, n - 2 * labels_per_class, seed)
    adj = symmetric_adjacency(e[:, 0], e[:, 1], np.ones(len(e)), n)
    return Graph(adj, sp.csr_matrix((n, 0), dtype=np.float32), y, labeled, test, 2)
