"""Funnel-Transformer B10-10-10H1024 (decoder D2), MLM pretraining;
large scale: batch 8K, 500K steps.

An alias of `configs/pretrain/funnel.py:B10-10-10H1024_mlm` (the settings and their sources are there).

    xlgen plan --config=configs/pretrain/funnel_B10-10-10H1024_mlm.py --topology=v3:16x32
"""

from configs.pretrain import funnel


def get_config():
    return funnel.get_config("B10-10-10H1024_mlm")
