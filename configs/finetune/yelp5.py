"""Yelp-5, XLNet-Large paper preset (v2 appendix): seq 512, batch 128, lr 1e-5, 10K steps, layer decay 1.0.
An alias of `configs/finetune/classification.py:yelp5`."""

from configs.finetune import classification


def get_config():
    return classification.get_config("yelp5")
