"""`xlgen finetune`: train a pretrained XLNet / Funnel model on GLUE, SQuAD, RACE or long-text classification.

    xlgen finetune --config=configs/finetune/glue.py --config.task=glue/mrpc --config.data_dir=DATA/MRPC \
                   --config.init_from=PRETRAINED --workdir=DIR

1. The model architecture comes from `init_from` (a Hugging Face directory: config.json + weights; or an xlgen
   workdir / `workdir/checkpoints/<step>`), then command-line `--config.model.*` overrides (e.g. dropout) apply.
   Parameters are restored by name where the shapes agree (partial restore); task heads that do not exist in the
   pretrained model start fresh. `init_from=""` starts from random weights (smoke tests).
2. Data: the task's official files in `data_dir` are read (`xlgen.finetune.readers`), tokenized with `tokenizer`
   (default: `spiece.model` / `vocab.txt` found in `init_from`) in the model family's input convention, and
   cached as `.npz` under `DIR/cache/` keyed by everything that affects them.
3. Training reuses the trainer's program (`build_program`: sharding, jitted/donated step, optimizer with warmup,
   decay, clipping and layer-wise LR decay), checkpoints (`DIR/checkpoints/`, resumable by re-running) and
   metrics writer (`DIR/metrics.jsonl`, TensorBoard). Long documents: `max_segments` segments per document with
   XLNet's memory carried across them; `finetune.freeze` / `finetune.lora.*` train a part of the model only.
4. Every `eval_every_steps` and at the end the dev split(s) are evaluated with the task's official metrics. The best
   checkpoint by the task's primary metric is kept in `DIR/best/`, and for it `DIR/eval_results.json` and the
   prediction files are written (temp file + rename): GLUE `dev_predictions*.tsv` and submission TSVs
   (`submission/<Task>.tsv` predicted on test.tsv), SQuAD `predictions.json`, `null_odds.json`,
   `nbest_predictions.json`, RACE/classification `dev_predictions.tsv`.

`xlgen eval --config=... --workdir=DIR` on a finetune workdir (or `xlgen finetune --eval_only ...`) re-evaluates
the best (else latest) checkpoint: `evaluate(config, workdir)`.

The package, one job per module:
    config.py      the architecture resolved from `init_from`, overrides, the workdir's stored config.json
    data.py        tokenizer, task examples and features (cached under `workdir/cache/`)
    init_from.py   pretrained parameters and the partial restore by name and shape
    peft.py        parameter-efficient finetuning: LoRA adapters from the config, merged weights for export
    evaluation.py  the jitted predictor, the task's official metrics per dev split
    outputs.py     eval_results.json, prediction files, GLUE submissions
    run.py         `xlgen finetune` (main), finetune(config, workdir) and evaluate(config, workdir)
"""

from xlgen.finetune.config import (
    is_finetune_workdir,
    load_finetune_config,
    pretrained_model_section,
    resolve_config,
    write_finetune_config,
)
from xlgen.finetune.data import load_tokenizer, localize_data_dir, split_examples_and_features
from xlgen.finetune.evaluation import Predictor, evaluate_split, run_evaluation
from xlgen.finetune.init_from import load_pretrained_into, match_pretrained, pretrained_params
from xlgen.finetune.outputs import EVAL_RESULTS, write_artefacts, write_test_predictions
from xlgen.finetune.run import evaluate, finetune, main

__all__ = [
    "EVAL_RESULTS",
    "Predictor",
    "evaluate",
    "evaluate_split",
    "finetune",
    "is_finetune_workdir",
    "load_finetune_config",
    "load_pretrained_into",
    "load_tokenizer",
    "localize_data_dir",
    "main",
    "match_pretrained",
    "pretrained_model_section",
    "pretrained_params",
    "resolve_config",
    "run_evaluation",
    "split_examples_and_features",
    "write_artefacts",
    "write_finetune_config",
    "write_test_predictions",
]
