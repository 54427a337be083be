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
from xlgen.config import model_section


def get_config():
    c = common.base()
    c.model = model_section("cegan")  # the fields and their meaning: xlgen/systems/gan/system.py CeganConfig
    c.objective = "cegan"
    c.data = common.data("mog4", batch_size=500)
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
