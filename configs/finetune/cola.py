"""CoLA, Funnel-Transformer README preset: seq 128, batch 16, lr 1e-5, 5350 steps, warmup 535. Reports mcc.

An alias of `configs/finetune/glue.py:cola`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("cola")
