"""`config.model` sections shared by several config files, defined once, as differences from the model dataclass's
defaults (`xlgen.config.model_section`)."""

from xlgen.config import model_section


def transformer_xl(**fields) -> dict:
    """`config.model` for Transformer-XL as the original code runs it (one vocabulary table, no clamping, bfloat16
    compute; `fields` are the variant's sizes and choices)."""
    shared = dict(cutoffs=(), div_val=1, clamp_len=-1, same_length=False, proj_share_all_but_first=False)
    return model_section("transformer_xl", **(shared | dict(dtype="bfloat16") | fields))
