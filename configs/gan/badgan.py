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
from xlgen.config import model_section


def get_config():
    c = common.base()
    c.model = model_section("badgan")  # the fields and their meaning: xlgen/systems/gan/system.py BadganConfig
    c.objective = "badgan"
    c.data = common.data("digits", batch_size=100, num_labeled=100)
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
