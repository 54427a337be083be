"""Transformer-XL base on enwik8: 12 layers, d_model 512, 41M parameters, 1.06 bpc (thesis Table 3.2).

Hyperparameters of the official base script (reference notes §1.8 / §A2): 8 heads x 64, d_inner 2048, dropout 0.1,
dropatt 0.0, tgt_len = mem_len = 512, batch 24, Adam lr 2.5e-4 without warmup, cosine decay to 0.004 x lr over 400K
steps, clip 0.25; evaluation tgt 80 / mem 2100 / clamp 820.

    xlgen plan  --config=configs/pretrain/txl_enwik8_base.py --topology=v3:2x2
    xlgen train --config=configs/pretrain/txl_enwik8_base.py --workdir=DIR --config.data.source=PREPARED_DIR
"""

import data_pipelines
from configs.models import transformer_xl
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = transformer_xl(
        vocab_size=265,  # 9 special ids + 256 byte values (the original counts 204)
        n_layer=12,
        d_model=512,
        d_embed=512,
        n_head=8,
        d_inner=2048,
        mem_len=512,
    )
    c.data = data_pipelines.default_config("lm")
    c.data.update(dict(source="data/enwik8", batch_size=24, tgt_len=512, eval_batch_size=8, eval_tgt_len=80))
    c.optimizer.update(dict(name="adam", min_lr_ratio=0.004))  # lr 2.5e-4, no warmup, cosine, clip 0.25: the defaults
    c.eval.update(dict(mem_len=2100, same_length=True, clamp_len=820, metric="bpc"))
    c.checkpoint.every_steps = 5000
    c.total_steps = 400_000
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    return c
