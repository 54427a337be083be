"""XLNet, CPU-sized: two-stream permutation LM with memory and bi_data on the embedded tinyshakespeare corpus.

xlgen train --config=configs/pretrain/xlnet_tiny.py --workdir=/tmp/xlnet_tiny
"""

import data_pipelines
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = dict(
        family="xlnet",
        vocab_size=74,
        d_model=64,
        n_layer=2,
        n_head=4,
        d_head=16,
        d_inner=256,
        ff_activation="gelu",
        untie_r=True,
        attn_type="bi",
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        dropout=0.1,
        dropatt=0.1,
        mem_len=32,
        reuse_len=16,
        bi_data=True,
        clamp_len=-1,
        same_length=False,
        scan_layers=False,
        remat=False,
        dtype="float32",
    )
    c.data = data_pipelines.default_config("xlnet")
    c.data.update(
        dict(
            source="tinyshakespeare",
            vocab="char",
            batch_size=8,
            eval_batch_size=8,
            seq_len=32,
            reuse_len=16,
            perm_size=16,
            num_predict=6,
            bi_data=True,
            span_unit="piece",
            eval_steps=10,
        )
    )
    c.optimizer.update(
        dict(
            learning_rate=1e-3,
            warmup_steps=20,
            schedule="linear",
            min_lr_ratio=0.0,
            clip_norm=1.0,
            weight_decay=0.01,
            eps=1e-6,
        )
    )
    c.eval.update(dict(steps=10))
    c.checkpoint.update(dict(every_steps=100, keep=3))
    c.total_steps = 200
    c.log_every_steps = 10
    c.eval_every_steps = 100
    return c
