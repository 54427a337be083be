"""Funnel-Transformer cost model: exact parameter counts, analytic FLOPs, and the paper's counting rule.

Two ways of counting, both per sequence of length T (FLOPs = 2 x multiply-adds of the matmuls; embedding look-ups,
LayerNorm, softmax and other elementwise work are not counted):

* `flops_per_sequence` / `param_count` — EXACT for our modules. Parameters: `jax.eval_shape` of the xlgen module
  (nothing is allocated). FLOPs per attention layer with queries at length q, keys at length k and the block's key
  stride (the pool-query-only layer has q = k/2, its keys/values at the unpooled length):

      projections  2·(q + 2k + q)·d·n·d_head      q, k, v, o
      position     relative_shift: 2·R·d·n·d_head (W_r R) + 2·q·R·n·d_head, R = length of the distance sequence
                   (2k for a standard layer, 2q + k for a pooling layer);
                   factorized: 2·2·q·n·d_head·d (project (q+v) by W_r and by W_r with its halves swapped)
                   + 2·q·k·n·d (the rotated trig product, `rotated_factorized_position_scores`: the program
                   lowered for TPU; XLA:CPU runs the original form, one projection + 2·q·k·n·2d)
      content, AV  2·q·k·n·d_head each                          <- the quadratic attention term
      segment      2·q·n·d_head·2
      FFN          2·q·2·d·d_inner

  plus, optionally, the decoder (upsample + `num_decoder_layers` full-length layers) and the MLM softmax (2·T·d·V).

* `paper_flops` / `paper_params` — the counting rule of the thesis' Tables 5.1/5.10 (T:L1948, T:L1866): FLOPs
  "assuming linear complexity in length": every layer costs (12·d² per token) x (its block's length), so block m
  counts 2^-(m-1) full-length layers (B6-6-6: 6 + 3 + 1.5 = 10.5 layer-equivalents) and each decoder layer one;
  the pooling layer's unpooled keys/values and the T² attention term are ignored, and so are the embedding and
  heads. Parameters: V·d word embeddings (V = 30,522) + per stored layer the standard Transformer layer
  12d² + 13d (q, k, v, o with biases, FFN d -> 4d -> d with biases, two LayerNorms) — i.e. `3x2` counts 3 layers.

Hidden sizes (thesis §3.4/§3.6): each F-TFM is compared with the baseline of its own width — B10-10-10 and
B8-8-8 are H1024 against L24H1024; B6-6-6, B6-3x2-3x2, B4-4-4 are H768 against L12H768; B3-4-4 is H768 against
L6H768; d_head = 64, d_inner = 4d. With this rule the published ratios come out as (paper vs rule):
FLOPs 0.88 vs 0.875, 0.58 vs 0.583, 0.73 vs 0.729, 0.58 vs 0.583, 1.00 vs 1.000; with a 2-layer decoder
1.04 vs 1.042, 0.75 vs 0.750, 0.81 vs 0.813; params 1.39 vs 1.392, 1.22 vs 1.227, 1.53 vs 1.537, 1.00 vs 1.000.
(Our exact Funnel layer has 13d² + 17d parameters — W_r, no q bias, u/v/b_s biases, segment embeddings — which
moves the parameter ratios by < 0.02; see `ratio_table`.) The exact FLOPs (T = 512, rel_shift form) of every
F-TFM/baseline pair come out at or below the linear-rule ratio: halving the length saves quadratically on the
attention term (thesis T:L1851), which outweighs the pooling layer's full-length keys/values.

`python -m xlgen.models.funnel.cost` prints the table.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np

from xlgen.models.funnel.model import FunnelConfig, pooled_lengths

PAPER_VOCAB = 30522


def paper_config(layout: str, d_model: int, **kw) -> FunnelConfig:
    """A paper-sized config: "B6-3x2-3x2" / "L12" (one block) at width d_model, d_head 64, d_inner 4d."""
    blocks = layout[1:] if layout[0] in "BL" else layout
    return FunnelConfig(
        vocab_size=kw.pop("vocab_size", PAPER_VOCAB),
        block_sizes=blocks,
        d_model=d_model,
        n_head=d_model // 64,
        d_head=64,
        d_inner=4 * d_model,
        **kw,
    )


# ----------------------------------------------------------------------------------------------------------------
# Exact counts
# ----------------------------------------------------------------------------------------------------------------


def param_count(cfg: FunnelConfig, head: str = "base") -> int:
    """Exact parameter count of our module via `jax.eval_shape` (no allocation). head: "base" (embeddings +
    encoder, the finetuning trunk), "model" (+ decoder), "mlm" (+ decoder + MLM bias), "electra" (discriminator
    + generator), or "classification" (base + sequence-classification head, 2 labels)."""
    import jax
    from flax import nnx

    from xlgen.models.funnel import heads as funnel_heads
    from xlgen.models.funnel import model as funnel

    ctor = {
        "base": funnel.FunnelBaseModel,
        "model": funnel.FunnelModel,
        "mlm": funnel.FunnelForMaskedLM,
        "electra": funnel_heads.FunnelElectra,
        "classification": funnel_heads.FunnelForSequenceClassification,
    }[head]
    abstract = nnx.eval_shape(lambda: ctor(cfg, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    return int(sum(np.prod(x.shape) for x in leaves))


def _layer_flops(cfg: FunnelConfig, q: int, k: int, r: int, form: str) -> Dict[str, float]:
    d, n, dh = cfg.d_model, cfg.n_head, cfg.d_head
    hd = n * dh
    out = {"linear": 2.0 * (q + 2 * k + q) * d * hd + 2.0 * q * 2 * d * cfg.d_inner + 2.0 * q * hd * 2}
    if form == "factorized":  # the rotated form (`rotated_factorized_position_scores`): two projections, width d
        out["linear"] += 2.0 * q * hd * d * 2
        out["quadratic"] = 2.0 * q * k * hd * 2 + 2.0 * q * k * n * d
    else:
        out["linear"] += 2.0 * r * d * hd
        out["quadratic"] = 2.0 * q * k * hd * 2 + 2.0 * q * r * hd
    return out


def flops_per_sequence(
    cfg: FunnelConfig, seq_len: int, *, decoder: bool = False, lm_head: bool = False, form: Optional[str] = None
) -> Dict[str, float]:
    """Exact matmul FLOPs of one forward pass on one sequence: {"linear", "quadratic", "lm_head", "total"}.

    `decoder`: include upsampling + decoder layers (pretraining / token-level tasks); `lm_head`: the MLM softmax
    over the vocabulary at every position; `form`: "relative_shift" or "factorized" (default cfg.attention_type).
    Training costs about 3x the forward pass.
    """
    form = form or cfg.attention_type
    lengths = pooled_lengths(seq_len, cfg)
    total = {"linear": 0.0, "quadratic": 0.0}

    def add(q, k, r):
        for key, v in _layer_flops(cfg, q, k, r, form).items():
            total[key] += v

    prev = seq_len
    for m, (n_layers, reps) in enumerate(zip(cfg.block_sizes, cfg.block_repeats)):
        t = lengths[m]
        applications = n_layers * reps
        if t != prev:  # pooling layer: queries at t, keys/values at prev
            add(t, prev if cfg.pool_q_only else t, 2 * t + prev if cfg.pool_q_only else 2 * t)
            applications -= 1
        for _ in range(applications):
            add(t, t, 2 * t)
        prev = t
    if decoder:
        for _ in range(cfg.num_decoder_layers):
            add(seq_len, seq_len, 2 * seq_len)
    total["lm_head"] = 2.0 * seq_len * cfg.embed_dim * cfg.vocab_size if lm_head else 0.0
    total["total"] = total["linear"] + total["quadratic"] + total["lm_head"]
    return total


def config_from_model_section(model_section) -> FunnelConfig:
    """FunnelConfig from a training config's `model` section (ConfigDict or dict; `family` is ignored)."""
    fields = {f.name for f in dataclasses.fields(FunnelConfig)}
    d = dict(model_section)
    unknown = sorted(k for k in d if k not in fields and k != "family")
    if unknown:
        raise ValueError(f"config.model: unknown Funnel keys {unknown}; valid: {sorted(fields)}")
    return FunnelConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in fields})


