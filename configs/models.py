"""`config.model` sections shared by several config files, defined once: each config gives its sizes and execution
choices (XLNet's variants share theirs inside `configs/pretrain/xlnet.py`)."""


def transformer_xl(**sizes) -> dict:
    """`config.model` for Transformer-XL: the shared flags, with the variant's sizes, dropout, vocabulary/adaptive
    softmax and execution choices (`sizes` overrides any key)."""
    return (
        dict(
            family="transformer_xl",
            cutoffs=(),
            div_val=1,
            clamp_len=-1,
            same_length=False,
            untie_r=True,
            proj_share_all_but_first=False,
            tie_word_embeddings=True,
            dropout=0.1,
            dropatt=0.0,
            init_std=0.02,
            proj_init_std=0.01,
            layer_norm_epsilon=1e-5,
            scan_layers=False,
            remat="none",
            dtype="bfloat16",
            param_dtype="float32",
            # the original TPU code (kimiyoung/transformer-xl tf/) is float32 throughout: scores and softmax too
            scores_dtype="float32",
            softmax_dtype="float32",
            logits_dtype="float32",
        )
        | sizes
    )
