"""CoLA, Funnel-Transformer README preset: seq 128, batch 16, lr 1e-5, 5350 steps, warmup 535. Reports mcc."""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "glue/cola", max_seq_length=128, batch_size=16, learning_rate=1e-5, total_steps=5350, warmup_steps=535
    )
    c.eval_every_steps = 1000
    return c
