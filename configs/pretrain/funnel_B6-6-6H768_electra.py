"""Funnel-Transformer B6-6-6H768 (decoder D2), ELECTRA pretraining;
base scale: batch 256, 1M steps.

Settings shared by all paper-sized Funnel configs (and their sources) are in `funnel_common.py`.

    xlgen plan --config=configs/pretrain/funnel_B6-6-6H768_electra.py --topology=v3:4x4
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "funnel_common", os.path.join(os.path.dirname(__file__), "funnel_common.py")
)
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)


def get_config():
    return _common.funnel_config("6-6-6", 768, "electra")
