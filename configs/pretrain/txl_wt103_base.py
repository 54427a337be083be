"""Transformer-XL base ("standard") on WikiText-103: 16 layers, d_model 410, 151M parameters, 24.0 ppl (Table 3.1).

Hyperparameters of the official base script (`pytorch/run_wt103_base.sh`; reference notes §1.8 / §A2): 10 heads x
41, d_inner 2100, dropout 0.1, dropatt 0.0, tgt_len = mem_len = 150, batch 60, adaptive softmax with cutoffs
[20000, 40000, 200000] (div_val 1), Adam lr 2.5e-4 without warmup, cosine over 200K steps, clip 0.25; evaluation
tgt 64 / mem 640 / clamp 400 with same_length.

    xlgen plan  --config=configs/pretrain/txl_wt103_base.py --topology=v3:2x2
"""

import data_pipelines
from configs.models import transformer_xl
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = transformer_xl(
        cutoffs=(20000, 40000, 200000),
        n_layer=16,
        d_model=410,
        d_embed=410,
        n_head=10,
        d_head=41,
        d_inner=2100,
        mem_len=150,
    )
    c.data = data_pipelines.default_config("lm")
    c.data.update(
        dict(source="data/wt103", vocab="word", batch_size=60, tgt_len=150, eval_batch_size=10, eval_tgt_len=64)
    )
    c.optimizer.name = "adam"  # lr 2.5e-4, no warmup, cosine to 0, clip 0.25: the defaults
    c.eval.update(dict(mem_len=640, same_length=True, clamp_len=400))
    c.checkpoint.every_steps = 5000
    c.total_steps = 200_000
    c.log_every_steps = 100
    c.eval_every_steps = 5000
    return c
