"""Transformer-XL base on enwik8: 12 layers, d_model 512, 41M parameters, 1.06 bpc (thesis Table 3.2).

An alias of `configs/pretrain/txl.py:enwik8_base` (the settings and their sources are there).
"""

from configs.pretrain import txl


def get_config():
    return txl.get_config("enwik8_base")
