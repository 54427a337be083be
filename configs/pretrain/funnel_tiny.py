"""Funnel-Transformer, CPU-sized: B2-2-2 MLM on the embedded tinyshakespeare corpus (character vocabulary).
ELECTRA (generator + disc_coeff * discriminator):

    xlgen train --config=configs/pretrain/funnel_tiny.py --workdir=/tmp/funnel_tiny
    xlgen train --config=configs/pretrain/funnel_tiny.py --config.objective=funnel_electra \\
        --config.data.pipeline=electra --workdir=/tmp/funnel_electra_tiny
"""

import data_pipelines
from configs.tiny import OPTIMIZER, tiny_run
from xlgen.config import base_config, model_section


def get_config():
    c = base_config()
    c.model = model_section(
        "funnel", vocab_size=74, block_sizes=(2, 2, 2), d_model=64, n_head=4, d_head=16, d_inner=256
    )
    c.objective = "funnel_mlm"
    c.data = data_pipelines.default_config("mlm")
    c.data.update(dict(batch_size=8, eval_batch_size=8, seq_len=64, eval_steps=10))
    return tiny_run(c, optimizer=dict(OPTIMIZER, schedule="poly", b2=0.99))
