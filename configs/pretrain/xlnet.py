"""XLNet pretraining, one file: `get_config(arg)` with arg = `large` (default), `large_bsz8192`, `base` or `tiny`.

    xlgen train --config=configs/pretrain/xlnet.py:tiny --workdir=/tmp/xlnet_tiny
    xlgen plan  --config=configs/pretrain/xlnet.py:large --topology=v3:16x32

`large`: XLNet-Large as in the thesis: 512 TPU v3 chips (`v3:16x32`, 1024 cores), batch 2048, 500K steps.
Architecture and data flags of the official README command (zihangdai/xlnet; reference notes §2.8 / §2.10 / §A1):
24 layers, d_model 1024, 16 heads x 64, d_inner 4096, gelu, untie_r, seq_len 512, reuse_len 256, mem_len 384,
perm_size 256, bi_data, mask_alpha 6 / mask_beta 1, num_predict 85, SentencePiece 32K (cased). Optimiser from the
paper's appendix (v2, recalled in the notes): Adam(W) lr 4e-4, 40K warmup then linear decay, eps 1e-6, weight decay
0.01, clip 1.0, dropout = dropatt = 0.1. Execution choices for a v3 pod (not architecture; `xlgen plan` shows they
fit 16 GiB per core): bfloat16 compute with float32 parameters and Adam moments, layers unrolled and not
rematerialised (the roofline is lowest so), parameters + optimizer state sharded 16-way (mesh.fsdp) inside
groups that are replicated data-parallel (mesh.data fills the rest), 2 rows per core.

`large_bsz8192`: the final paper's batch of 8192 (same steps and optimiser).

`base`: XLNet-Base (BooksCorpus + Wikipedia, the ablation setting of thesis §2.8 / Table 4.x). Architecture of the
released cased_L-12_H-768_A-12 checkpoint (reference notes §A1): 12 layers, d_model 768, 12 heads x 64, d_inner
3072; data flags as Large. The thesis gives no Base optimiser flags; the paper says the Base ablations follow
BERT-Base's budget, so: batch 256, 1M steps, lr 1e-4 with 10K warmup and linear decay, eps 1e-6, weight decay 0.01.

`tiny`: CPU-sized, two layers of d_model 64 on the embedded tinyshakespeare corpus (character vocabulary).
"""

import data_pipelines
from configs.tiny import OPTIMIZER, tiny_run
from xlgen.config import base_config, model_section


def model(**sizes) -> dict:
    """The `config.model` section shared by every variant: XLNetConfig's defaults (the released checkpoints'
    architecture, XLNet-Large's sizes) with pretraining's memory and bidirectional data, and the variant's sizes and
    execution choices."""
    pretraining = dict(mem_len=384, reuse_len=256, bi_data=True, scan_layers=True, remat="full", dtype="bfloat16")
    return model_section("xlnet", **(pretraining | sizes))


def paper_config(*, batch_size: int, learning_rate: float, warmup_steps: int, total_steps: int, fsdp: int, **sizes):
    """A paper-sized run: SentencePiece 32K data in `data/xlnet_pretrain`, the original optimiser (AdamWeightDecay:
    no bias correction, r_w/r_r/r_s biases decayed), TPU v3 execution."""
    c = base_config()
    # bfloat16 compute is the original's `use_bfloat16` path (train.py:131, off by default and not in the README
    # command; `tf.tpu.bfloat16_scope` in function_builder.py:124-130). It has no mixed mode: every float is
    # bfloat16 (modeling.py:454 tf_float), so the scores, their `- 1e30 * attn_mask` and tf.nn.softmax are too
    # (modeling.py:133-158; XLA's softmax sums the exps in float32 and divides in bfloat16, as jax.nn.softmax)
    # layers unrolled, not scanned: a scan writes every layer's saved activations into stacked arrays and reads
    # them back out, memory-bound passes an unrolled step does not have (XLNet-Base on v3:4x4: 71 against 82 ms
    # per step by the roofline; docs/pod_scale.md "Scanned or unrolled")
    c.model = model(**(dict(scores_dtype="bfloat16", softmax_dtype="bfloat16", scan_layers=False) | sizes))
    c.data = data_pipelines.default_config("xlnet")
    c.data.update(
        dict(
            source="data/xlnet_pretrain",
            batch_size=batch_size,
            eval_batch_size=64,
            seq_len=512,
            reuse_len=256,
            perm_size=256,
            num_predict=85,
            span_unit="piece",
            eval_steps=100,
            vocab_size=32000,
        )
    )
    c.optimizer.update(
        dict(
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            schedule="linear",
            min_lr_ratio=0.001,  # train.py default
            eps=1e-6,
            weight_decay=0.01,
            clip_norm=1.0,
            update_rule="original",
            bias_correction=False,
            weight_decay_mask="original",
        )
    )
    c.eval.update(dict(steps=100))
    c.mesh.fsdp = fsdp
    c.checkpoint.every_steps = 5000
    c.total_steps = total_steps
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c


def large(batch_size: int = 2048):
    c = paper_config(batch_size=batch_size, learning_rate=4e-4, warmup_steps=40_000, total_steps=500_000, fsdp=16)
    c.checkpoint.save_mems = True
    # no remat fits at 2 and 8 rows per core (batch 2048: 3.5 GiB per core; 8192: 12.3 GiB of 16) and has the lower
    # roofline step time, since the steps are HBM-bound (docs/pod_scale.md "Remat policies")
    c.model.remat = "none"
    return c


def base():
    c = paper_config(
        batch_size=256,
        learning_rate=1e-4,
        warmup_steps=10_000,
        total_steps=1_000_000,
        fsdp=8,
        d_model=768,
        n_layer=12,
        n_head=12,
        d_inner=3072,
    )
    # no remat fits at 8 rows per core (4.3 GiB per core on v3:4x4) and has the lower roofline step time, as for
    # Large (docs/pod_scale.md "Remat policies")
    c.model.remat = "none"
    return c


def tiny():
    c = base_config()
    c.model = model(
        vocab_size=74,
        d_model=64,
        n_layer=2,
        n_head=4,
        d_head=16,
        d_inner=256,
        mem_len=32,
        reuse_len=16,
        scan_layers=False,
        remat="none",
        dtype="float32",
    )
    c.data = data_pipelines.default_config("xlnet")
    c.data.update(
        dict(
            batch_size=8,
            eval_batch_size=8,
            seq_len=32,
            reuse_len=16,
            perm_size=16,
            num_predict=6,
            span_unit="piece",
            eval_steps=10,
        )
    )
    return tiny_run(c, optimizer=dict(OPTIMIZER, schedule="linear"))


VARIANTS = {"large": large, "large_bsz8192": lambda: large(batch_size=8192), "base": base, "tiny": tiny}


def get_config(arg: str = "large"):
    if arg not in VARIANTS:
        raise ValueError(f"configs/pretrain/xlnet.py:{arg}: unknown variant; expected one of {sorted(VARIANTS)}")
    return VARIANTS[arg]()
