"""Funnel-Transformer, CPU-sized: B2-2-2 MLM on the embedded tinyshakespeare corpus (character vocabulary).
ELECTRA (generator + disc_coeff * discriminator):

    xlgen train --config=configs/pretrain/funnel_tiny.py --workdir=/tmp/funnel_tiny
    xlgen train --config=configs/pretrain/funnel_tiny.py --config.objective=funnel_electra \\
        --config.data.pipeline=electra --workdir=/tmp/funnel_electra_tiny
"""

import data_pipelines
from configs.tiny import OPTIMIZER, tiny_run
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = dict(
        family="funnel",
        vocab_size=74,
        block_sizes=(2, 2, 2),
        num_decoder_layers=2,
        d_model=64,
        n_head=4,
        d_head=16,
        d_inner=256,
        hidden_act="gelu_new",
        dropout=0.1,
        dropatt=0.1,
        dropact=0.0,
        layer_norm_eps=1e-9,
        init_std=0.02,
        pooling_type="mean",
        attention_type="relative_shift",
        separate_cls=True,
        truncate_seq=True,
        pool_q_only=True,
        remat="none",
        dtype="float32",
        param_dtype="float32",
        scores_dtype="float32",
        softmax_dtype="float32",
        logits_dtype="float32",
    )
    c.objective = "funnel_mlm"
    c.objective_options.update(dict(disc_coeff=50.0, generator_width=0.25))
    c.data = data_pipelines.default_config("mlm")
    c.data.update(
        dict(source="tinyshakespeare", vocab="char", batch_size=8, eval_batch_size=8, seq_len=64, eval_steps=10)
    )
    return tiny_run(c, optimizer=dict(OPTIMIZER, schedule="poly", b2=0.99))
