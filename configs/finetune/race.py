"""RACE, XLNet `scripts/tpu_race_large_bsz32.sh`: seq 512, max_qa_length 128, batch 32, lr 2e-5, 12K steps,
warmup 1000, Adam eps 1e-6, no weight decay (the thesis mentions 640 tokens for the final runs; set
--config.data.max_seq_length=640 for that). Reports accuracy for all, middle and high.

    xlgen finetune --config=configs/finetune/race.py --config.data_dir=RACE --config.init_from=xlnet-large-cased \
        --workdir=runs/race
"""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "race",
        max_seq_length=512,
        batch_size=32,
        learning_rate=2e-5,
        total_steps=12000,
        warmup_steps=1000,
        adam_epsilon=1e-6,  # run_race.py / tpu_race_large_bsz32.sh
    )
    c.data.eval_batch_size = 8
    c.eval_every_steps = 3000
    return c
