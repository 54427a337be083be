"""Generative Domain-Adaptive Nets (thesis §3.2): semi-supervised SQuAD-style QA with generated questions.

    xlgen train --config=configs/ssl/gdan.py --config.method=sl|context|context_domain|gen|gen_domain|gen_domain_adv \
        --config.data.labeled=SQUAD_JSON --config.data.unlabeled=TEXT --config.data.labeling_rate=R --workdir=W
    xlgen eval --workdir=W          # eval_results.json: the official scorer's exact / f1 on the test articles

The reader is xlgen's own SQuAD model (`model.reader_family`: xlnet or funnel; a tiny randomly initialised one
here, `model.reader` its fields) with the domain tags as input tokens; the generator a GRU seq2seq with copy.
Sizes are for the local stand-in data (docs/gdan.md); on real SQuAD raise paragraph_len (~150-300 words with
windows), question_len (~30), vocab_size (~50k), the models and the steps.
"""

import ml_collections

from xlgen.config import base_config, model_section


def _adam(learning_rate, clip_norm=1.0):
    return ml_collections.ConfigDict(dict(learning_rate=learning_rate, b1=0.9, b2=0.999, clip_norm=clip_norm))


def get_config():
    c = base_config()
    c.method = "gen_domain_adv"  # sl | context | context_domain | gen | gen_domain | gen_domain_adv (Table 3.4)
    # the reader: a tiny XLNet (fields of XLNetConfig; vocab_size comes from the data); dropout off: the game keeps no
    # per-step RNG streams for it. Generator widths: GdanConfig's defaults
    reader = dict(d_model=64, n_layer=2, n_head=4, d_head=16, d_inner=128, dropout=0.0, dropatt=0.0)
    c.model = model_section("gdan", reader=reader)
    c.objective = "gdan"
    c.data = ml_collections.ConfigDict(
        dict(
            labeled="",  # SQuAD v1.1 JSON (split by article below)
            unlabeled="",  # text file: paragraphs separated by blank lines
            labeling_rate=0.1,  # fraction of the train split's questions in L (whole articles)
            split_seed=0,  # article permutation; also the unlabeled answers' subsample
            test_fraction=0.1,  # of the articles (the thesis: 10% of SQuAD's training set)
            dev_fraction=0.1,
            paragraph_len=64,  # words per window (training: centred on the answer; eval: every Tp/2 words)
            question_len=16,  # question words + <eos>
            max_answer_words=12,
            vocab_size=4000,  # the models' vocabulary: specials, then the words of L (questions, paragraphs) and U by count
            extractor="rules",  # answer candidates on U: xlgen.systems.gdan.text.EXTRACTORS or "module:function"
            answers_per_paragraph=5,  # §3.2.5: five answers per paragraph
            context_window=5,  # the context baseline's W
            max_unlabeled_paragraphs=0,  # 0 = all
            labeled_batch_size=32,
            unlabeled_batch_size=32,
            eval_batch_size=128,
            seed=0,  # batch s is a function of (seed, s)
        )
    )
    c.gdan = ml_collections.ConfigDict(
        dict(
            gen_pretrain_steps=300,  # Algorithm 1's "Initialize G by MLE training on L" (generative methods)
            reader_during_pretrain=True,  # D trains on L meanwhile (same D updates for every method)
            d_steps=1,  # T_D: D updates per step
            g_steps=1,  # T_G: G updates per step
            generation="sample",  # U_G's questions: sampled from G (or greedy)
            unlabeled_weight=1.0,  # J(L) + w J(U)
        )
    )
    c.players = ml_collections.ConfigDict(dict(disc=_adam(1e-3), gen=_adam(1e-3)))
    c.checkpoint.update(dict(every_steps=500, keep=2, async_save=False, save_mems=False))
    c.mesh.rules = "dp"
    c.eval.update(dict(split="test", metric="f1"))
    c.total_steps = 1200
    c.eval_every_steps = -1
    c.tensorboard = False
    c.divergence_factor = 0.0  # D's loss grows when U's term starts: not a divergence
    return c
