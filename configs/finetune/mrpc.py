"""GLUE MRPC with the generic GLUE setting of `glue.py` (seq 128, batch 32, lr 2e-5); override any key.

    xlgen finetune --config=configs/finetune/mrpc.py --config.data_dir=glue_data/MRPC \
        --config.init_from=xlnet-large-cased --workdir=runs/mrpc
"""

from configs.finetune import glue


def get_config():
    c = glue.get_config()
    c.task = "glue/mrpc"
    return c
