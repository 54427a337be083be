"""GDAN (thesis §3.2): REINFORCE's gradient against the exact one (enumerated questions) and finite differences, the
copy mechanism's mixture (eq. 3.7), the domain tags in the reader's input and in D's loss, the data (article split,
labeling rate, windows, context questions, pure batches) on a generated fixture, and train / exact resume / eval
through the CLI with the official scorer's numbers."""

import itertools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from xlgen import cli
from xlgen.finetune import squad_eval
from xlgen.systems.gdan import data as gdata
from xlgen.systems.gdan import reader, standin, system
from xlgen.systems.gdan import text as T
from xlgen.systems.gdan.generator import Generator, GeneratorConfig, question_mask, reader_question
from xlgen.train.workdir_model import restore_params

TINY_XLNET = dict(d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0)


def _model_config(family="xlnet", reader_cfg=None):
    return ml_collections.ConfigDict(
        dict(family="gdan", reader_family=family, reader=reader_cfg or TINY_XLNET, embed_dim=8, hidden=8)
    )


# ----------------------------------------------------------------------------------------------------------------
# text
# ----------------------------------------------------------------------------------------------------------------


def test_words_candidates_and_context_question():
    s = "In 1851 , Anna Karl founded the old mill of Arden near the river ."
    ws, st, en = T.words_with_offsets(s)
    assert ws[:4] == ["in", "1851", ",", "anna"] and s[st[3] : en[4]] == "Anna Karl"
    spans = [s[a:b] for a, b in T.rule_candidates(s)]
    assert {"1851", "Anna Karl", "Arden", "old mill", "river"} <= set(spans) and "In" not in spans
    assert T.word_span(st, en, s.index("Arden"), s.index("Arden") + 5) == (10, 10)
    # §3.2.3: W words before and after the answer, the answer itself left out
    assert T.context_question(ws, 10, 10, 2) == ["mill", "of", "near", "the"]
    v = T.Vocab.build([s, "the the"], 100)
    assert v.itos[: len(T.SPECIALS)] == list(T.SPECIALS) and v.itos[len(T.SPECIALS)] == "the"
    assert v.decode(v.ids(["anna", "karl"]) + [T.EOS, 9]) == "anna karl"


# ----------------------------------------------------------------------------------------------------------------
# the reader's input: layout and domain tags
# ----------------------------------------------------------------------------------------------------------------


