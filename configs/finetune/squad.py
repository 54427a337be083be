"""SQuAD 2.0 (default) or 1.1, XLNet `scripts/tpu_squad_large.sh`: seq 512, batch 48, lr 3e-5, 8000 steps,
warmup 1000, Adam eps 1e-6, layer-wise LR decay 0.75; doc_stride 128, max_query_length 64, beam
start_n_top = end_n_top = 5, max_answer_length 64. Data: train-v2.0.json / dev-v2.0.json in data_dir.

    xlgen finetune --config=configs/finetune/squad.py --config.task=squad/v2.0 --config.data_dir=squad \
        --config.init_from=xlnet-large-cased --workdir=runs/squad2
"""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "squad/v2.0",
        max_seq_length=512,
        batch_size=48,
        learning_rate=3e-5,
        total_steps=8000,
        warmup_steps=1000,
        lr_layer_decay_rate=0.75,
        adam_epsilon=1e-6,  # run_squad.py / tpu_squad_large.sh
    )
    c.data.eval_batch_size = 32
    c.eval_every_steps = 2000
    return c
