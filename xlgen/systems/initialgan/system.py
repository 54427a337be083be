"""InitialGAN as a registered system (seed 004 Algorithm 1): a three-player game of `xlgen.train.game`, trained by the
one loop (`xlgen train`: checkpoints, exact resume, metrics, the objective's own evaluation) and sampled by
`xlgen generate --workdir=W` through the record's `sample` hook.

Players and their updates, in order, each step (`Game.order`); an update is gated on the phase (`aux["gate"]`), and
its loss computes nothing outside its phase (`jax.lax.cond`):

    aligner        steps [0, aligner_steps):            AdamW on eq. 4 (Alg. 1 lines 1-11)
    discriminator  steps [aligner_steps, total_steps):  AdamW on eq. 5, bs_d real rows (μ_x of the frozen aligner)
                                                        against bs_d generated ones (lines 14-22)
    generator      same steps, after the critic's update: Adam on eq. 6, bs_g = bs_d / (1 - ρ) samples (lines
                                                        23-24); F_LT is the aligner's, a constant here

The batch is `tokens` `[bs_d, max_len]`, rows drawn by (data.seed, step) (`data.batch_rows`); every key comes from
the game's fold_in(rng, step), so a resumed run equals an uninterrupted one. Metrics: `loss` is the first update's
(the aligner's: 0 once it is frozen), `aligner_loss`, `discriminator_loss`, `generator_loss`,
`discriminator/wasserstein`, `discriminator/lipschitz_penalty`, `generator/distinct_first_words` (mode collapse).
Evaluation (`Objective.evaluate`, every `eval_every_steps` and by `xlgen eval`): FED / LCR / Self-BLEU / mean length
of `eval.num_samples` generated sentences against the reference set; `xlgen eval` adds BLEU, Inverse BLEU and the
LCR(τ) sweep (`xlgen.analyze.textgen.evaluate`) and writes the samples to DIR/eval/samples.txt.

The workdir keeps `vocab.json` (the word vocabulary, checked on resume) and `reference.txt` (the reference sentences).
The vocabulary size follows from `data.train`, so building the program reads that file (as the image GANs read
their data set).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from xlgen.generate import Sampling
from xlgen.models.family import Family
from xlgen.systems.initialgan import data as data_lib
from xlgen.systems.initialgan.aligner import Aligner, aligner_loss
from xlgen.systems.initialgan.gan import Discriminator, Generator, critic_loss, generator_batch, generator_loss
from xlgen.systems.initialgan.lstm import LSTMStack
from xlgen.train.game import GAME_UNUSED_KEYS, Game, Player, constant_learning_rates, game_objective
from xlgen.train.report import Reporting

PLAYERS = ("aligner", "discriminator", "generator")


@dataclasses.dataclass(frozen=True)
class InitialGANConfig:
    """`config.model` of configs/textgan/initialgan.py (minus `family`; widths of Appendix C by default)."""

    d_embed: int = 512  # generator input embedding E
    d_noise: int = 128  # ε of dropout sampling
    d_rep: int = 512  # representation width (aligner μ, σ; generator output; discriminator input)
    cell: str = "fn"  # fn (fully normalised, eq. 3) | ln (LayerNorm LSTM) | plain
    dropout_sampling: bool = True
    sampling_rate: float = 0.75  # ρ
    aligner: Any = None
    generator: Any = None
    discriminator: Any = None


def make_players(config, vocab_size: int) -> Dict[str, Player]:
    m = config.model
    a, g, d = m.aligner, m.generator, m.discriminator
    makes = {
        "aligner": lambda rngs: Aligner(
            vocab_size, a.d_model, m.d_rep, a.n_layer, a.n_head, a.d_inner, a.dropout, rngs=rngs
        ),
        "discriminator": lambda rngs: Discriminator(m.d_rep, d.hidden, d.num_layers, cell=m.cell, rngs=rngs),
        "generator": lambda rngs: Generator(
            vocab_size,
            m.d_embed,
            m.d_noise,
            g.hidden,
            g.num_layers,
            m.d_rep,
            cell=m.cell,
            rate=m.sampling_rate,
            dropout_sampling=m.dropout_sampling,
            rngs=rngs,
        ),
    }
    players = {}
    for name in PLAYERS:  # Appendix C: AdamW aligner and critic, Adam generator
        p = config.players[name]
        lr = float(p.learning_rate)
        if p.weight_decay:
            tx = optax.adamw(lr, b1=p.b1, b2=p.b2, weight_decay=p.weight_decay)
        else:
            tx = optax.adam(lr, b1=p.b1, b2=p.b2)
        if p.clip_norm:
            tx = optax.chain(optax.clip_by_global_norm(p.clip_norm), tx)
        players[name] = Player(name, makes[name], tx, optax.constant_schedule(lr))
    return players


def generate(models, key, batch: int, max_len: int):
    """(r_g `[B, T, d_r]`, words `[B, T]`) from the generator with the aligner's F_LT."""
    k_noise, k_mask = jax.random.split(key)
    f_lt = models["aligner"].to_words
    return models["generator"](
        (f_lt.kernel[...], f_lt.bias[...]), k_noise, k_mask, batch=batch, length=max_len, bos_id=data_lib.BOS
    )


