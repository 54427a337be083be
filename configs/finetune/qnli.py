"""GLUE QNLI with the generic GLUE setting of `glue.py` (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/qnli.py --config.data_dir=glue_data/QNLI \
        --config.init_from=xlnet-large-cased --workdir=runs/qnli
"""

from configs.finetune import glue


def get_config():
    c = glue.get_config()
    c.task = "glue/qnli"
    return c
