"""Yelp-5, XLNet-Large paper preset (v2 appendix): seq 512, batch 128, lr 1e-5, 10K steps, layer decay 1.0."""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "yelp5", max_seq_length=512, batch_size=128, learning_rate=1e-5, total_steps=10000, warmup_steps=1000
    )
    c.data.eval_batch_size = 16
    c.eval_every_steps = 2000
    return c
