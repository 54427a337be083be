"""XLNet-Base pretraining (BooksCorpus + Wikipedia, the thesis' ablation setting): batch 256, 1M steps.

An alias of `configs/pretrain/xlnet.py:base` (the settings and their sources are there).
"""

from configs.pretrain import xlnet


def get_config():
    return xlnet.get_config("base")
