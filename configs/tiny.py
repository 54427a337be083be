"""The run settings the CPU-sized pretraining configs share (`configs/pretrain/txl_tiny.py`, `funnel_tiny.py` and
XLNet's `tiny` variant in `configs/pretrain/xlnet.py`), defined once."""

# AdamW of the tiny XLNet and Funnel models: 1e-3 peak after 20 warmup steps, decayed to 0, gradient norm clipped
# at 1, decoupled weight decay 0.01, Adam eps 1e-6 (each config names its schedule)
OPTIMIZER = dict(learning_rate=1e-3, warmup_steps=20, min_lr_ratio=0.0, clip_norm=1.0, weight_decay=0.01, eps=1e-6)


def tiny_run(c, *, optimizer: dict, eval_steps: int = 10):
    """`c` (from `xlgen.config.base_config()`) as a tiny run: 200 steps, a log line every 10, an evaluation on
    `eval_steps` batches and a checkpoint every 100 steps (3 kept); `optimizer` updates `c.optimizer`."""
    c.optimizer.update(optimizer)
    c.eval.update(dict(steps=eval_steps))
    c.checkpoint.update(dict(every_steps=100, keep=3))
    c.total_steps = 200
    c.log_every_steps = 10
    c.eval_every_steps = 100
    return c