def forward_flops_per_sequence(
    cfg: FunnelConfig, seq_len: int, objective: str = "funnel_mlm", generator_width: float = 0.25
) -> float:
    """Forward matmul FLOPs of one pretraining sequence: MLM = encoder + decoder + softmax at every position;
    ELECTRA = generator (same, at `generator_width`) + discriminator (encoder + decoder + per-token head)."""
    if objective == "funnel_electra":
        from xlgen.models.funnel.heads import generator_config

        gen = generator_config(cfg, generator_width)
        gen_f = flops_per_sequence(gen, seq_len, decoder=True, lm_head=True)["total"]
        gen_f += 2.0 * seq_len * gen.d_model * gen.embed_dim * 2  # input projection + MLM transform
        disc = flops_per_sequence(cfg, seq_len, decoder=True)["total"] + 2.0 * seq_len * (cfg.d_model**2 + cfg.d_model)
        return gen_f + disc
    extra = 2.0 * seq_len * cfg.d_model * cfg.embed_dim if (cfg.mlm_transform or cfg.embed_dim != cfg.d_model) else 0
    return flops_per_sequence(cfg, seq_len, decoder=True, lm_head=True)["total"] + extra


def _objective_name(config) -> str:
    """The run's objective (`config.objective`, empty = the Funnel system's default, funnel_mlm)."""
    from xlgen.models.funnel.objectives import FUNNEL_MLM

    return config.objective or FUNNEL_MLM.name


