"""IMDB, XLNet README (TPU v3-8, Large): seq 512, batch 32, lr 2e-5, 4000 steps, warmup 500 (expected acc 0.962+).
data_dir holds aclImdb/. An alias of `configs/finetune/classification.py:imdb`."""

from configs.finetune import classification


def get_config():
    return classification.get_config("imdb")
