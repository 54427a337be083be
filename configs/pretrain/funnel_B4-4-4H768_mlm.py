"""Funnel-Transformer B4-4-4H768 (decoder D2), MLM pretraining;
base scale: batch 256, 1M steps.

An alias of `configs/pretrain/funnel.py:B4-4-4H768_mlm` (the settings and their sources are there).

    xlgen plan --config=configs/pretrain/funnel_B4-4-4H768_mlm.py --topology=v3:4x4
"""

from configs.pretrain import funnel


def get_config():
    return funnel.get_config("B4-4-4H768_mlm")
