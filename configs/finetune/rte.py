"""GLUE RTE with the generic GLUE setting (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/rte.py --config.data_dir=glue_data/RTE \
        --config.init_from=xlnet-large-cased --workdir=runs/rte

An alias of `configs/finetune/glue.py:rte`.
"""

from configs.finetune import glue


def get_config():
    return glue.get_config("rte")
