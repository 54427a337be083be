"""GLUE QQP with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/qqp.py --config.data_dir=glue_data/QQP \
        --config.init_from=xlnet-large-cased --workdir=runs/qqp

An alias of `configs/finetune/glue.py:qqp`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("qqp")
