"""CPU-sized finetuning smoke/demo run: a tiny, randomly initialised XLNet (no init_from) on any task, e.g. the
synthetic SST-2 in the official format:

    python -c "from xlgen.finetune.readers import synthetic as s; s.write_glue('/tmp/sst2', 'sst2', n_train=512); \
s.train_sentencepiece(s.corpus_for('/tmp/sst2'), '/tmp/sst2/spiece.model', vocab_size=100)"
    xlgen finetune --config=configs/finetune/tiny.py --config.task=glue/sst2 --config.data_dir=/tmp/sst2 \
        --config.tokenizer=/tmp/sst2/spiece.model --workdir=/tmp/ft_sst2

`tiny_funnel.py` is the same with a tiny Funnel-Transformer.
"""

from configs.finetune.common import finetune_config
from xlgen.config import model_section


def get_config():
    c = finetune_config(
        "glue/sst2", max_seq_length=32, batch_size=16, learning_rate=1e-3, total_steps=60, warmup_steps=6
    )
    c.model = model_section(
        "xlnet",
        vocab_size=256,
        d_model=32,
        n_layer=2,
        n_head=2,
        d_head=16,
        d_inner=64,
        dropout=0.0,
        dropatt=0.0,
        summary_last_dropout=0.0,
    )
    c.data.eval_batch_size = 16
    c.optimizer.update(dict(update_rule="optax", layer_decay_mode="lr"))  # CPU demo, not a paper preset
    c.checkpoint.update(dict(every_steps=30, async_save=False))
    c.log_every_steps = 10
    c.eval_every_steps = 30
    c.tensorboard = False
    return c
