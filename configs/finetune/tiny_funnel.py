"""CPU-sized finetuning smoke/demo run with a tiny, randomly initialised Funnel-Transformer (B1-1, decoder 1).
See tiny.py for the data preparation."""

from ml_collections import ConfigDict

from configs.finetune import tiny

TINY_FUNNEL = dict(
    family="funnel",
    vocab_size=256,
    block_sizes=(1, 1),
    block_repeats=None,
    num_decoder_layers=1,
    d_model=32,
    n_head=2,
    d_head=16,
    d_inner=64,
    d_embed=None,
    hidden_act="gelu_new",
    dropout=0.0,
    dropatt=0.0,
    dropact=0.0,
    layer_norm_eps=1e-9,
    init_std=0.02,
    pooling_type="mean",
    attention_type="relative_shift",
    separate_cls=True,
    truncate_seq=True,
    pool_q_only=True,
    mlm_transform=False,
    hf_block1_residual=False,
    remat="none",
    dtype="float32",
    param_dtype="float32",
    scores_dtype="float32",
    softmax_dtype="float32",
    logits_dtype="float32",
)


def get_config():
    c = tiny.get_config()
    c.model = ConfigDict(TINY_FUNNEL)
    return c
