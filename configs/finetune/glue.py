"""GLUE, any task (default MRPC): XLNet `run_classifier.py` setting, seq 128, batch 32, lr 2e-5.

    xlgen finetune --config=configs/finetune/glue.py --config.task=glue/rte --config.data_dir=glue_data/RTE \
        --config.init_from=xlnet-large-cased --workdir=runs/rte

Paper presets for the large tasks and the README examples: mnli.py, stsb.py, cola.py.
"""

from configs.finetune.common import finetune_config


def get_config():
    c = finetune_config(
        "glue/mrpc", max_seq_length=128, batch_size=32, learning_rate=2e-5, total_steps=800, warmup_steps=80
    )
    c.eval_every_steps = 200
    return c
