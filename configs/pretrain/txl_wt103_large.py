"""Transformer-XL large on WikiText-103: 18 layers, d_model 1024, adaptive input/softmax, 18.3 ppl (thesis Table 3.1).

An alias of `configs/pretrain/txl.py:wt103_large` (the settings and their sources are there).
"""

from configs.pretrain import txl


def get_config():
    return txl.get_config("wt103_large")
