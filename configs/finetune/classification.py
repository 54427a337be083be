"""Long-text classification (IMDB, Yelp-2/5, DBpedia, AG, Amazon-2/5; default yelp2): seq 512, batch 32,
lr 2e-5, 4000 steps, warmup 500 (the XLNet IMDB setting). Presets: imdb.py, yelp5.py. "dev" is the test file
(these datasets have no official dev split; the papers report test error).

    xlgen finetune --config=configs/finetune/classification.py --config.task=ag --config.data_dir=ag_news_csv \
        --config.init_from=xlnet-large-cased --workdir=runs/ag
"""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "yelp2", max_seq_length=512, batch_size=32, learning_rate=2e-5, total_steps=4000, warmup_steps=500
    )
    c.data.eval_batch_size = 16
    c.eval_every_steps = 1000
    return c