def _in_phase(active, fn):
    """fn() -> (loss, aux) when `active`, else zeros of the same structure, computing only the taken branch."""
    zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn))  # noqa: E731
    loss, aux = jax.lax.cond(active, fn, zeros)
    return loss, {**aux, "gate": active}


def initialgan_game(config, vocab_size: int, max_len: int) -> Game:
    a_steps = int(config.aligner_steps)
    bs_d = int(config.data.batch_size)
    bs_g = generator_batch(bs_d, config.model.sampling_rate, config.model.dropout_sampling)

    def a_loss(models, batch, key, step, ctx):
        def fn():
            return aligner_loss(
                models["aligner"],
                batch["tokens"],
                key,
                lambda_a=float(config.lambda_a),
                mask_id=data_lib.MASK,
                first_word=data_lib.FIRST_WORD,
            )

        return _in_phase(step < a_steps, fn)

    def d_loss(models, batch, key, step, ctx):
        def fn():
            k_gen, k_pen = jax.random.split(key)
            r_d = jax.lax.stop_gradient(models["aligner"](batch["tokens"], train=False)[0])  # μ_x (Alg. 1 line 17)
            r_g = generate(models, k_gen, bs_d, max_len)[0]
            return critic_loss(models["discriminator"], r_d, r_g, k_pen, lambda_d=float(config.lambda_d))

        return _in_phase(step >= a_steps, fn)

    def g_loss(models, batch, key, step, ctx):
        def fn():
            r_g, words = generate(models, key, bs_g, max_len)
            first = jnp.sort(words[:, 0])
            distinct = (1 + jnp.sum(first[1:] != first[:-1])).astype(jnp.float32)
            return generator_loss(models["discriminator"], r_g), {"distinct_first_words": distinct}

        return _in_phase(step >= a_steps, fn)

    players = make_players(config, vocab_size)
    return Game(
        players=tuple(players[n] for n in PLAYERS),
        order=(("aligner", a_loss), ("discriminator", d_loss), ("generator", g_loss)),
        batch_shapes={"tokens": ((bs_d, max_len), jnp.int32)},
        examples_per_step=bs_d * max_len,  # tokens per step (real rows) for the loop's tokens/s
    )


# ---------------------------------------------------------------------------------------------------------------
# Data: the run's sentences (cached per data config) and the loop's pipeline
# ---------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _sentences(data_json: str) -> Dict:
    return data_lib.load(ml_collections.ConfigDict({"data": json.loads(data_json)}))


def sentences(data_config) -> Dict:
    """{"vocab", "train" rows, "reference" sentences, "max_len"} of `config.data` (`data.load`, cached)."""
    return _sentences(json.dumps(data_config.to_dict(), sort_keys=True, default=str))


