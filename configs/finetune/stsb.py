"""STS-B regression, XLNet README example: seq 128, batch 32 (8 x 4 GPUs), lr 5e-5, 1200 steps, warmup 120.
Reports pearson / spearman.

An alias of `configs/finetune/glue.py:stsb`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("stsb")
