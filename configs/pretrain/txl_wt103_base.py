"""Transformer-XL base ("standard") on WikiText-103: 16 layers, d_model 410, 151M parameters, 24.0 ppl (Table 3.1).

An alias of `configs/pretrain/txl.py:wt103_base` (the settings and their sources are there).
"""

from configs.pretrain import txl


def get_config():
    return txl.get_config("wt103_base")
