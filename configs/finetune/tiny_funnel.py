"""CPU-sized finetuning smoke/demo run with a tiny, randomly initialised Funnel-Transformer (B1-1, decoder 1).
See tiny.py for the data preparation."""

from configs.finetune import tiny
from xlgen.config import model_section


def get_config():
    c = tiny.get_config()
    c.model = model_section(
        "funnel",
        vocab_size=256,
        block_sizes=(1, 1),
        num_decoder_layers=1,
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=64,
        dropout=0.0,
        dropatt=0.0,
    )
    return c
