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
from xlgen.models.output_config import config_defaults


def get_config():
    c = base_config()
    c.model = transformer_xl(
        vocab_size=267735,
        cutoffs=(20000, 40000, 200000),
        n_layer=16,
        d_model=410,
        d_embed=410,
        n_head=10,
        d_head=41,
        d_inner=2100,
        mem_len=150,
    )
    c.model.update(config_defaults())  # output_layer (adaptive | softmax | mos | ...) and output.* settings
    c.data = data_pipelines.default_config("lm")
    c.data.update(
        dict(source="data/wt103", vocab="word", batch_size=60, tgt_len=150, eval_batch_size=10, eval_tgt_len=64)
    )
    c.optimizer.update(
        dict(name="adam", learning_rate=2.5e-4, warmup_steps=0, schedule="cosine", min_lr_ratio=0.0, clip_norm=0.25)
    )
    c.eval.update(dict(mem_len=640, same_length=True, clamp_len=400, metric="ppl"))
    c.mesh.update(dict(data=-1, fsdp=1, tensor=1, rules="fsdp"))
    c.checkpoint.update(dict(every_steps=5000, keep=3))
    c.total_steps = 200_000
    c.log_every_steps = 100
    c.eval_every_steps = 5000
    return c
