"""Transformer-XL pretraining, one file: `get_config(arg)` with arg = `wt103_large` (default), `wt103_base`,
`enwik8_large` or `enwik8_base`; hyperparameters of the official scripts (kimiyoung/transformer-xl; reference
notes §1.8 / §A2). Every paper-sized run: Adam lr 2.5e-4, cosine decay, clip 0.25, a log line every 100 steps.

    xlgen plan  --config=configs/pretrain/txl.py:wt103_large --topology=v3:4x8
    xlgen train --config=configs/pretrain/txl.py:enwik8_base --workdir=DIR --config.data.source=PREPARED_DIR

`wt103_large`: 18 layers, d_model 1024, adaptive input/softmax, 18.3 ppl (thesis Table 3.1); `tf/scripts/
wt103_large_tpu.sh`: 16 heads x 64, d_inner 4096, dropout = dropatt = 0.2, tgt_len = mem_len = 384, cutoffs
[20000, 40000, 200000] and div_val 4 (projections shared except the head's), untie_r, init_std 0.005, global batch
128 on 64 TPU v3 cores, 16K warmup, 4M steps; evaluation tgt 128 / mem 1600 / clamp 1000 with same_length. Data: a
prepared word-level WikiText-103 directory (267,735 words; `xlgen prepare`, docs/data.md). Execution: bfloat16
compute, float32 parameters, parameters and optimizer state sharded over all 64 cores (the adaptive tables' rows
padded to a multiple of 1024 for that).

`wt103_base` ("standard"): 16 layers, d_model 410, 151M parameters, 24.0 ppl (Table 3.1); `pytorch/run_wt103_base.sh`:
10 heads x 41, d_inner 2100, dropout 0.1, dropatt 0.0, tgt_len = mem_len = 150, batch 60, cutoffs as large (div_val
1), no warmup, 200K steps; evaluation tgt 64 / mem 640 / clamp 400 with same_length.

`enwik8_large`: 24 layers, d_model 1024, 277M parameters, 0.99 bpc (thesis Table 3.2); `tf/scripts/
enwik8_large_tpu.sh`: 8 heads x 128, d_inner 3072, dropout = dropatt = 0.15, tgt_len = mem_len = 768 (the thesis
text says 784), global batch 64 on 32 TPU v3 cores, 4K warmup, 400K steps; evaluation tgt 128 / mem 3800 / clamp 1000
(same_length). Execution for a v3 pod: bfloat16 compute with float32 parameters, fully sharded parameters and
optimizer state (mesh fsdp over all 32 cores, batch 2 rows per core), layers unrolled and not rematerialised (the
lowest roofline step time that fits, docs/pod_scale.md "Remat policies" and "Scanned or unrolled").

`enwik8_base`: 12 layers, d_model 512, 41M parameters, 1.06 bpc (thesis Table 3.2): 8 heads x 64, d_inner 2048,
dropout 0.1, dropatt 0.0, tgt_len = mem_len = 512, batch 24, no warmup, cosine to 0.004 x lr over 400K steps;
evaluation tgt 80 / mem 2100 / clamp 820.

The enwik8 runs read a prepared byte-level directory (`xlgen prepare`, docs/data.md).
"""

import data_pipelines
from configs.models import transformer_xl
from xlgen.config import base_config

BYTE_VOCAB = 265  # enwik8: 9 special ids + 256 byte values (the original counts 204)
WT103_CUTOFFS = (20000, 40000, 200000)
# tf/train.py (TPU): cosine to 0.01 x lr (train_gpu.py's floor is 0.004); tf.train.AdamOptimizer's update (eps 1e-8
# outside the bias correction)
TPU_ADAM = dict(min_lr_ratio=0.01, update_rule="original")
TPU_V3_PEAK_FLOPS = 61.5e12  # one TPU v3 TensorCore, bf16


def paper_config(model: dict, **keys):
    """A paper-sized run: `model` over `configs.models.transformer_xl`, the `lm` stream, Adam (the defaults' lr
    2.5e-4, cosine, clip 0.25), evaluation with same_length, a log line every 100 steps; `keys`: a section's
    differences (a dict: data, optimizer, eval, mesh, checkpoint) or a top-level key's value."""
    c = base_config()
    c.model = transformer_xl(**model)
    c.data = data_pipelines.default_config("lm")
    c.optimizer.name = "adam"
    c.eval.same_length = True
    c.log_every_steps = 100
    for key, value in keys.items():
        if isinstance(value, dict):
            c[key].update(value)
        else:
            c[key] = value
    return c


