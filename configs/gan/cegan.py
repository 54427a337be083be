"""Calibrating energy-based GANs (seed 000 Appendix B): GAN, EGAN-Const, EGAN-Ent-VI, EGAN-Ent-NN.

    xlgen train --config=configs/gan/cegan.py --config.model.variant=egan_ent_nn --config.data.name=mog4 --workdir=W
    xlgen train --config=configs/gan/cegan.py --config.data.name=idx --config.data.dir=DIR [--config.data.digit=1] ...
    xlgen eval --workdir=W        # W/eval_results.json: kl_<p>_<q> over gen, emp, data, disc (Table B.2)

2-D: the fully-connected networks of §B.8.1 (noise 4, width 128), Adam 2e-4 (b1 0.5) for the discriminator and ten
times that for the generator (the paper's code's `multiplier`), batch 500. Images (28x28 IDX): the DCGAN networks
of §B.8.1 with `model.width` scaling the channels (1.0 = the paper's), noise 10, batch 64.
"""

import ml_collections

from configs.gan import common


def get_config():
    c = common.base()
    c.model = ml_collections.ConfigDict(
        dict(
            family="cegan",
            variant="egan_ent_nn",  # gan | egan_const | egan_ent_nn | egan_ent_vi
            noise_dim=4,
            hidden=128,
            width=1.0,  # images: channel multiplier of the DCGAN networks
            margin=0.0,  # EGAN discriminator: max(E_data c - c(x~), -margin); 0 = none
            gap_bounds=(-10.0, 0.1),  # EGAN: disc updates while gap > [0], gen while gap < [1] (the paper's code)
            knn_k=20,  # EGAN-Ent-NN: neighbours (eq. B.10)
            knn_alpha=0.5,  # EGAN-Ent-NN: alpha (eq. B.11)
            vi_weight=1.0,  # EGAN-Ent-VI: weight of U(q)
            vi_noise=0.0,  # EGAN-Ent-VI: std of p_gen(x|z) = N(G(z), s² I) (eq. B.13); 0: q sees G(z) itself
        )
    )
    c.objective = "cegan"
    c.data = ml_collections.ConfigDict(
        dict(
            pipeline="gan",
            name="mog4",
            dir="",
            digit=-1,
            num_labeled=0,
            label_seed=-1,
            num_points=2000,
            batch_size=500,
            seed=0,
        )
    )
    c.players = ml_collections.ConfigDict(
        dict(
            disc=common.player(2e-4, decay_fraction=0.5, decay_to=0.1),
            gen=common.player(2e-3, decay_fraction=0.5, decay_to=0.1),
            infer=common.player(2e-3, decay_fraction=0.5, decay_to=0.1),
        )
    )
    c.eval = ml_collections.ConfigDict(dict(split="test", num_samples=100_000, probe_train=10_000))
    c.total_steps = 6000
    # the players' losses are adversarial, not minimised: no divergence rule (non-finite steps are still guarded)
    c.divergence_factor = 0.0
    c.checkpoint.every_steps = 2000
    return c
