"""GLUE, any task: one config parameterised by the task name; default MRPC with the generic setting.

    xlgen finetune --config=configs/finetune/glue.py:rte --config.data_dir=glue_data/RTE \
        --config.init_from=xlnet-large-cased --workdir=runs/rte
    xlgen finetune --config=configs/finetune/glue.py --config.task=glue/rte ...     (the same, generic setting)

Generic setting (XLNet `run_classifier.py`): seq 128, batch 32, lr 2e-5, 800 steps, warmup 80, eval every 200.
Paper presets replace it for three tasks (values below, with their sources):
  * MNLI: XLNet-Large paper preset (XLNet v2 appendix): batch 128, lr 2e-5, 10K steps, layer decay 1.0;
    reports accuracy (matched dev) and accuracy_mm (mismatched dev); writes MNLI-m.tsv / MNLI-mm.tsv.
  * STS-B regression: XLNet README example: batch 32 (8 x 4 GPUs), lr 5e-5, 1200 steps, warmup 120;
    reports pearson / spearman.
  * CoLA: Funnel-Transformer README preset: batch 16, lr 1e-5, 5350 steps, warmup 535; reports mcc.
The per-task files `configs/finetune/<task>.py` are two-line aliases: `get_config()` = `glue.get_config("<task>")`.
"""

from configs.finetune.common import finetune_config

TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli")
GENERIC = dict(max_seq_length=128, batch_size=32, learning_rate=2e-5, total_steps=800, warmup_steps=80)
# task -> (finetune_config keywords, eval_every_steps)
PRESETS = {
    "mnli": (dict(batch_size=128, learning_rate=2e-5, total_steps=10000, warmup_steps=1000), 2000),
    "stsb": (dict(batch_size=32, learning_rate=5e-5, total_steps=1200, warmup_steps=120), 400),
    # Funnel's optimization.py: adam_epsilon 1e-6
    "cola": (dict(batch_size=16, learning_rate=1e-5, total_steps=5350, warmup_steps=535, adam_epsilon=1e-6), 1000),
}


def get_config(task: str = "mrpc"):
    """`task`: a GLUE task name (`rte`, or `glue/rte`); its paper preset if it has one, else the generic setting."""
    name = (task or "mrpc").lower().removeprefix("glue/")
    if name not in TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}")
    overrides, eval_every = PRESETS.get(name, ({}, 200))
    c = finetune_config(f"glue/{name}", **{**GENERIC, **overrides})
    c.eval_every_steps = eval_every
    return c