def test_reader_layout_places_domain_tags_by_hand():
    p = jnp.array([[11, 12, 13, 0]])  # Tp = 4, 3 words
    q = jnp.array([[21, 22, 0]])  # Tq = 3, 2 words
    for style in ("cls_last", "cls_first"):
        b = reader.assemble(style, p, jnp.array([3]), q, jnp.array([2]), jnp.array([T.D_GEN]))
        ids = np.asarray(b["input_ids"][0]).tolist()
        tag, sep, cls = T.D_GEN, T.SEP, T.CLS
        if style == "cls_last":  # L = 4 + 3 + 5 = 12, body 10, 2 pads on the left
            assert ids == [0, 0, 11, 12, 13, tag, sep, 21, 22, tag, sep, cls]
            assert np.asarray(b["token_type_ids"][0]).tolist() == [4, 4, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2]
            assert int(b["p_off"][0]) == 2 and int(b["cls_index"][0]) == 11
        else:
            assert ids == [cls, 21, 22, tag, sep, 11, 12, 13, tag, sep, 0, 0]
            assert np.asarray(b["token_type_ids"][0]).tolist() == [2, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
            assert int(b["p_off"][0]) == 5 and int(b["cls_index"][0]) == 0
        off = int(b["p_off"][0])
        assert ids[off : off + 3] == [11, 12, 13]
        allowed = np.flatnonzero(np.asarray(b["p_mask"][0]) == 0).tolist()
        assert allowed == sorted([off, off + 1, off + 2, int(b["cls_index"][0])])
        assert np.asarray(b["attention_mask"][0]).sum() == 10


@pytest.mark.parametrize(
    "family,cfg",
    [("xlnet", TINY_XLNET), ("funnel", dict(block_sizes=(1, 1), d_model=16, n_head=2, d_head=8, d_inner=32))],
)
def test_domain_tag_changes_the_readers_answer_probability(family, cfg):
    """The tag is a token the reader reads: the same (p, q, a) under d_true and d_gen gets different log P_D(a|p,q)."""
    mc = _model_config(family, {**cfg, "dropout": 0.0} if family == "funnel" else cfg)
    D = reader.make(mc, 40, nnx.Rngs(0))
    D.eval()  # no dropout: the difference is the tag's
    p = jnp.array([[11, 12, 13, 14, 15, 0], [16, 17, 18, 0, 0, 0]])
    q = jnp.array([[21, 22, 0], [23, 0, 0]])
    args = (p, jnp.array([5, 3]), q, jnp.array([2, 1]))
    answer_log_prob = nnx.jit(lambda D, tags: reader.log_prob(D, mc, *args, tags, jnp.array([1, 0]), jnp.array([2, 2])))
    lp = {t: np.asarray(answer_log_prob(D, jnp.full(2, t))) for t in (T.D_TRUE, T.D_GEN)}  # one program, two tags
    assert np.all(lp[T.D_TRUE] < 0) and np.all(np.abs(lp[T.D_TRUE] - lp[T.D_GEN]) > 1e-6)


# ----------------------------------------------------------------------------------------------------------------
# the generator: eq. 3.7 and REINFORCE
# ----------------------------------------------------------------------------------------------------------------


def _gen(v=13, tq=2, seed=0):
    return Generator(GeneratorConfig(v, 8, 8, tq), rngs=nnx.Rngs(seed))


def test_copy_mixture_eq_3_7():
    G = _gen(v=20, tq=3)
    p = jnp.array([[9, 10, 10, 0]])

    @nnx.jit
    def first_step_log_prob(G):
        """log P(y_1 | <bos>) [1, V] for the paragraph p (one compiled program; the gate's bias is an input)."""
        enc, s0 = G.encode(p, jnp.array([3]), jnp.array([1]), jnp.array([1]))
        return G.step(enc, p, (s0, jnp.zeros((1, 16))), jnp.array([T.BOS]))[1]

    logp = first_step_log_prob(G)
    prob = np.exp(np.asarray(logp[0]))
    assert abs(prob.sum() - 1) < 1e-5  # a distribution over the vocabulary
    for bias, inside in ((-60.0, True), (60.0, False)):  # g -> 0: copy only; g -> 1: the vocabulary softmax only
        G.gate.bias[...] = jnp.array([bias])
        lp = first_step_log_prob(G)
        pr = np.exp(np.asarray(lp[0]))
        if inside:
            assert abs(pr[[9, 10]].sum() - 1) < 1e-5  # only the paragraph's words
        else:
            specials = [T.PAD, T.SEP, T.CLS, T.BOS, T.D_TRUE, T.D_GEN]
            assert pr[specials].max() < 1e-8 and abs(pr.sum() - 1) < 1e-5


def _questions(allowed):
    """Every question of at most 2 steps: <eos> first, or a word then anything."""
    out = [[T.EOS, T.PAD]]
    out += [[a, b] for a, b in itertools.product(allowed, allowed) if a != T.EOS]
    return np.array(out, np.int32)


def test_sample_log_prob_is_teacher_forced_and_questions_sum_to_one():
    G = _gen()
    rows = (jnp.array([[9, 10, 11, 0]] * 64), jnp.full(64, 3), jnp.full(64, 1), jnp.full(64, 2))
    allowed = [T.UNK, T.EOS] + list(range(8, 13))
    qs = jnp.asarray(_questions(allowed))
    one = tuple(a[:1].repeat(len(qs), 0) for a in rows)

    @nnx.jit
    def sampled_teacher_forced_and_enumerated(G, key):
        """(sampled questions, their sampling log P, teacher-forced log P and mask, log P of every question)."""
        q, lps = G.sample(*rows, key)
        lp_tf, mask = G.log_prob(*rows, q)
        return q, lps, lp_tf, mask, G.log_prob(*one, qs)[0]

    q, lps, lp_tf, mask, lp_all = sampled_teacher_forced_and_enumerated(G, jax.random.key(1))
    np.testing.assert_allclose(np.asarray(lps), np.asarray(lp_tf), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(mask).sum(1) >= 1)
    total = np.exp(np.asarray(lp_all)).sum()
    assert abs(total - 1) < 1e-4  # P_G is normalised over all questions (masking after <eos> is right)
    words, n = reader_question(jnp.array([[12, T.EOS, 0], [12, 11, 10]]))
    assert np.asarray(n).tolist() == [1, 3] and np.asarray(words[0]).tolist() == [12, 0, 0]
    assert np.asarray(question_mask(jnp.array([[12, T.EOS, 0]]))).tolist() == [[1, 1, 0]]


def test_reinforce_gradient_exact_finite_difference_and_monte_carlo():
    """J(theta) = sum_q P_G(q|p,a) r(q) over every question; REINFORCE's expected gradient (any constant baseline)
    is dJ/dtheta; J's gradient agrees with central finite differences; the sampled estimate with the batch-mean
    baseline converges to it."""
    G = _gen()
    allowed = [T.UNK, T.EOS] + list(range(8, 13))
    qs = jnp.asarray(_questions(allowed))
    rewards = jnp.asarray(np.random.default_rng(0).normal(size=len(qs)), jnp.float32)
    row = (jnp.array([[9, 10, 11, 0]]), jnp.array([3]), jnp.array([1]), jnp.array([2]))
    gd, params, rest = nnx.split(G, nnx.Param, ...)

    def logp_all(ps):
        m = nnx.merge(gd, ps, rest)
        return m.log_prob(*(a.repeat(len(qs), 0) for a in row), qs)[0]

    def J(ps):
        return jnp.sum(jnp.exp(logp_all(ps)) * rewards)

    n = 20000  # Monte Carlo sample size

    @jax.jit
    def gradients(ps, d, key):
        """One program: dJ/dtheta; the expected REINFORCE gradient sum_q P(q) (r - b) grad log P(q) with b = 0.3 (a
        constant); J's central finite difference along d; the system's loss gradient on n sampled questions with
        baseline = their mean reward (and whether every sample is one of the enumerated questions)."""
        probs = jax.lax.stop_gradient(jnp.exp(logp_all(ps)))
        expected = jax.grad(lambda p: len(qs) * system.reinforce_loss(probs * logp_all(p), rewards, 0.3))(ps)
        eps = 1e-3
        shift = lambda s: jax.tree.map(lambda x, y: x + s * y, ps, d)  # noqa: E731
        fd = (J(shift(eps)) - J(shift(-eps))) / (2 * eps)
        rows = tuple(a.repeat(n, 0) for a in row)
        q, _ = nnx.merge(gd, ps, rest).sample(*rows, key)
        match = (q[:, None, :] == qs[None, :, :]).all(-1)  # [n, len(qs)]: which enumerated question was sampled
        r = rewards[jnp.argmax(match, -1)]

        def loss(p):
            return system.reinforce_loss(nnx.merge(gd, p, rest).log_prob(*rows, q)[0], r, jnp.mean(r))

        return jax.grad(J)(ps), expected, fd, jax.grad(loss)(ps), match.any(-1).all()

    d = jax.tree.map(lambda x: jnp.asarray(np.random.default_rng(1).normal(size=x.shape), x.dtype), params)
    exact, expected, fd, mc_grad, enumerated = gradients(params, d, jax.random.key(7))
    flat = lambda t: np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(t)])  # noqa: E731
    np.testing.assert_allclose(-flat(expected), flat(exact), rtol=1e-4, atol=1e-6)
    # central finite differences of J along a random direction
    directional = float(flat(exact) @ flat(d))
    assert abs(float(fd) - directional) < 2e-3 * max(1.0, abs(directional))
    # Monte Carlo: every sample is an enumerated question; the estimate converges to the exact gradient
    assert bool(enumerated)
    mc = -flat(mc_grad)
    cos = mc @ flat(exact) / (np.linalg.norm(mc) * np.linalg.norm(flat(exact)))
    assert cos > 0.97 and 0.85 < np.linalg.norm(mc) / np.linalg.norm(flat(exact)) < 1.15


