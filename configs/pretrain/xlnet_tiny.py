"""XLNet, CPU-sized: two-stream permutation LM with memory and bi_data on the embedded tinyshakespeare corpus.

    xlgen train --config=configs/pretrain/xlnet_tiny.py --workdir=/tmp/xlnet_tiny

An alias of `configs/pretrain/xlnet.py:tiny` (the settings and their sources are there).
"""

from configs.pretrain import xlnet


def get_config():
    return xlnet.get_config("tiny")
