"""CoNLL-2003 named-entity recognition (token classification): seq 128, batch 32, lr 5e-5, 1,500 steps (~3.4 epochs
of the 14,041 training sentences), warmup 150 — the Hugging Face token-classification example's settings; scored by
entity-level precision / recall / F1 (seqeval, strict BIO).

    xlgen finetune --config=configs/finetune/conll2003.py --config.data_dir=conll2003 \
        --config.init_from=xlnet-large-cased --workdir=runs/conll2003

`data_dir` holds `train.txt`, `valid.txt` (or `dev.txt`) and `test.txt` in the CoNLL-2003 format (IOB1 tags are
converted to BIO); the workdir gets `eval_results.json` and `predictions.txt` (word, gold and predicted tag).
"""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "conll2003", max_seq_length=128, batch_size=32, learning_rate=5e-5, total_steps=1500, warmup_steps=150
    )
    c.eval_every_steps = 500
    return c