# ----------------------------------------------------------------------------------------------------------------
# data, the game's losses, train / resume / eval
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gdan_data")
    standin.generate(str(d), articles=20, paragraphs_per_article=3, unlabeled=60, seed=3)
    return str(d)


def _over(fixture_dir, **extra):
    over = {
        "data.labeled": os.path.join(fixture_dir, "squad.json"),
        "data.unlabeled": os.path.join(fixture_dir, "unlabeled.txt"),
        "data.labeling_rate": 0.5,
        "data.paragraph_len": 24,
        "data.question_len": 8,
        "data.labeled_batch_size": 4,
        "data.unlabeled_batch_size": 4,
        "data.eval_batch_size": 16,
        "data.vocab_size": 400,
        "model.embed_dim": 8,
        "model.hidden": 8,
        **{f"model.reader.{k}": v for k, v in TINY_XLNET.items()},
        "gdan.gen_pretrain_steps": 3,
        "total_steps": 8,
        "log_every_steps": 1,
        "checkpoint.every_steps": 4,
        "mesh.num_devices": 1,
        **extra,
    }
    return {k: str(v) for k, v in over.items()}


def _config(fixture_dir, **extra):
    from xlgen import config as config_lib

    return config_lib.load_config("configs/ssl/gdan.py", _over(fixture_dir, **extra))


