"""XLNet-Base pretraining (BooksCorpus + Wikipedia, the ablation setting of thesis §2.8 / Table 4.x).

Architecture of the released cased_L-12_H-768_A-12 checkpoint (reference notes §A1): 12 layers, d_model 768, 12 heads
x 64, d_inner 3072, gelu, untie_r; data flags as XLNet-Large (seq 512, reuse 256, mem 384, perm 256, bi_data,
num_predict 85). The thesis gives no Base optimiser flags; the paper says the Base ablations follow BERT-Base's
budget, so: batch 256, 1M steps, lr 1e-4 with 10K warmup and linear decay, eps 1e-6, weight decay 0.01.

    xlgen plan  --config=configs/pretrain/xlnet_base.py --topology=v3:4x4
"""

import data_pipelines
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model = dict(
        family="xlnet",
        vocab_size=32000,
        d_model=768,
        n_layer=12,
        n_head=12,
        d_head=64,
        d_inner=3072,
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
            batch_size=256,
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
            learning_rate=1e-4,
            warmup_steps=10_000,
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
    c.mesh.update(dict(data=-1, fsdp=8, tensor=1, rules="fsdp"))
    c.checkpoint.update(dict(every_steps=5000, keep=3))
    c.total_steps = 1_000_000
    c.log_every_steps = 100
    c.eval_every_steps = 10_000
    c.peak_flops_per_device = 61.5e12  # one TPU v3 TensorCore, bf16
    return c
