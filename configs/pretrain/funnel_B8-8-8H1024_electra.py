"""Funnel-Transformer B8-8-8H1024 (decoder D2), ELECTRA pretraining;
large scale: batch 8K, 500K steps.

An alias of `configs/pretrain/funnel.py:B8-8-8H1024_electra` (the settings and their sources are there).

    xlgen plan --config=configs/pretrain/funnel_B8-8-8H1024_electra.py --topology=v3:16x32
"""

from configs.pretrain import funnel


def get_config():
    return funnel.get_config("B8-8-8H1024_electra")