def test_article_split_labeling_rate_windows_and_pure_batches(fixture_dir):
    c = _config(fixture_dir)
    ds = gdata.dataset(c.data)
    arts = ds.record["articles"]
    assert len(arts["test"]) == len(arts["dev"]) == 2
    assert not (set(arts["labeled"]) & set(arts["test"])) and not (set(arts["labeled"]) & set(arts["dev"]))
    n = ds.record["num_questions"]
    assert n["labeled"] >= 0.5 * n["train_split"] and n["test"] == len(ds.test.examples) > 0
    L = ds.labeled
    for i in range(len(L)):  # the answer is inside its window and the question is the human one (truncated)
        assert 0 <= L.start[i] <= L.end[i] < L.plen[i] <= 24 and L.qlen[i] <= 7
        assert (L.gq[i, : L.qlen[i]] == L.q[i, : L.qlen[i]]).all() and L.gq[i, L.qlen[i]] == T.EOS
    U = ds.unlabeled
    assert len(U) > 60  # several extracted answers per paragraph
    p = U.p[0, : U.plen[0]].tolist()
    s, e = U.start[0], U.end[0]
    want = [w for w in p[max(0, s - 5) : s] + p[e + 1 : e + 6]][:7]
    assert U.q[0, : U.qlen[0]].tolist() == want  # the context baseline's question
    pipe = gdata.Pipeline(c.data)
    a, b, other = pipe.batch(5), pipe.batch(5), pipe.batch(6)
    assert all((a[k] == b[k]).all() for k in a) and not (a["l_p"] == other["l_p"]).all()
    shapes = gdata.batch_shapes(c.data)
    assert {k: v.shape for k, v in a.items()} == {k: s for k, (s, _) in shapes.items()}


