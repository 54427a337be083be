"""Funnel-Transformer B6-3x2-3x2H768 (decoder D2), ELECTRA pretraining;
base scale: batch 256, 1M steps.

An alias of `configs/pretrain/funnel.py:B6-3x2-3x2H768_electra` (the settings and their sources are there).

    xlgen plan --config=configs/pretrain/funnel_B6-3x2-3x2H768_electra.py --topology=v3:4x4
"""

from configs.pretrain import funnel


def get_config():
    return funnel.get_config("B6-3x2-3x2H768_electra")
