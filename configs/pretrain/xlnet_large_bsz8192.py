"""XLNet-Large with the final paper's batch of 8192 (same steps and optimiser as `xlnet_large.py`).

An alias of `configs/pretrain/xlnet.py:large_bsz8192` (the settings and their sources are there).
"""

from configs.pretrain import xlnet


def get_config():
    return xlnet.get_config("large_bsz8192")
