"""xlgen input pipelines: Transformer-XL streams, XLNet permutation-LM examples, Funnel MLM / ELECTRA inputs.

`make_pipeline(data_config, split=..., process_index=..., process_count=...)` builds the pipeline for
`data_config.pipeline` (lm | xlnet | mlm | electra). Every pipeline has `.batch(step) -> dict[str, np.ndarray]`
(this process's rows; a pure function of (seed, step, rows)), `.global_batch_size`, `.local_batch_size`,
`.vocab_size`, `.tokenizer` and `.num_steps` (None for endless training streams, an int for evaluation).
Config keys and defaults: `default_config(pipeline)`; documented in docs/data.md.
"""

from __future__ import annotations

from typing import Optional

import ml_collections

_COMMON = dict(
    pipeline="lm",
    source="tinyshakespeare",  # embedded corpus name | text file | prepared directory (manifest.json)
    sources="",  # weighted mixture of prepared corpora "DIR_A:0.75,DIR_B:0.25" (overrides `source`; mixture.py)
    mix_steps=64,  # mixtures, lm/xlnet: steps a stream stays with one source (an episode)
    sources_history=(),  # mixtures: ((until step, earlier sources), ...) — filled by the trainer on resume
    vocab="char",  # raw text sources only: char | byte | word
    valid_source="",  # raw text sources: separate valid file ("" = hold out the tail of `source`)
    valid_fraction=0.1,  # raw text sources without valid_source
    lower=False,  # raw text sources: lower-case before building the vocabulary
    use_eod=True,  # sentence layout: a blank line is <eod>
    tokenizer="",  # optional: the model's vocabulary file; must match the prepared manifest
    vocab_size=0,  # optional: the model's vocabulary size; must match the data (0 = unchecked)
    seed=0,
    batch_size=16,  # GLOBAL batch size (all processes)
    eval_batch_size=8,  # GLOBAL
)
_DEFAULTS = {
    "lm": dict(tgt_len=128, eval_tgt_len=128, rotate_passes=True),
    "xlnet": dict(
        seq_len=128,
        reuse_len=64,
        perm_size=64,
        num_predict=21,
        mask_alpha=6,
        mask_beta=1,
        max_gram=5,
        bi_data=True,
        span_unit="word",
        exact_num_predict=True,
        eval_steps=0,
    ),
    # segment_pairs: [CLS] A [SEP] B [SEP] rows with segment ids (Funnel's create_pretrain_data.py); False: one chunk
    # hide_masks_from_attention: attention_mask 0 at [MASK] inputs (Funnel's original MLM; its ELECTRA does not)
    "mlm": dict(
        seq_len=128,
        mask_prob=0.15,
        random_prob=0.1,
        keep_prob=0.1,
        eval_steps=0,
        segment_pairs=True,
        hide_masks_from_attention=False,
    ),
}
_DEFAULTS["electra"] = dict(_DEFAULTS["mlm"])


def default_config(pipeline: str = "lm") -> ml_collections.ConfigDict:
    """All `config.data` keys of a pipeline with their defaults."""
    if pipeline not in _DEFAULTS:
        raise ValueError(f"data.pipeline={pipeline!r}: expected one of {sorted(_DEFAULTS)}")
    return ml_collections.ConfigDict({**_COMMON, **_DEFAULTS[pipeline], "pipeline": pipeline})


def resolved(data_config) -> ml_collections.ConfigDict:
    """`data_config` completed with its pipeline's declared defaults (`default_config`); unknown keys are errors."""
    d = dict(data_config.to_dict() if hasattr(data_config, "to_dict") else data_config)
    pipeline = d.get("pipeline", _COMMON["pipeline"])
    cfg = default_config(pipeline)
    unknown = sorted(set(d) - set(cfg))
    if unknown:
        raise ValueError(f"unknown config.data key(s) {unknown} for pipeline {pipeline!r}; valid keys: {sorted(cfg)}")
    cfg.update(d)
    return cfg


def corpus_layout(data_config) -> str:
    """The corpus layout (`data_pipelines.corpus`) a data config's pipeline reads: "sentences" (XLNet's rows, Funnel's
    segment pairs) or "lm" (one token stream)."""
    cfg = resolved(data_config)
    if cfg.pipeline in ("mlm", "electra"):
        return "sentences" if cfg.segment_pairs else "lm"
    return "sentences" if cfg.pipeline == "xlnet" else "lm"


def corpus_tokenizer(data_config, split: str = "train"):
    """The tokenizer a data config's pipeline encodes with (its corpus's), without building the pipeline."""
    from data_pipelines import corpus, mixture

    cfg = resolved(data_config)
    if cfg.sources:
        cfg = _with_source(cfg, mixture.resolve_sources(cfg.sources)[0][0])
    return corpus.corpus_from_config(cfg, split, corpus_layout(cfg)).tokenizer


def _example_args(cfg, split: str, process_index: int, process_count: int) -> dict:
    """The arguments the example pipelines (XLNet, MLM / ELECTRA) share: the split's corpus, the global batch size,
    seq_len, this process's place; evaluation draws with seed + 1 and reads `eval_steps` batches (0 = the split)."""
    from data_pipelines import corpus

    train = split == "train"
    return dict(
        corpus=corpus.corpus_from_config(cfg, split, corpus_layout(cfg)),
        global_batch_size=cfg.batch_size if train else cfg.eval_batch_size,
        seq_len=cfg.seq_len,
        seed=cfg.seed if train else cfg.seed + 1,
        process_index=process_index,
        process_count=process_count,
        num_steps=None if train else (cfg.eval_steps or None),
    )


