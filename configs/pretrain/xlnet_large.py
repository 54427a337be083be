"""XLNet-Large pretraining as in the thesis: 512 TPU v3 chips (v3:16x32), batch 2048, 500K steps.

An alias of `configs/pretrain/xlnet.py:large` (the settings and their sources are there).
"""

from configs.pretrain import xlnet


def get_config(batch_size: int = 2048):
    return xlnet.large(batch_size)
