"""GLUE QNLI with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/qnli.py --config.data_dir=glue_data/QNLI \
        --config.init_from=xlnet-large-cased --workdir=runs/qnli

An alias of `configs/finetune/glue.py:qnli`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("qnli")
