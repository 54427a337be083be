"""Transformer-XL large on enwik8: 24 layers, d_model 1024, 277M parameters, 0.99 bpc (thesis Table 3.2).

An alias of `configs/pretrain/txl.py:enwik8_large` (the settings and their sources are there).
"""

from configs.pretrain import txl


def get_config():
    return txl.get_config("enwik8_large")
