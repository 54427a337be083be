"""IMDB, XLNet README (TPU v3-8, Large): seq 512, batch 32, lr 2e-5, 4000 steps, warmup 500 (expected acc 0.962+).
data_dir holds aclImdb/."""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "imdb", max_seq_length=512, batch_size=32, learning_rate=2e-5, total_steps=4000, warmup_steps=500
    )
    c.data.eval_batch_size = 16
    c.eval_every_steps = 1000
    return c
