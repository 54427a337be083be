"""Shared finetuning config: every key `xlgen finetune` reads, with XLNet-style defaults.

Top-level keys (contract): `task`, `data_dir`, `init_from` (HF directory or xlgen workdir; "" = random init),
`tokenizer` ("" = spiece.model / vocab.txt inside init_from). `model` is replaced by the architecture stored in
`init_from` (command-line `--config.model.*` overrides, e.g. dropout, apply on top).
"""

from ml_collections import ConfigDict

from xlgen.config import base_config, model_section
from xlgen.models import lora


def finetune_config(
    task,
    *,
    max_seq_length=128,
    batch_size=32,
    learning_rate=2e-5,
    total_steps=1000,
    warmup_steps=100,
    lr_layer_decay_rate=1.0,
    adam_epsilon=1e-8,
):
    c = base_config()
    c.task = task
    c.data_dir = ""
    c.init_from = ""
    c.tokenizer = ""
    c.objective = "finetune"
    # XLNet-Large (cased_L-24_H-1024_A-16) as finetuned, XLNetConfig's defaults: no memory, one direction, the heads'
    # settings; used only when init_from is empty
    c.model = model_section("xlnet")
    c.data = ConfigDict(
        dict(
            max_seq_length=max_seq_length,
            batch_size=batch_size,
            eval_batch_size=32,
            doc_stride=128,
            max_query_length=64,  # SQuAD windows
            max_qa_length=128,  # RACE: last pieces of question + option kept
            lower=None,  # None: cased for SentencePiece, uncased for WordPiece
            skip_malformed=False,  # True: skip (and count) malformed rows instead of failing
            cache=True,  # cache tokenized features in WORKDIR/cache/
            seq_len=0,
            num_predict=0,
        )
    )  # derived (FLOPs accounting); do not set
    c.squad = ConfigDict(dict(max_answer_length=64, start_n_top=5, end_n_top=5, n_best_size=5))
    # Long documents (classification, regression, multiple choice; XLNet): up to max_segments consecutive segments of
    # data.max_seq_length per document, the memory carried across them; 0 = truncate to one window (docs/finetuning.md)
    c.max_segments = 0
    # Parameter-efficient finetuning (xlgen/finetune/peft.py): freeze = regex over parameter names (frozen ones leave
    # the optimizer); lora.rank > 0 = low-rank adapters on the Dense projections matching lora.targets, scaled by
    # alpha / rank, with every other parameter frozen except those matching lora.trainable (the task head)
    c.finetune = ConfigDict(
        dict(
            mem_len=0,  # memory length with max_segments > 0 (0 = data.max_seq_length)
            segment_pool="last",  # the head reads the last segment's <cls>, or "mean": the mean state of the document
            # several examples per training row, attention kept inside each (classification, regression, token
            # classification; xlgen/finetune/packing.py); pack_size: the most examples in one row
            packing=False,
            pack_size=8,
            freeze="",
            lora=ConfigDict(
                dict(
                    rank=0,
                    alpha=16.0,
                    targets=lora.TARGETS,  # regex over Dense module paths: the attention projections
                    trainable=lora.TRAINABLE,  # non-adapter parameters that still train: the task head
                )
            ),
        )
    )
    # XLNet finetuning as the original scripts ran it (run_classifier.py / run_squad.py / run_race.py with
    # weight_decay 0 -> tf.train.AdamOptimizer; model_utils.get_train_op): linear decay to 0, clip 1.0, no weight
    # decay, TF's Adam update (update_rule="original": eps outside the bias correction), layer-wise decay by
    # scaling the clipped gradients (layer_decay_mode="faithful"). Adam eps: run_classifier.py 1e-8 (GLUE, IMDB,
    # Yelp...), run_squad.py / run_race.py 1e-6. docs/fidelity.md lists these and the options.
    c.optimizer.update(
        dict(
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            schedule="linear",
            eps=adam_epsilon,
            clip_norm=1.0,
            lr_layer_decay_rate=lr_layer_decay_rate,
            layer_decay_mode="faithful",
            update_rule="original",
        )
    )
    c.checkpoint.update(dict(keep=1, save_mems=False))
    c.eval.split = "dev"
    c.eval.predict_test = True  # GLUE: write submission/<Task>.tsv from test.tsv
    c.total_steps = total_steps
    c.eval_every_steps = 1000  # and at the end; the best dev checkpoint is kept
    return c
