"""Transformer-XL large on WikiText-103: 18 layers, d_model 1024, adaptive input/softmax, 18.3 ppl (thesis Table 3.1).

Hyperparameters of the official TPU script (`tf/scripts/wt103_large_tpu.sh`; reference notes §1.8 / §A2): 16 heads
x 64, d_inner 4096, dropout = dropatt = 0.2, tgt_len = mem_len = 384, adaptive softmax with cutoffs
[20000, 40000, 200000] and div_val 4 (projections shared except the head's), untie_r, init_std 0.005, global batch 128
on 64 TPU v3 cores, Adam lr 2.5e-4, 16K warmup then cosine, 4M steps (`--train_steps=4000000`), clip 0.25;
evaluation tgt 128 / mem 1600 / clamp 1000 with same_length.

    xlgen plan  --config=configs/pretrain/txl_wt103_large.py --topology=v3:4x8
    launch/tpu_vm.sh --accelerator-type=v3-64 --config=configs/pretrain/txl_wt103_large.py --workdir=gs://B/run ...

Data: `data.source` is a prepared word-level WikiText-103 directory (267,735 words; `xlgen prepare`, docs/data.md).
Execution choices: bfloat16 compute, float32 parameters, parameters and optimizer state sharded over all 64 cores
(the adaptive tables' rows padded to a multiple of 1024 for that).
"""

import data_pipelines
from configs.models import transformer_xl
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = transformer_xl(
        cutoffs=(20000, 40000, 200000),
        div_val=4,
        mem_len=384,
        proj_share_all_but_first=True,
        dropout=0.2,
        dropatt=0.2,
        init_std=0.005,
        # the matmul outputs saved, the element-wise work recomputed: the lowest roofline step time of the policies
        # compiled with the layers scanned (35.6 ms per step against 35.9 ms without remat and 40.5 ms with `full`;
        # 1.3 GiB per core, docs/pod_scale.md "Remat policies")
        remat="dots_no_batch",
    )
    # cluster tables stored with rows rounded up to 1024 (20480 / 20480 / 160768 / 68608): every table splits over
    # up to 128 fsdp devices in whole (8, 128) tiles. With the exact 67,735 rows the last cluster stayed whole on
    # each of the 64 cores (update and relayouts 1.3 ms per step) and the 20,000-row tables split by columns (16
    # and 4 per core, padded to 128 lanes); docs/pod_scale.md. Loading and exporting use the exact sizes.
    c.model.table_rows_multiple = 1024
    c.data = data_pipelines.default_config("lm")
    c.data.update(
        dict(source="data/wt103", vocab="word", batch_size=128, tgt_len=384, eval_batch_size=16, eval_tgt_len=128)
    )
    c.optimizer.update(
        dict(
            name="adam",
            warmup_steps=16_000,
            min_lr_ratio=0.01,  # tf/train.py (TPU) default; train_gpu.py's is 0.004
            update_rule="original",  # tf.train.AdamOptimizer (eps 1e-8 outside the bias correction)
        )
    )
    c.eval.update(dict(mem_len=1600, same_length=True, clamp_len=1000))
    # 2 x 32: the lowest roofline of the meshes of 64 cores (compared with the padded tables: 35.5 ms against
    # 36.3 ms for 1 x 64 and 36.6 ms for 4 x 16; docs/pod_scale.md): at 64-way, XLA:TPU gathers the weights as
    # all-reduces of zero-filled buffers
    c.mesh.update(dict(data=2, fsdp=-1))
    c.checkpoint.every_steps = 10_000
    c.total_steps = 4_000_000
    c.log_every_steps = 100
    c.eval_every_steps = 20_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c
