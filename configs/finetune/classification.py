"""Long-text classification (IMDB, Yelp-2/5, DBpedia, AG, Amazon-2/5; default yelp2): seq 512, batch 32,
lr 2e-5, 4000 steps, warmup 500 (the XLNet IMDB setting). "dev" is the test file (these datasets have no official
dev split; the papers report test error). `get_config(task)` (`classification.py:yelp5`) starts from the task's
paper preset if it has one; `imdb.py` and `yelp5.py` are aliases.

    xlgen finetune --config=configs/finetune/classification.py --config.task=ag --config.data_dir=ag_news_csv \
        --config.init_from=xlnet-large-cased --workdir=runs/ag

Presets: IMDB, XLNet README (TPU v3-8, Large; expected acc 0.962+; data_dir holds aclImdb/): the generic setting.
Yelp-5, XLNet-Large paper preset (v2 appendix): batch 128, lr 1e-5, 10K steps, warmup 1000, layer decay 1.0.
"""

from configs.finetune.common import finetune_config

GENERIC = dict(max_seq_length=512, batch_size=32, learning_rate=2e-5, total_steps=4000, warmup_steps=500)
# task -> (finetune_config keywords, eval_every_steps)
PRESETS = {"yelp5": (dict(batch_size=128, learning_rate=1e-5, total_steps=10000, warmup_steps=1000), 2000)}


def get_config(task: str = "yelp2"):
    overrides, eval_every = PRESETS.get(task, ({}, 1000))
    c = finetune_config(task, **(GENERIC | overrides))
    c.data.eval_batch_size = 16
    c.eval_every_steps = eval_every
    return c
