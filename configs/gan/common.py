"""Keys shared by the adversarial systems' configs (configs/gan/cegan.py, configs/gan/badgan.py)."""

import ml_collections


def player(learning_rate, b1=0.5, b2=0.999, decay_fraction=0.0, decay_to=1.0):
    """One player's Adam: rate, moments, and a linear decay to `decay_to` x over the last `decay_fraction`."""
    return ml_collections.ConfigDict(
        dict(learning_rate=learning_rate, b1=b1, b2=b2, decay_fraction=decay_fraction, decay_to=decay_to)
    )


def base():
    from xlgen.config import base_config

    c = base_config()
    c.checkpoint.update(dict(keep=2, async_save=False, save_mems=False))
    c.mesh.rules = "dp"
    c.log_every_steps = 100
    c.eval_every_steps = -1
    c.tensorboard = False
    return c


def data(name: str, batch_size: int, **fields):
    """`config.data` of the `gan` pipeline (xlgen/systems/gan/data.py): the set `name` (2-D sets, digits, idx),
    labeled examples (labeled_batch_size 0 = all of them, at most the batch), and the batch order."""
    keys = dict(pipeline="gan", name=name, dir="", digit=-1, num_labeled=0, label_seed=-1, num_points=2000, seed=0)
    return ml_collections.ConfigDict(keys | dict(batch_size=batch_size, labeled_batch_size=0) | fields)
