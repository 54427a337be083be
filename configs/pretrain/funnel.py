"""Funnel-Transformer, paper-sized pretraining: one config parameterised by `B<blocks>H<d_model>_<objective>`.

    xlgen plan  --config=configs/pretrain/funnel.py:B10-10-10H1024_electra --topology=v3:16x32
    xlgen train --config=configs/pretrain/funnel.py:B6-6-6H768_mlm --workdir=runs/funnel

`<blocks>` like `6-6-6` or `6-3x2-3x2` (`3x2` = 3 parameter sets, each
applied twice), `<d_model>` 768 (base scale) or 1024 (large scale), `<objective>` `mlm` or `electra`. The ten paper
configs `funnel_B*H*_{mlm,electra}.py` are two-line aliases of this file. Default: B6-6-6H768_mlm.

Thesis §3.5 / Table 5.10, reference notes §3.9 / §A3:
  * base scale (H768: B4-4-4, B6-6-6, B6-3x2-3x2): Wikipedia + BookCorpus, batch 256, 1M steps;
  * large scale (H1024: B8-8-8, B10-10-10): the five XLNet/ELECTRA datasets, batch 8K, 500K steps;
  * seq_len 512, 2 decoder layers, mean pooling of size 2 with separate [CLS], truncate_seq, pool_q_only,
    uncased WordPiece (30,522), gelu_new, dropout = dropatt = 0.1, LayerNorm eps 1e-9, init std 0.02;
  * Adam beta2 0.99, eps 1e-6, clip 1.0, the original AdamW update with bias correction and no weight-decay
    exclusions (`optimization.py`); ELECTRA: generator width x0.25, disc_coeff 50;
  * MLM: `lm_proj` before the tied softmax (model.mlm_transform) and [MASK] hidden from attention
    (data.hide_masks_from_attention), as `pretrain.py` / `input_func_builder.py`.
  * The learning rates and warmup are not in the thesis: 1e-4 (base) / 2e-4 (large) with 10K warmup and linear
    decay, weight decay 0.01, follow ELECTRA's published settings.
Execution (not architecture): on TPU the factorized (gather-free) relative attention of the original TPU code,
bfloat16 compute with float32 parameters, rematerialised layers for the large scale.
"""

import re

import data_pipelines
from xlgen.config import base_config, model_section

DEFAULT = "B6-6-6H768_mlm"
_NAME = re.compile(r"B(?P<blocks>\d+(?:x\d+)?(?:-\d+(?:x\d+)?)*)H(?P<d_model>\d+)_(?P<objective>mlm|electra)")


def get_config(arg: str = DEFAULT):
    """`arg` = `B<blocks>H<d_model>_<objective>`, e.g. `B10-10-10H1024_electra`."""
    m = _NAME.fullmatch(arg or DEFAULT)
    if m is None:
        raise ValueError(
            f"{arg!r}: expected B<blocks>H<d_model>_<mlm|electra>, e.g. B6-6-6H768_mlm or B6-3x2-3x2H768_electra"
        )
    return funnel_config(m["blocks"], int(m["d_model"]), m["objective"])


def funnel_config(block_sizes: str, d_model: int, objective: str):
    """`block_sizes` like "10-10-10" or "6-3x2-3x2"; d_model 768 (base scale) or 1024 (large scale)."""
    if objective not in ("mlm", "electra"):
        raise ValueError(f"objective={objective!r}: expected mlm or electra")
    large = d_model >= 1024
    c = base_config()
    c.model = model_section(
        "funnel",  # FunnelConfig's defaults: the paper's architecture flags (vocabulary, decoder, pooling, dropout)
        block_sizes=block_sizes,
        d_model=d_model,
        n_head=d_model // 64,
        d_inner=4 * d_model,
        attention_type="factorized",
        # The original MLM (modeling.py lm_logits) always applies `lm_proj` (dense + activation + LayerNorm) before
        # the tied softmax; its ELECTRA generator too (here because its width differs from the embedding's).
        mlm_transform=objective == "mlm",
        remat="full" if large else "none",
        dtype="bfloat16",
        # the original TPU code's attention precision (tensorflow/ops.py rel_attn_core, lines 281-351, under
        # `use_bfloat16=True`, "always" per tensorflow/README.md): scores and their mask in bfloat16, the softmax
        # in float32 (`safe_softmax`: cast in, tf.nn.softmax, cast back), probabilities x values in bfloat16
        scores_dtype="bfloat16",
    )
    c.objective = "funnel_electra" if objective == "electra" else "funnel_mlm"
    # The MLM / generator softmax runs only at the masked positions, as the original code's `num_predict` +
    # `target_mapping` (tensorflow/pretrain.py): the pipeline masks round(0.15 * chunk) <= ceil(0.15 * 512) = 77
    # tokens per row, so nothing is dropped, and the 30,522-way head costs 77/512 of a full-length one.
    c.objective_options.max_predictions = 77  # disc_coeff 50, generator_width 0.25: the defaults
    c.data = data_pipelines.default_config("electra" if objective == "electra" else "mlm")
    c.data.update(
        dict(
            source="data/funnel_pretrain",
            batch_size=8192 if large else 256,
            eval_batch_size=64,
            seq_len=512,
            eval_steps=100,
            vocab_size=30522,
            hide_masks_from_attention=objective == "mlm",  # input_mask = is_mask | is_pad (input_func_builder.py)
        )
    )
    c.optimizer.update(
        dict(
            learning_rate=2e-4 if large else 1e-4,
            warmup_steps=10_000,
            schedule="linear",
            b2=0.99,
            eps=1e-6,
            weight_decay=0.01,
            clip_norm=1.0,
            # optimization.py's AdamWeightDecayOptimizer: adam_correction=True (on the whole update, decay included),
            # use_wd_exclusion=False (every parameter decayed)
            update_rule="original",
            bias_correction=True,
            weight_decay_mask="all",
        )
    )
    c.eval.update(dict(steps=100))
    c.mesh.fsdp = 16 if large else 1
    c.checkpoint.update(dict(every_steps=5000, save_mems=False))
    c.total_steps = 500_000 if large else 1_000_000
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c
