"""Planetoid (thesis §3.3): graph-based semi-supervised classification, -T / -I / -G.

    xlgen train --config=configs/ssl/planetoid.py --config.model.variant=T|I|G --config.data.format=planetoid \
        --config.data.dir=DIR --config.data.name=cora --workdir=W
    xlgen eval --workdir=W          # eval_results.json: accuracy on the test nodes

Fixed by the thesis: r1 = 5/6, q = 10, d = 3, N1 = N2 = 200. Tuned there on another split (r2, T1, T2, the
learning rates, the pre-training length); the values below were chosen on the stand-in digits graph (split seed 1000,
not a reproduction seed): docs/reproductions.md.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict(
        dict(family="planetoid", variant="T", embedding_dim=50, feature_hidden=64, embedding_hidden=64)
    )
    c.data = ml_collections.ConfigDict(
        dict(
            format="planetoid",  # planetoid: DIR/ind.NAME.*  |  edgelist: DIR/{edges,labels}.txt [+ features.npz]
            dir="",
            name="cora",
            labels_per_class=20,  # edgelist: the split drawn as Planetoid's
            num_test=1000,
            split_seed=0,
            seed=0,  # the batch stream: batch s is a function of (seed, s)
            r1=5 / 6,  # P(gamma = +1)
            r2=0.5,  # P(graph context); 1 - r2: label context
            q=10,  # random-walk length
            d=3,  # window: 0 < |j - k| < d
            supervised_batch_size=200,  # N1
            context_batch_size=200,  # N2
            t1=1,  # Algorithm 3: T1 steps on L_s, then T2 steps on L_u
            t2=1,
            pretrain_steps=1000,  # L_u alone first (initialises the embeddings)
        )
    )
    c.optimizer = ml_collections.ConfigDict(
        dict(name="sgd", sup_learning_rate=0.1, ctx_learning_rate=0.5, node_lr_multiplier=100.0)
    )
    c.checkpoint = ml_collections.ConfigDict(dict(every_steps=1000, keep=2))
    c.eval = ml_collections.ConfigDict(dict(projection="tsne"))
    c.total_steps = 4000
    c.log_every_steps = 100
    c.seed = 0  # parameter initialisation
    return c