class Pipeline:
    """`batch(step)` = {"tokens": global rows drawn by (data.seed, step)}; `record(workdir)` writes DIR/vocab.json
    (a different vocabulary than the workdir's: error) and DIR/reference.txt."""

    num_steps = None

    def __init__(self, data_config, split: str = "train", process_index: int = 0, process_count: int = 1):
        self.data = sentences(data_config)
        self.rows, self.seed = self.data["train"], int(data_config.seed)
        self.global_batch_size = self.local_batch_size = int(data_config.batch_size)

    def batch(self, step: int) -> Dict[str, np.ndarray]:
        return {"tokens": data_lib.batch_rows(self.rows, self.seed, step, self.global_batch_size)}

    def record(self, workdir: str) -> None:
        from data_pipelines import paths

        vocab_path = paths.join(workdir, "vocab.json")
        text = self.data["vocab"].to_json()
        if paths.as_path(vocab_path).exists():
            if paths.read_text(vocab_path) != text:
                raise ValueError(f"{vocab_path}: the vocabulary of data.train differs from this workdir's run")
        else:
            paths.atomic_write_text(vocab_path, text)
        paths.atomic_write_text(paths.join(workdir, "reference.txt"), "\n".join(self.data["reference"]) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Sampling and evaluation
# ---------------------------------------------------------------------------------------------------------------


def sample_ids(program, state, max_len: int, num: int, seed: int, chunk: int = 256) -> np.ndarray:
    """Word ids `[num, max_len]` (dropout sampling on, as in training); chunk c of `chunk` rows depends only on
    (seed, c), so the same seed gives the same sentences."""
    fn = jax.jit(lambda state, key: generate(program.modules(state), key, chunk, max_len)[1])
    out = [np.asarray(fn(state, jax.random.fold_in(jax.random.key(seed), c))) for c in range(math.ceil(num / chunk))]
    return np.concatenate(out)[:num]


def sample_sentences(config, program, state, num: int, seed: int) -> List[str]:
    """`num` decoded sentences (words up to the first </s>) from a restored state."""
    data = sentences(config.data)
    return [data["vocab"].decode(row) for row in sample_ids(program, state, data["max_len"], num, seed)]


def sample(config, program, state, workdir: str, num: int, seed: int) -> List[str]:
    """The record's `sample` hook (`xlgen generate --workdir=W`): decoded with the workdir's vocab.json."""
    from data_pipelines import paths

    vocab = data_lib.WordVocab.from_json(paths.read_text(paths.join(workdir, "vocab.json")))
    return [vocab.decode(row) for row in sample_ids(program, state, data_lib.max_len(config.data), num, seed)]


@functools.lru_cache(maxsize=2)
def _encoder(reference: tuple, dim: int):
    from xlgen.analyze.sentence_encoders import LSAEncoder

    enc = LSAEncoder(list(reference), dim=dim)
    return enc, enc.encode(list(reference))


def evaluate(config, program, state, out_dir: str, full: bool) -> Dict[str, float]:
    """Generated sentences against the reference set with the LSA encoder of `xlgen analyze textgen` (fitted on the
    reference): FED, LCR(eval.tau), Self-BLEU-5 (first eval.num_bleu), mean length; `full` (xlgen eval): every metric
    of `xlgen.analyze.textgen.evaluate` and the samples in out_dir/samples.txt."""
    from xlgen.analyze import textgen
    from xlgen.analyze import textgen_metrics as tm

    e = config.eval
    ref = sentences(config.data)["reference"]
    gen = sample_sentences(config, program, state, int(e.num_samples), int(e.seed))
    lengths = [len(s.split()) for s in gen]
    scored = [s or "<empty>" for s in gen]  # an empty sentence (</s> first) as one out-of-vocabulary token
    if full:
        from data_pipelines import paths
        from xlgen.analyze.sentence_encoders import make_encoder

        paths.atomic_write_text(paths.join(out_dir, "samples.txt"), "\n".join(gen) + "\n")
        res = textgen.evaluate(scored, ref, make_encoder(f"lsa:{int(e.encoder_dim)}", ref), seed=int(e.seed))
        out = {k: v for k, v in res.items() if isinstance(v, (int, float))}
        out.update({f"lcr_tau_{t}": v for t, v in res["lcr_by_tau"].items()})
    else:
        enc, r = _encoder(tuple(ref), int(e.encoder_dim))
        g = enc.encode(scored)
        toks = [s.split() for s in scored[: int(e.num_bleu)]]
        out = {
            "fed": tm.frechet_distance(g, r),
            "lcr": tm.lcr(g, r, float(e.tau)),
            "self_bleu": tm.bleu_scores(toks, toks, orders=(5,), leave_one_out=True)[5],
        }
    out["mean_length"] = float(np.mean(lengths))
    out["empty_fraction"] = float(np.mean([n == 0 for n in lengths]))
    return out


# ---------------------------------------------------------------------------------------------------------------
# The registry record (xlgen/registry.py: SYSTEMS["initialgan"])
# ---------------------------------------------------------------------------------------------------------------


def game(config) -> Game:
    data = sentences(config.data)
    return initialgan_game(config, len(data["vocab"]), data["max_len"])


FAMILY = Family(
    name="initialgan",
    config_class=InitialGANConfig,
    default_objective="initialgan",
    models={"aligner": Aligner, "generator": Generator, "discriminator": Discriminator, "lstm": LSTMStack},
    objectives={"initialgan": game_objective("initialgan", game, Pipeline, evaluate)},
    records=(Reporting("examples", constant_learning_rates, GAME_UNUSED_KEYS), Sampling(sample)),
)
