"""Transformer-XL large on enwik8: 24 layers, d_model 1024, 277M parameters, 0.99 bpc (thesis Table 3.2).

Hyperparameters of the official TPU script (kimiyoung/transformer-xl `tf/scripts/enwik8_large_tpu.sh`; reference
notes §1.8 / §A2): 8 heads x 128, d_inner 3072, dropout = dropatt = 0.15, tgt_len = mem_len = 768 (the thesis text
says 784), global batch 64 on 32 TPU v3 cores, Adam lr 2.5e-4, 4K warmup then cosine, 400K steps, clip 0.25;
evaluation with tgt 128 / mem 3800 / clamp 1000 (same_length).

    xlgen plan  --config=configs/pretrain/txl_enwik8_large.py --topology=v3:4x4
    launch/tpu_vm.sh --accelerator-type=v3-32 --config=configs/pretrain/txl_enwik8_large.py --workdir=gs://B/run ...

Data: `data.source` is a prepared byte-level enwik8 directory (`xlgen prepare`, docs/data.md). Execution choices for
a v3 pod (not architecture): bfloat16 compute with float32 parameters, fully sharded parameters and optimizer state
(mesh fsdp over all 32 cores, batch 2 rows per core), layers unrolled and not rematerialised (the lowest roofline step
time that fits, docs/pod_scale.md "Remat policies" and "Scanned or unrolled").
"""

import data_pipelines
from configs.models import transformer_xl
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = transformer_xl(
        vocab_size=265,  # 9 special ids + 256 byte values (the original counts 204)
        n_layer=24,
        d_model=1024,
        d_embed=1024,
        n_head=8,
        d_head=128,
        d_inner=3072,
        mem_len=768,
        dropout=0.15,
        dropatt=0.15,
    )
    c.data = data_pipelines.default_config("lm")
    c.data.update(dict(source="data/enwik8", batch_size=64, tgt_len=768, eval_batch_size=16, eval_tgt_len=128))
    c.optimizer.update(
        dict(
            name="adam",
            warmup_steps=4000,
            min_lr_ratio=0.01,  # tf/train.py (TPU) default; train_gpu.py's is 0.004
            update_rule="original",  # tf.train.AdamOptimizer (eps 1e-8 outside the bias correction)
        )
    )
    c.eval.update(dict(mem_len=3800, same_length=True, clamp_len=1000, metric="bpc"))
    c.mesh.update(dict(data=1, fsdp=-1))
    c.checkpoint.every_steps = 5000
    c.total_steps = 400_000
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c
