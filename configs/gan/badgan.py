"""Semi-supervised learning with a complement ("bad") GAN (seed 003 §3.1; seed 000 Appendix C).

    xlgen train --config=configs/gan/badgan.py --config.model.variant=supervised|fm|badgan \
        --config.data.name=digits|idx|four_spins|two_circles [--config.data.dir=DIR] --config.data.num_labeled=100 \
        --workdir=W
    xlgen eval --workdir=W        # W/eval_results.json: test_error (fraction)

The discriminator is the paper's code's MNIST MLP (Gaussian instance noise 0.3 on the input and 0.5 on each hidden
layer, K logits, the fake logit fixed at 0) with `disc_hidden` widths; the generator FC(100,500)-BN-Softplus-
FC(500,500)-BN-Softplus-FC(500,D)-Sigmoid on z ~ U(0,1)^100. `badgan` = FM + PT + LD + Ent with the weights below
(set a weight to 0 for the ablation rows); the low-density density model is PixelDensity (MADE), a documented
deviation from PixelCNN++. Adam (disc 3e-3, b1 0.5; gen 1e-3, b1 0) as the paper's code, batch 100 unlabeled +
all labeled rows (at most 100) per step.
"""

import ml_collections

from configs.gan import common


def get_config():
    c = common.base()
    c.model = ml_collections.ConfigDict(
        dict(
            family="badgan",
            variant="badgan",  # supervised | fm | badgan
            generator="learned",  # learned | complement (2-D sets: uniform in the box minus the manifold)
            noise_dim=100,
            disc_hidden=(500, 250, 250),
            gen_hidden=(500, 500),
            input_noise=0.3,
            hidden_noise=0.5,
            ent_weight=0.1,  # conditional entropy (eq. C.5)
            pt_weight=0.8,  # pull-away term
            ld_weight=1e-3,  # low-density term (eq. C.3)
            ld_start=500,  # LD from this step on (the density model trains from step 0)
            ld_quantile=0.1,  # epsilon = this quantile of log p over the unlabeled batch
            vi_weight=0.0,  # VI entropy (encoder player) if > 0
            vi_max_std=1.0,
            density_hidden=256,
            dequantize=1.0 / 16,  # density model: uniform noise added to the pixels it learns on
        )
    )
    c.objective = "badgan"
    c.data = ml_collections.ConfigDict(
        dict(
            pipeline="gan",
            name="digits",
            dir="",
            digit=-1,
            num_labeled=100,
            label_seed=-1,
            num_points=2000,
            batch_size=100,
            labeled_batch_size=0,
            seed=0,
        )
    )
    c.players = ml_collections.ConfigDict(
        dict(
            disc=common.player(3e-3, b1=0.5, b2=0.999, decay_fraction=0.67, decay_to=0.0),
            gen=common.player(1e-3, b1=0.0, b2=0.999, decay_fraction=0.67, decay_to=0.0),
            enc=common.player(1e-3, b1=0.0, b2=0.999, decay_fraction=0.67, decay_to=0.0),
            density=common.player(1e-3, b1=0.9, b2=0.999),
        )
    )
    c.eval = ml_collections.ConfigDict(dict(split="test"))
    c.total_steps = 3000
    # the players' losses are adversarial, not minimised: no divergence rule (non-finite steps are still guarded)
    c.divergence_factor = 0.0
    c.checkpoint.every_steps = 1000
    return c
