"""XLNet-Large pretraining as in the thesis: 512 TPU v3 chips (`v3:16x32`, 1024 cores), batch 2048, 500K steps.

Architecture and data flags of the official README command (zihangdai/xlnet; reference notes §2.8 / §2.10 / §A1):
24 layers, d_model 1024, 16 heads x 64, d_inner 4096, gelu, untie_r, seq_len 512, reuse_len 256, mem_len 384,
perm_size 256, bi_data, mask_alpha 6 / mask_beta 1, num_predict 85, SentencePiece 32K (cased). Optimiser from the
paper's appendix (v2, recalled in the notes): Adam(W) lr 4e-4, 40K warmup then linear decay, eps 1e-6, weight decay
0.01, clip 1.0, dropout = dropatt = 0.1. The final paper trains with batch 8192: `xlnet_large_bsz8192.py`.

    xlgen plan  --config=configs/pretrain/xlnet_large.py --topology=v3:16x32
    launch/tpu_vm.sh --accelerator-type=v3-1024 --config=configs/pretrain/xlnet_large.py --workdir=gs://B/run ...

Execution choices for a v3 pod (not architecture; `xlgen plan` shows they fit 16 GiB per core): bfloat16 compute
with float32 parameters and Adam moments, layers scanned and rematerialised, parameters + optimizer state sharded
16-way (mesh.fsdp) inside groups that are replicated data-parallel (mesh.data fills the rest), 2 rows per core.
"""

import data_pipelines
from xlgen.config import base_config

BATCH_SIZE = 2048


def get_config(batch_size: int = BATCH_SIZE):
    c = base_config()
    c.model = dict(
        family="xlnet",
        vocab_size=32000,
        d_model=1024,
        n_layer=24,
        n_head=16,
        d_head=64,
        d_inner=4096,
        ff_activation="gelu",
        untie_r=True,
        attn_type="bi",
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        dropout=0.1,
        dropatt=0.1,
        mem_len=384,
        reuse_len=256,
        bi_data=True,
        clamp_len=-1,
        same_length=False,
        scan_layers=True,
        remat=True,
        dtype="bfloat16",
    )
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
            mask_alpha=6,
            mask_beta=1,
            max_gram=5,
            bi_data=True,
            span_unit="piece",
            eval_steps=100,
            vocab_size=32000,
        )
    )
    c.optimizer.update(
        dict(
            name="adamw",
            learning_rate=4e-4,
            warmup_steps=40_000,
            schedule="linear",
            min_lr_ratio=0.001,  # train.py default
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            weight_decay=0.01,
            clip_norm=1.0,
            # model_utils.AdamWeightDecayOptimizer: no bias correction, r_w/r_r/r_s biases decayed
            update_rule="original",
            bias_correction=False,
            weight_decay_mask="original",
        )
    )
    c.eval.update(dict(steps=100))
    c.mesh.update(dict(data=-1, fsdp=16, tensor=1, rules="fsdp"))
    c.checkpoint.update(dict(every_steps=5000, keep=3, save_mems=True))
    c.total_steps = 500_000
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c
