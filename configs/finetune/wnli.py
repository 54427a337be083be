"""GLUE WNLI with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/wnli.py --config.data_dir=glue_data/WNLI \
        --config.init_from=xlnet-large-cased --workdir=runs/wnli

An alias of `configs/finetune/glue.py:wnli`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("wnli")
