"""GLUE MRPC with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/mrpc.py --config.data_dir=glue_data/MRPC \
        --config.init_from=xlnet-large-cased --workdir=runs/mrpc

An alias of `configs/finetune/glue.py:mrpc`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("mrpc")