def train_flops_per_step(config) -> float:
    """3 x forward FLOPs of one global batch for a training config (used by `xlgen.models.cost` / `xlgen plan`)."""
    cfg = config_from_model_section(config.model)
    objective = _objective_name(config)
    width = float(config.objective_options.generator_width)
    fwd = forward_flops_per_sequence(cfg, int(config.data.seq_len), objective, width)
    return 3.0 * fwd * int(config.data.batch_size)


def _funnel_position_work(cfg, seq_len: int, last_decoder_queries: Optional[int] = None) -> float:
    """Forward FLOPs of one sequence's position work whose other factor is a constant, as counted by
    `flops_per_sequence`: relative_shift: the position keys W_r·R (2·R·d·H per layer application);
    factorized: the products with the sinusoid factors (2·q·k·n·2d). `last_decoder_queries`: the last decoder
    layer runs that many query rows (MLM rows, `FunnelDecoder`)."""

    def work(q, k, r):
        if cfg.attention_type == "relative_shift":
            return 2.0 * r * cfg.d_model * cfg.n_head * cfg.d_head
        return 2.0 * q * k * cfg.n_head * cfg.d_model

    lengths, total, prev = pooled_lengths(seq_len, cfg), 0.0, seq_len
    for m, (n_layers, reps) in enumerate(zip(cfg.block_sizes, cfg.block_repeats)):
        t, applications = lengths[m], n_layers * reps
        if t != prev:  # the pooling layer: queries at t, keys at prev
            total += work(t, prev, 2 * t + prev) if cfg.pool_q_only else work(t, t, 2 * t)
            applications -= 1
        total += applications * work(t, t, 2 * t)
        prev = t
    total += cfg.num_decoder_layers * work(seq_len, seq_len, 2 * seq_len)
    if last_decoder_queries is not None and cfg.num_decoder_layers:
        total += work(last_decoder_queries, seq_len, 2 * seq_len) - work(seq_len, seq_len, 2 * seq_len)
    return total


def train_flops(config) -> float:
    """`train_flops_per_step` (3 x its per-sequence forward x batch) with the position work counted as
    the math needs it: relative_shift's position keys W_r·R do not depend on the example (projected once per batch,
    weight gradient only: 2x); factorized's products with the constant sinusoid factors need the gradient w.r.t. the
    query side only (2x)."""
    from xlgen.models.funnel.heads import predictions_per_row

    total = float(train_flops_per_step(config))
    cfg = config_from_model_section(config.model)
    nets = [cfg]
    if _objective_name(config) == "funnel_electra":
        from xlgen.models.funnel.heads import generator_config

        width = float(config.objective_options.generator_width)
        nets.append(generator_config(cfg, width))
    batch, seq_len = int(config.data.batch_size), int(config.data.seq_len)
    # the MLM model (or ELECTRA's generator) runs its last decoder layer's queries, FFN and softmax at the k
    # predicted rows only (`funnel.heads.mlm_loss`); funnel_cost counts them at every position
    k = predictions_per_row(config)
    rows = k if k is not None and k < seq_len else None
    for i, net in enumerate(nets):
        work = _funnel_position_work(net, seq_len, rows if i == len(nets) - 1 else None)
        total -= (3.0 * batch - 2.0) * work if net.attention_type == "relative_shift" else batch * work
    if rows is not None:
        mlm = nets[-1]
        transform = mlm.d_model * mlm.embed_dim if (mlm.mlm_transform or mlm.embed_dim != mlm.d_model) else 0
        total -= 3.0 * batch * (seq_len - rows) * 2.0 * (mlm.embed_dim * mlm.vocab_size + transform)
        if mlm.num_decoder_layers:
            full = _layer_flops(mlm, seq_len, seq_len, 2 * seq_len, mlm.attention_type)
            at_rows = _layer_flops(mlm, rows, seq_len, 2 * seq_len, mlm.attention_type)
            total -= 3.0 * batch * sum(full[key] - at_rows[key] for key in full)
    return total


