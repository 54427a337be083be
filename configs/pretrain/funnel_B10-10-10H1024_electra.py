"""Funnel-Transformer B10-10-10H1024 (decoder D2), ELECTRA pretraining;
large scale: batch 8K, 500K steps.

Settings shared by all paper-sized Funnel configs (and their sources) are in `funnel_common.py`.

    xlgen plan --config=configs/pretrain/funnel_B10-10-10H1024_electra.py --topology=v3:16x32
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "funnel_common", os.path.join(os.path.dirname(__file__), "funnel_common.py")
)
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)


def get_config():
    return _common.funnel_config("10-10-10", 1024, "electra")
