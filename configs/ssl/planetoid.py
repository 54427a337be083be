"""Planetoid (thesis §3.3): graph-based semi-supervised classification, -T / -I / -G.

    xlgen train --config=configs/ssl/planetoid.py --config.model.variant=T|I|G --config.data.format=planetoid \
        --config.data.dir=DIR --config.data.name=cora --workdir=W
    xlgen eval --workdir=W          # eval_results.json: accuracy on the test nodes; W/eval/embeddings.png

Fixed by the thesis: r1 = 5/6, q = 10, d = 3, N1 = N2 = 200, SGD. Tuned there on another split (r2, T1, T2, the
learning rates, the pre-training length); the values below were chosen on the stand-in digits graph with split seed
1000, which no reproduction uses (docs/reproductions.md).
"""

from xlgen.config import base_config, model_section


def get_config():
    c = base_config()
    c.model = model_section("planetoid")  # variant T, d = 50, e and w_c at 100x the rate: PlanetoidConfig
    c.objective = "planetoid"
    c.data.update(
        dict(
            format="planetoid",  # planetoid: DIR/ind.NAME.*  |  edgelist: DIR/{edges,labels}.txt [+ features.npz]
            dir="",
            name="cora",
            labels_per_class=20,  # edgelist: the split drawn as Planetoid's (20 per class, 1,000 test nodes)
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
            context_weight=5.0,  # a context step's rate / a supervised step's rate (SGD)
            eval_batch_size=1000,
        )
    )
    c.optimizer.update(dict(name="sgd", learning_rate=0.1, schedule="constant", clip_norm=0.0))
    c.checkpoint.update(dict(keep=2, save_mems=False))
    c.eval.update(dict(split="test", metric="accuracy"))
    c.eval.projection = "tsne"
    c.total_steps = 3000
    c.log_every_steps = 100
    c.eval_every_steps = -1
    c.tensorboard = False
    return c
