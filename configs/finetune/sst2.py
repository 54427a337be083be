"""GLUE SST2 with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/sst2.py --config.data_dir=glue_data/SST2 \
        --config.init_from=xlnet-large-cased --workdir=runs/sst2

An alias of `configs/finetune/glue.py:sst2`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("sst2")