def test_disc_loss_reads_d_gen_for_generated_questions(fixture_dir):
    """Eq. 3.8 with tags: D's loss = -J(L, d_true) - J(U_G, d_gen) for gen_domain, d_true throughout for gen."""
    assert system.unlabeled_tag(_config(fixture_dir, method="gen")) == T.D_TRUE
    assert system.unlabeled_tag(_config(fixture_dir, method="context_domain")) == T.D_GEN
    for method, tag in (("gen_domain", T.D_GEN),):
        c = _config(fixture_dir, method=method)
        ds = gdata.dataset(c.data)
        game = system.gdan_game(c, ds)
        models = {p.name: p.make(nnx.Rngs(i)) for i, p in enumerate(game.players)}
        emb = models["disc"].transformer.word_embedding  # make the two tags far apart: the loss tells them apart
        emb[...] = emb[...].at[T.D_GEN].set(3.0)
        batch = {k: jnp.asarray(v) for k, v in gdata.Pipeline(c.data).batch(0).items()}
        key, step = jax.random.key(3), jnp.asarray(10)
        d_loss = dict(game.order)["disc"]

        @nnx.jit
        def loss_and_tagged_references(models, batch, key, step):
            """(D's loss, {tag: -J(L, d_true) - J(U_G, tag)}) in one compiled program."""
            loss, _ = d_loss(models, batch, key, step, {})
            q, ql = system.unlabeled_questions(models, batch, key, c)

            def lp(prefix, qq, qlen, t):
                rows = [batch[prefix + k] for k in ("p", "plen")]
                return reader.log_prob(
                    models["disc"],
                    c.model,
                    *rows,
                    qq,
                    qlen,
                    jnp.full(4, t),
                    batch[prefix + "start"],
                    batch[prefix + "end"],
                )

            lab = -jnp.mean(lp("l_", batch["l_q"], batch["l_qlen"], T.D_TRUE))
            return loss, {t: lab - jnp.mean(lp("u_", q, ql, t)) for t in (T.D_TRUE, T.D_GEN)}

        loss, wants = loss_and_tagged_references(models, batch, key, step)
        for t in (T.D_TRUE, T.D_GEN):
            want = wants[t]
            assert (abs(float(loss) - float(want)) < 1e-4) == (t == tag), (t, float(loss), float(want))
        assert system.unlabeled_tag(c) == tag


def _losses(wd):
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        return {r["step"]: (r["disc_loss"], r.get("gen_loss")) for r in map(json.loads, f) if "split" not in r}


@pytest.mark.slow
def test_train_resume_eval_official_scorer(tmp_path, fixture_dir):
    c = _config(fixture_dir)
    over = _over(fixture_dir, method="gen_domain_adv")
    args = ["--config=configs/ssl/gdan.py"] + [f"--config.{k}={v}" for k, v in over.items()]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert cli.main(["train", *args, f"--workdir={a}"]) == 0
    assert cli.main(["train", *args, f"--workdir={b}", "--stop_at_step=5"]) == 0
    assert cli.main(["train", *args, f"--workdir={b}"]) == 0
    la, lb = _losses(a), _losses(b)
    assert sorted(lb) == list(range(1, 9)) and all(la[s] == lb[s] for s in range(6, 9))
    assert all(v[1] is not None for v in la.values())  # G trained every step: MLE, then REINFORCE
    _, _, pa, sa = restore_params(a)
    _, _, pb, sb = restore_params(b)
    assert sa == sb == 8
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert cli.main(["eval", f"--workdir={a}"]) == 0
    r = json.load(open(os.path.join(a, "eval_results.json")))
    preds = json.load(open(os.path.join(a, "eval", "predictions_test.json")))
    gold = gdata.dataset(c.data).test.gold()
    assert set(preds) == set(gold) and r["num_test"] == len(gold)
    want = squad_eval.evaluate_v1(gold, preds)
    assert r["exact"] == want["exact"] and r["f1"] == want["f1"] and 0 <= r["f1"] <= 100
    gen = json.load(open(os.path.join(a, "eval", "generated_questions.json")))
    assert len(gen["unlabeled"]) == 20 and all("human" in g for g in gen["labeled"])
    assert json.load(open(os.path.join(a, "gdan_data.json")))["num_questions"]["labeled"] > 0