def lm_pipeline(cfg, split: str, process_index: int = 0, process_count: int = 1):
    """Transformer-XL's stream (`data_pipelines.lm`): contiguous token segments per row, resumed across steps."""
    from data_pipelines import corpus, lm

    train = split == "train"
    return lm.LMStreamPipeline(
        corpus.corpus_from_config(cfg, split, corpus_layout(cfg)),
        global_batch_size=cfg.batch_size if train else cfg.eval_batch_size,
        tgt_len=cfg.tgt_len if train else cfg.eval_tgt_len,
        seed=cfg.seed,
        process_index=process_index,
        process_count=process_count,
        rotate_passes=cfg.rotate_passes and train,
        finite=not train,
    )


def xlnet_pipeline(cfg, split: str, process_index: int = 0, process_count: int = 1):
    """XLNet's permutation-LM rows (`data_pipelines.xlnet`)."""
    from data_pipelines import xlnet

    return xlnet.XLNetPipeline(
        **_example_args(cfg, split, process_index, process_count),
        reuse_len=cfg.reuse_len,
        perm_size=cfg.perm_size,
        num_predict=cfg.num_predict,
        mask_alpha=cfg.mask_alpha,
        mask_beta=cfg.mask_beta,
        max_gram=cfg.max_gram,
        bi_data=cfg.bi_data,
        span_unit=cfg.span_unit,
        exact_num_predict=cfg.exact_num_predict,
        finite=split != "train",
    )


def mlm_pipeline(cfg, split: str, process_index: int = 0, process_count: int = 1):
    """Funnel's MLM / ELECTRA inputs (`data_pipelines.mlm`)."""
    from data_pipelines import mlm

    return mlm.MLMPipeline(
        **_example_args(cfg, split, process_index, process_count),
        mask_prob=cfg.mask_prob,
        random_prob=cfg.random_prob,
        keep_prob=cfg.keep_prob,
        shuffle=split == "train",
        segment_pairs=cfg.segment_pairs,
        hide_masks_from_attention=cfg.hide_masks_from_attention,
    )


# `data.pipeline` -> constructor (resolved data config, split, process_index, process_count) -> pipeline. Objectives
# name the stream they read (`xlgen.registry.Objective.pipeline`); `config.data.pipeline` follows it.
PIPELINES = {"lm": lm_pipeline, "xlnet": xlnet_pipeline, "mlm": mlm_pipeline, "electra": mlm_pipeline}


def make_pipeline(data_config, *, split: str = "train", process_index: int = 0, process_count: int = 1):
    """Builds the pipeline for `data_config.pipeline` and `split` ("train", "valid" or "test"). With
    `data.sources`, training reads the weighted mixture (`data_pipelines.mixture`) and evaluation the first
    source's split."""
    cfg = resolved(data_config)
    if split not in ("train", "valid", "test"):
        raise ValueError(f"split={split!r}: expected train, valid or test")
    if cfg.sources:
        return mixture_pipeline(cfg, split, process_index, process_count)
    return PIPELINES[cfg.pipeline](cfg, split, process_index, process_count)


def _with_source(cfg, source: str) -> ml_collections.ConfigDict:
    one = ml_collections.ConfigDict(cfg.to_dict())
    one.source, one.sources, one.sources_history = source, "", ()
    return one


def mixture_pipeline(cfg, split: str, process_index: int = 0, process_count: int = 1):
    """`data.sources`: training batches from the weighted mixture of the listed corpora (`data_pipelines.mixture`);
    evaluation splits read the first listed source."""
    from data_pipelines import mixture

    paths_, names, weights = mixture.resolve_sources(cfg.sources)
    if split != "train":
        return PIPELINES[cfg.pipeline](_with_source(cfg, paths_[0]), split, process_index, process_count)
    subs = [PIPELINES[cfg.pipeline](_with_source(cfg, p), split, 0, 1) for p in paths_]
    stream = cfg.pipeline in ("lm", "xlnet")
    return mixture.MixturePipeline(
        subs,
        names,
        mixture.stages_of(cfg, names, weights),
        kind="stream" if stream else "example",
        mix_steps=cfg.mix_steps,
        seed=cfg.seed,
        rows_per_lane=2 if cfg.pipeline == "xlnet" and cfg.bi_data else 1,
        tokens_per_row=cfg.tgt_len if cfg.pipeline == "lm" else cfg.seq_len,
        process_index=process_index,
        process_count=process_count,
    )


def mlm_predictions_per_row(data_config) -> Optional[int]:
    """The number of predicted positions in every row of an `mlm` / `electra` pipeline of this config (see
    `mlm.predictions_per_row`), or None for other pipelines (and other data configs, e.g. a finetuning task's)."""
    d = data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config)
    if d.get("pipeline", _COMMON["pipeline"]) not in ("mlm", "electra"):
        return None
    cfg = resolved(d)
    from data_pipelines import mlm

    return mlm.predictions_per_row(cfg.seq_len, cfg.mask_prob, cfg.segment_pairs)


from data_pipelines.prefetch import prefetch  # noqa: E402

__all__ = [
    "PIPELINES",
    "corpus_layout",
    "corpus_tokenizer",
    "default_config",
    "make_pipeline",
    "mlm_predictions_per_row",
    "prefetch",
]
