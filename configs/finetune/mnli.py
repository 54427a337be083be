"""MNLI, XLNet-Large paper preset (XLNet v2 appendix): seq 128, batch 128, lr 2e-5, 10K steps, layer decay 1.0.
Reports accuracy (matched dev) and accuracy_mm (mismatched dev); writes MNLI-m.tsv / MNLI-mm.tsv."""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "glue/mnli", max_seq_length=128, batch_size=128, learning_rate=2e-5, total_steps=10000, warmup_steps=1000
    )
    c.eval_every_steps = 2000
    return c