# ----------------------------------------------------------------------------------------------------------------
# The paper's counting rule
# ----------------------------------------------------------------------------------------------------------------


def paper_flops(cfg: FunnelConfig, seq_len: int = 512, *, decoder: bool = False) -> float:
    """Linear-in-length rule: sum over layer applications of 2·12·d²·(block length), decoder layers at full
    length. Embeddings/heads not counted."""
    per_token = 2.0 * 12 * cfg.d_model**2
    flops = 0.0
    for m, (n_layers, reps) in enumerate(zip(cfg.block_sizes, cfg.block_repeats)):
        flops += n_layers * reps * per_token * seq_len / 2**m
    if decoder:
        flops += cfg.num_decoder_layers * per_token * seq_len
    return flops


def paper_params(cfg: FunnelConfig, vocab_size: int = PAPER_VOCAB) -> int:
    """V·d + (stored layers)·(12d² + 13d): standard layers with d_inner = 4d, word embeddings, no heads."""
    d = cfg.d_model
    return vocab_size * d + sum(cfg.block_sizes) * (12 * d * d + 13 * d)


# (F-TFM, its baseline, width, published FLOPs ratio, published params ratio, decoder layers in the FLOPs column)
PAPER_ROWS = [
    ("B10-10-10", "L24", 1024, 0.73, 1.22, False),
    ("B8-8-8", "L24", 1024, 0.58, 1.00, False),
    ("B6-6-6", "L12", 768, 0.88, 1.39, False),
    ("B6-3x2-3x2", "L12", 768, 0.88, 1.00, False),
    ("B4-4-4", "L12", 768, 0.58, 1.00, False),
    ("B3-4-4", "L6", 768, 1.00, 1.53, False),
    ("B6-6-6", "L12", 768, 1.04, None, True),  # Table 5.10 (pretraining, "D2")
    ("B6-3x2-3x2", "L12", 768, 1.04, None, True),
    ("B4-4-4", "L12", 768, 0.75, None, True),
    ("B10-10-10", "L24", 1024, 0.81, None, True),
    ("B8-8-8", "L24", 1024, 0.66, None, True),
]


def ratio_table(seq_len: int = 512, exact_params: bool = True) -> List[dict]:
    """One row per published comparison: paper value, the counting rule, and our exact counts (T = seq_len)."""
    rows = []
    for model, base, d, paper_f, paper_p, dec in PAPER_ROWS:
        f, b = paper_config(model, d), paper_config(base, d)
        row = {
            "model": f"{model}H{d}" + ("D2" if dec else ""),
            "baseline": f"{base}H{d}",
            "paper_flops": paper_f,
            "rule_flops": paper_flops(f, seq_len, decoder=dec) / paper_flops(b, seq_len),
            "exact_flops": flops_per_sequence(f, seq_len, decoder=dec)["total"]
            / flops_per_sequence(b, seq_len)["total"],
        }
        if paper_p is not None:
            row.update(paper_params=paper_p, rule_params=paper_params(f) / paper_params(b))
            if exact_params:
                row["exact_params"] = param_count(f) / param_count(b)
        rows.append(row)
    return rows


def format_ratio_table(rows: List[dict]) -> str:
    cols = [
        "model",
        "baseline",
        "paper_flops",
        "rule_flops",
        "exact_flops",
        "paper_params",
        "rule_params",
        "exact_params",
    ]
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Funnel-Transformer FLOPs / parameter ratios vs. the paper")
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--no_exact_params", action="store_true", help="skip the jax.eval_shape parameter counts")
    a = p.parse_args(argv)
    print(format_ratio_table(ratio_table(a.seq_len, exact_params=not a.no_exact_params)))


if __name__ == "__main__":
    main()
