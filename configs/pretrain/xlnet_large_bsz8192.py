"""XLNet-Large pretraining as in the final paper: batch 8192 on 512 TPU v3 chips (`v3:16x32`), 500K steps.

Same model, data flags and optimiser as `xlnet_large.py` (the thesis setup, batch 2048); only the global batch
differs (8 rows per v3 core). Paper appendix (v2): lr 4e-4, 40K warmup, linear decay, eps 1e-6, weight decay 0.01.

    xlgen plan  --config=configs/pretrain/xlnet_large_bsz8192.py --topology=v3:16x32
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location("xlnet_large", os.path.join(os.path.dirname(__file__), "xlnet_large.py"))
_large = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_large)


def get_config():
    return _large.get_config(batch_size=8192)
