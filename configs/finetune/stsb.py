"""STS-B regression, XLNet README example: seq 128, batch 32 (8 x 4 GPUs), lr 5e-5, 1200 steps, warmup 120.
Reports pearson / spearman."""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "glue/stsb", max_seq_length=128, batch_size=32, learning_rate=5e-5, total_steps=1200, warmup_steps=120
    )
    c.eval_every_steps = 400
    return c
