"""Transformer-XL, CPU-sized: character LM on the embedded tinyshakespeare corpus (no downloads).

xlgen train --config=configs/pretrain/txl_tiny.py --workdir=/tmp/txl_tiny
"""

import data_pipelines
from configs.models import transformer_xl
from configs.tiny import tiny_run
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = transformer_xl(
        vocab_size=74,
        d_model=64,
        d_embed=64,
        n_head=4,
        d_head=16,
        d_inner=256,
        n_layer=2,
        mem_len=32,
        dtype="float32",
    )
    c.data = data_pipelines.default_config("lm")
    c.data.update(dict(batch_size=8, tgt_len=32, eval_batch_size=8, eval_tgt_len=32))
    c.eval.update(dict(mem_len=64, same_length=True, metric="bpc"))
    optimizer = dict(learning_rate=2e-3, warmup_steps=20, min_lr_ratio=0.1)
    return tiny_run(c, optimizer=optimizer, eval_steps=20)
