"""MNLI, XLNet-Large paper preset (XLNet v2 appendix): seq 128, batch 128, lr 2e-5, 10K steps, layer decay 1.0.
Reports accuracy (matched dev) and accuracy_mm (mismatched dev); writes MNLI-m.tsv / MNLI-mm.tsv.

An alias of `configs/finetune/glue.py:mnli`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("mnli")