def wt103_large():
    model = dict(
        cutoffs=WT103_CUTOFFS,
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
        # cluster tables stored with rows rounded up to 1024 (20480 / 20480 / 160768 / 68608): every table splits
        # over up to 128 fsdp devices in whole (8, 128) tiles. With the exact 67,735 rows the last cluster stayed
        # whole on each of the 64 cores (update and relayouts 1.3 ms per step) and the 20,000-row tables split by
        # columns (16 and 4 per core, padded to 128 lanes); docs/pod_scale.md. Loading and exporting use the exact
        # sizes.
        table_rows_multiple=1024,
    )
    # mesh 2 x 32: the lowest roofline of the meshes of 64 cores (compared with the padded tables: 35.5 ms against
    # 36.3 ms for 1 x 64 and 36.6 ms for 4 x 16; docs/pod_scale.md): at 64-way, XLA:TPU gathers the weights as
    # all-reduces of zero-filled buffers
    return paper_config(
        model,
        data=dict(source="data/wt103", vocab="word", batch_size=128, tgt_len=384, eval_batch_size=16, eval_tgt_len=128),
        optimizer=dict(warmup_steps=16_000) | TPU_ADAM,
        eval=dict(mem_len=1600, clamp_len=1000),
        mesh=dict(data=2, fsdp=-1),
        checkpoint=dict(every_steps=10_000),
        total_steps=4_000_000,
        eval_every_steps=20_000,
        peak_flops_per_device=TPU_V3_PEAK_FLOPS,
    )


def wt103_base():
    sizes = dict(n_layer=16, d_model=410, d_embed=410, n_head=10, d_head=41, d_inner=2100, mem_len=150)
    return paper_config(
        dict(cutoffs=WT103_CUTOFFS, **sizes),
        data=dict(source="data/wt103", vocab="word", batch_size=60, tgt_len=150, eval_batch_size=10, eval_tgt_len=64),
        eval=dict(mem_len=640, clamp_len=400),
        checkpoint=dict(every_steps=5000),
        total_steps=200_000,
        eval_every_steps=5000,
    )


def enwik8_large():
    sizes = dict(n_layer=24, d_model=1024, d_embed=1024, n_head=8, d_head=128, d_inner=3072, mem_len=768)
    return paper_config(
        dict(vocab_size=BYTE_VOCAB, dropout=0.15, dropatt=0.15, **sizes),
        data=dict(source="data/enwik8", batch_size=64, tgt_len=768, eval_batch_size=16, eval_tgt_len=128),
        optimizer=dict(warmup_steps=4000) | TPU_ADAM,
        eval=dict(mem_len=3800, clamp_len=1000, metric="bpc"),
        mesh=dict(data=1, fsdp=-1),
        checkpoint=dict(every_steps=5000),
        total_steps=400_000,
        eval_every_steps=10_000,
        peak_flops_per_device=TPU_V3_PEAK_FLOPS,
    )


def enwik8_base():
    sizes = dict(n_layer=12, d_model=512, d_embed=512, n_head=8, d_inner=2048, mem_len=512)
    return paper_config(
        dict(vocab_size=BYTE_VOCAB, **sizes),
        data=dict(source="data/enwik8", batch_size=24, tgt_len=512, eval_batch_size=8, eval_tgt_len=80),
        optimizer=dict(min_lr_ratio=0.004),
        eval=dict(mem_len=2100, clamp_len=820, metric="bpc"),
        checkpoint=dict(every_steps=5000),
        total_steps=400_000,
        eval_every_steps=10_000,
    )


VARIANTS = {f.__name__: f for f in (wt103_large, wt103_base, enwik8_large, enwik8_base)}


def get_config(arg: str = "wt103_large"):
    if arg not in VARIANTS:
        raise ValueError(f"configs/pretrain/txl.py:{arg}: unknown variant; expected one of {sorted(VARIANTS)}")
    return VARIANTS[arg]()
