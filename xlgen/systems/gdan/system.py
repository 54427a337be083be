"""Generative Domain-Adaptive Nets (thesis §3.2, Algorithm 1) as a game (xlgen.train.game): the registry record
`SYSTEMS["gdan"]`, the players' losses in update order, and the evaluation.

Players: "disc" (D, the reader: xlgen/systems/gdan/reader.py) and, for the generative methods, "gen" (G:
xlgen/systems/gdan/generator.py). One training step is one iteration of Algorithm 1's outer loop: `gdan.d_steps`
updates of D, then `gdan.g_steps` updates of G, on the step's batch (a labeled batch of L and an unlabeled batch
of U; each update draws its own questions from G).

`config.method` (Table 3.4's rows):
    sl              D maximises J(L, d_true, D) (no G, no U)
    context         D maximises J(L, d_true, D) + J(U_ctx, d_true, D), U_ctx: the context baseline's questions
    context_domain  ... + J(U_ctx, d_gen, D): the same with the domain tag
    gen             G pretrained by MLE on L, then fixed; D maximises J(L, d_true, D) + J(U_G, d_true, D)
    gen_domain      ... + J(U_G, d_gen, D)                                               (eq. 3.8 with tags)
    gen_domain_adv  Algorithm 1: D as gen_domain; G maximises J(U_G, d_true, D) by REINFORCE     (eq. 3.9)

"Initialize G by MLE training on L": the first `gdan.gen_pretrain_steps` steps train G by maximum likelihood on L
(-sum_t log P_G(q_t | q_<t, p, a), mean over questions); meanwhile D trains on L alone (`gdan.reader_during_
pretrain`, so every method makes the same D updates on the same labeled batches; False: D is not updated, as
"Randomly initialize D" after G's pretraining). After it, `gen` / `gen_domain` leave G fixed; `gen_domain_adv`
updates G with REINFORCE: q ~ P_G(. | p, a) per unlabeled row, reward r = log P_D,d_true(a | p, q) from the D of
this step (a constant for G), baseline b = the mean reward of the batch's samples (§3.2.4, "an average reward from
samples as the baseline"), loss -mean_i (r_i - b) log P_G(q_i | p_i, a_i) (`reinforce_loss`), whose gradient is
the REINFORCE estimate of -dJ(U_G, d_true, D)/dtheta_G.

Metrics per step: disc/labeled_nll = -J(L, d_true, D), disc/unlabeled_nll = -J(U, tag, D) (Fig. 3.8's curve for
the generative methods), gen/mle, gen/reward, gen/question_len.

Evaluation (`xlgen eval --workdir=W` -> W/eval_results.json): the reader with d_true on every window of the test
and dev questions, answers decoded as in finetuning (xlgen/finetune/squad_decode.py), scored by the official
SQuAD v1.1 semantics (xlgen/finetune/squad_eval.py): `exact`, `f1` (test), `dev_exact`, `dev_f1`; with the
files W/eval/predictions_test.json and, for the generative methods, W/eval/generated_questions.json (greedy
questions for the first unlabeled rows and labeled rows next to the human ones: Table 3.3).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from data_pipelines import paths
from xlgen.finetune import squad_decode, squad_eval
from xlgen.models.family import Family
from xlgen.systems.gdan import data as gdata
from xlgen.systems.gdan import reader
from xlgen.systems.gdan import text as T
from xlgen.systems.gdan.generator import Generator, GeneratorConfig, reader_question
from xlgen.train.game import GAME_UNUSED_KEYS, Game, GameProgram, Player, constant_learning_rates, game_objective
from xlgen.train.report import Reporting

# method -> (source of the unlabeled questions, domain tags, adversarial G)
METHODS: Dict[str, Tuple[Any, bool, bool]] = {
    "sl": (None, False, False),
    "context": ("context", False, False),
    "context_domain": ("context", True, False),
    "gen": ("gen", False, False),
    "gen_domain": ("gen", True, False),
    "gen_domain_adv": ("gen", True, True),
}


@dataclasses.dataclass(frozen=True)
class GdanConfig:
    """`config.model` of configs/ssl/gdan.py (minus `family`); the vocabulary size comes from the data."""

    reader_family: str = "xlnet"  # a registered family with a SQuAD head (xlnet | funnel)
    reader: Any = None  # that family's config fields (tiny), e.g. {"d_model": 64, "n_layer": 2, ...}
    embed_dim: int = 64  # generator
    hidden: int = 64


def method_of(config) -> Tuple[Any, bool, bool]:
    m = str(config.method)
    if m not in METHODS:
        raise ValueError(f"config.method={m!r}: expected one of {', '.join(METHODS)}")
    return METHODS[m]


def reinforce_loss(logp: jax.Array, reward: jax.Array, baseline: jax.Array) -> jax.Array:
    """-mean_i (r_i - b) log P_G(q_i): its gradient is the REINFORCE estimate of -d E_q[r] / d theta (r and b are
    constants for the generator)."""
    adv = jax.lax.stop_gradient(reward - baseline)
    return -jnp.mean(adv * logp)


def _tx(section) -> Tuple[optax.GradientTransformation, Any]:
    lr = float(section.learning_rate)
    parts = [optax.clip_by_global_norm(float(section.clip_norm))] if float(section.clip_norm) > 0 else []
    return optax.chain(*parts, optax.adam(lr, b1=float(section.b1), b2=float(section.b2))), optax.constant_schedule(lr)


def _rows(batch, prefix):
    return tuple(batch[prefix + k] for k in ("p", "plen", "start", "end"))


def unlabeled_questions(models, batch, key, config, greedy: bool = False):
    """(questions [Bu, Tq], lengths [Bu]) of the step's unlabeled rows: the context baseline's, or sampled from G
    (no gradient)."""
    source, _, _ = method_of(config)
    if source == "context":
        return batch["u_q"], batch["u_qlen"]
    q, _ = models["gen"].sample(*_rows(batch, "u_"), key, greedy=greedy)
    return reader_question(jax.lax.stop_gradient(q))


def unlabeled_tag(config) -> int:
    """The domain tag D reads with the unlabeled rows: d_gen with domain adaptation, else d_true."""
    return T.D_GEN if method_of(config)[1] else T.D_TRUE


def gdan_game(config, ds: gdata.Dataset) -> Game:
    source, domain, adv = method_of(config)
    if source is not None and len(ds.unlabeled) == 0:
        raise ValueError(f"config.method={config.method}: no unlabeled answers (config.data.unlabeled is empty?)")
    g = config.gdan
    pre = int(g.gen_pretrain_steps) if source == "gen" else 0
    reader_in_pre = bool(g.reader_during_pretrain)
    w_u = float(g.unlabeled_weight)
    greedy = str(g.generation) == "greedy"
    if str(g.generation) not in ("sample", "greedy"):
        raise ValueError(f"config.gdan.generation={g.generation!r}: expected sample or greedy")
    mc, V = config.model, int(config.data.vocab_size)  # fixed by the config: shapes do not depend on the data
    tag_u = unlabeled_tag(config)

    def d_log_prob(D, batch, prefix, q, qlen, tag):
        p, plen, start, end = _rows(batch, prefix)
        return reader.log_prob(D, mc, p, plen, q, qlen, jnp.full(p.shape[:1], tag), start, end)

    def d_loss(models, batch, key, step, ctx):
        D = models["disc"]
        lab = -jnp.mean(d_log_prob(D, batch, "l_", batch["l_q"], batch["l_qlen"], T.D_TRUE))
        aux = {"labeled_nll": lab}
        if source is None:
            return lab, aux
        q, qlen = unlabeled_questions(models, batch, key, config, greedy)
        unl = -jnp.mean(d_log_prob(D, batch, "u_", q, qlen, tag_u))
        on = step >= pre
        loss = lab + jnp.where(on, w_u, 0.0) * unl
        aux.update(unlabeled_nll=unl, question_len=jnp.mean(qlen.astype(jnp.float32)))
        if pre and not reader_in_pre:
            aux["gate"] = on
        return loss, aux

    def g_loss(models, batch, key, step, ctx):
        G = models["gen"]
        lp, _ = G.log_prob(*_rows(batch, "l_"), batch["l_gq"])
        mle = -jnp.mean(lp)
        aux = {"mle": mle}
        if not adv:  # MLE pretraining only, then G is fixed
            aux["gate"] = step < pre
            return mle, aux
        q, _ = G.sample(*_rows(batch, "u_"), key)
        q = jax.lax.stop_gradient(q)
        lp_q, _ = G.log_prob(*_rows(batch, "u_"), q)
        qq, ql = reader_question(q)
        r = jax.lax.stop_gradient(d_log_prob(models["disc"], batch, "u_", qq, ql, T.D_TRUE))
        rl = reinforce_loss(lp_q, r, jnp.mean(r))
        aux.update(reward=jnp.mean(r), question_len=jnp.mean(ql.astype(jnp.float32)))
        return jnp.where(step < pre, mle, rl), aux

    def make_d(rngs):  # the finetuning heads also ask for a dropout stream (unused: the reader runs without dropout)
        return reader.make(mc, V, nnx.Rngs(params=rngs.params(), dropout=0))

    def make_g(rngs):
        return Generator(
            GeneratorConfig(V, int(mc.embed_dim), int(mc.hidden), int(config.data.question_len)), rngs=rngs
        )

    players = [Player("disc", make_d, *_tx(config.players.disc))]
    order = [("disc", d_loss)] * int(g.d_steps)
    if source == "gen":
        players.append(Player("gen", make_g, *_tx(config.players.gen)))
        order += [("gen", g_loss)] * int(g.g_steps)
    d = config.data
    return Game(
        tuple(players), tuple(order), gdata.batch_shapes(d), int(d.labeled_batch_size) + int(d.unlabeled_batch_size)
    )


# -------------------------------------------------------------------------------------------------------------
# Evaluation
# -------------------------------------------------------------------------------------------------------------


def _jit_predict(D, model_config):
    gd, st = nnx.split(D)
    f = reader.predict_fn(model_config)
    return st, jax.jit(lambda st, *a: f(nnx.merge(gd, st), *a))


def predict(config, D, split: gdata.EvalSplit, batch_size: int) -> Dict[str, str]:
    """qid -> answer text: the reader with d_true on every window, decoded as in finetuning."""
    st, f = _jit_predict(D, config.model)
    n = len(split.p)
    outs, offs = [], []
    for i in range(0, n, batch_size):
        idx = np.minimum(np.arange(i, i + batch_size), n - 1)  # the last batch padded with the last window
        out, off = f(st, split.p[idx], split.plen[idx], split.q[idx], split.qlen[idx])
        k = min(batch_size, n - i)
        outs.append({name: np.asarray(v)[:k] for name, v in reader.to_beam(jax.device_get(out)).items()})
        offs.append(np.asarray(off)[:k])
    beam = {name: np.concatenate([o[name] for o in outs]) for name in outs[0]}
    off = np.concatenate(offs)
    L = split.p.shape[1] + split.q.shape[1] + 5
    words = np.arange(split.p.shape[1])[None] < split.plen[:, None]  # the windows' words -> sequence positions
    rows, cols = np.nonzero(words)
    pos = off[rows] + cols
    feats = {"example_index": split.example_index}
    for name, src in (("tok_start_char", split.tok_start_char), ("tok_end_char", split.tok_end_char)):
        a = np.full((n, L), -1, np.int64)
        a[rows, pos] = src[rows, cols]
        feats[name] = a
    mc = np.zeros((n, L), bool)
    mc[rows, pos] = split.max_context[rows, cols]
    feats["max_context"] = mc
    max_answer = int(config.data.max_answer_words)
    preds, _, _ = squad_decode.decode(split.examples, feats, beam, max_answer_length=max_answer)
    return preds


def evaluate(config, program: GameProgram, state, out_dir: str, full: bool) -> Dict[str, Any]:
    """{"exact", "f1"} (test), {"dev_exact", "dev_f1"}, sizes and the method (module docstring)."""
    ds = gdata.dataset(config.data)
    models = program.modules(state)
    bsz = int(config.data.eval_batch_size)
    res: Dict[str, Any] = {"method": str(config.method)}
    for name, split in (("test", ds.test), ("dev", ds.dev)):
        if not split.examples:
            continue
        preds = predict(config, models["disc"], split, bsz)
        scores = squad_eval.evaluate_v1(split.gold(), preds)
        pre = "" if name == "test" else "dev_"
        res.update({pre + "exact": scores["exact"], pre + "f1": scores["f1"], f"num_{name}": scores["total"]})
        if full and name == "test":
            paths.makedirs(out_dir)
            paths.write_json_atomic(os.path.join(out_dir, "predictions_test.json"), preds)
    if full and "gen" in models:
        paths.makedirs(out_dir)
        paths.write_json_atomic(
            os.path.join(out_dir, "generated_questions.json"), generated_questions(config, models, ds)
        )
    return res


def generated_questions(config, models, ds: gdata.Dataset, n: int = 20) -> Dict[str, list]:
    """Greedy questions of G for the first n unlabeled rows (paragraph window, answer) and n labeled rows (with
    the human question)."""
    G, V = models["gen"], ds.vocab
    out = {}
    for name, inst in (("unlabeled", ds.unlabeled), ("labeled", ds.labeled)):
        k = min(n, len(inst))
        if not k:
            continue
        rows = (inst.p[:k], inst.plen[:k], inst.start[:k], inst.end[:k])
        q, _ = jax.jit(lambda *a: G.sample(*a, jax.random.key(0), greedy=True))(*rows)
        items = []
        for i in range(k):
            p = inst.p[i, : inst.plen[i]]
            item = {
                "paragraph": V.decode(p),
                "answer": V.decode(p[inst.start[i] : inst.end[i] + 1]),
                "question": V.decode(np.asarray(q[i])),
            }
            if name == "labeled":
                item["human"] = V.decode(inst.q[i, : inst.qlen[i]])
            items.append(item)
        out[name] = items
    return out


# -------------------------------------------------------------------------------------------------------------
# The registry record (xlgen/registry.py: SYSTEMS["gdan"])
# -------------------------------------------------------------------------------------------------------------


def _game(config) -> Game:
    return gdan_game(config, gdata.dataset(config.data))


FAMILY = Family(
    name="gdan",
    config_class=GdanConfig,
    default_objective="gdan",
    models={"generator": Generator},
    objectives={"gdan": game_objective("gdan", _game, gdata.Pipeline, evaluate)},
    records=(Reporting("examples", constant_learning_rates, GAME_UNUSED_KEYS),),
)
