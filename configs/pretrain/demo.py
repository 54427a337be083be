"""`make demo`: a small Transformer-XL character LM on the embedded tinyshakespeare corpus (no downloads).

A few minutes on 2 CPU cores: the loss falls from ~4.3 (uniform over 74 symbols) to ~2, with evaluations (bpc)
on the held-out tail of the corpus at steps 200, 400 and 600. Re-running the same command resumes.

    xlgen train --config=configs/pretrain/demo.py --workdir=workdirs/demo
"""

from configs.pretrain import txl_tiny


def get_config():
    c = txl_tiny.get_config()
    c.model.update(dict(d_model=96, d_embed=96, n_head=4, d_head=24, d_inner=384, n_layer=3, mem_len=64, dropout=0.05))
    c.data.update(dict(batch_size=16, tgt_len=64, eval_batch_size=8, eval_tgt_len=64))
    c.optimizer.update(dict(learning_rate=2e-3, warmup_steps=40, schedule="cosine", min_lr_ratio=0.05))
    c.eval.update(dict(steps=12, mem_len=128, same_length=True))
    c.checkpoint.update(dict(every_steps=200, keep=2))
    c.total_steps = 600
    c.log_every_steps = 25
    c.eval_every_steps = 200
    return c
