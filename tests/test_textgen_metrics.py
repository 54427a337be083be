"""Text-generation metrics (seed 004 §IV-A): BLEU family against nltk itself, FED and LCR on sets with known
answers, and the `xlgen analyze textgen` command."""

import json
import random

import numpy as np
import pytest
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from xlgen.analyze import textgen
from xlgen.analyze import textgen_metrics as tm
from xlgen.analyze.sentence_encoders import LSAEncoder

WORDS = "the a cat dog sat on mat ran fast slow big small red blue house tree".split()


def _sentences(n, seed, lo=3, hi=12):
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _nltk_mean(hyps, refs_for, n):
    w = tuple([1.0 / n] * n)
    smooth = SmoothingFunction().method1
    return float(np.mean([sentence_bleu(refs_for(i), h, w, smoothing_function=smooth) for i, h in enumerate(hyps)]))


def test_bleu_known_case_equals_nltk():
    """Hand-checkable case: hypothesis identical to one reference -> 1; and the value nltk gives directly."""
    refs = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "ran"]]
    assert tm.bleu_scores([refs[0]], refs, orders=(2, 5))[5] == pytest.approx(1.0)
    hyp = ["the", "cat", "sat", "on", "a", "mat"]
    expect = sentence_bleu(refs, hyp, (0.25,) * 4, smoothing_function=SmoothingFunction().method1)
    assert tm.bleu_scores([hyp], refs, orders=(4,))[4] == pytest.approx(expect, abs=1e-12)
    # unigrams 6/6 ("a" from the second reference), bigrams 3/5 (the cat, cat sat, sat on), trigrams 2/4,
    # 4-grams 1/3; brevity penalty 1 (a reference of length 6)
    assert expect == pytest.approx((1 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_bleu_self_inverse_equal_nltk_over_whole_sets(seed):
    """The reference-subset index gives exactly nltk's sentence_bleu over every reference (clipping, closest
    length with ties, leave-one-out for Self-BLEU)."""
    gen, ref = _sentences(40, seed), _sentences(50, seed + 100, lo=1, hi=14)
    gen[3] = list(gen[7])  # a duplicate: Self-BLEU must still drop only the sentence itself
    got = tm.bleu_scores(gen, ref)
    got_self = tm.bleu_scores(gen, gen, leave_one_out=True)
    got_inv = tm.bleu_scores(ref, gen)
    for n in tm.BLEU_ORDERS:
        assert got[n] == pytest.approx(_nltk_mean(gen, lambda i: ref, n), abs=1e-12)
        assert got_self[n] == pytest.approx(_nltk_mean(gen, lambda i: gen[:i] + gen[i + 1 :], n), abs=1e-12)
        assert got_inv[n] == pytest.approx(_nltk_mean(ref, lambda i: gen, n), abs=1e-12)


def test_fed_and_lcr_known_answers():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(300, 8))
    assert tm.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)
    assert tm.lcr(a, a, tau=0.99) == 1.0
    # shifted Gaussian with the same covariance: FED = |Δμ|²
    assert tm.frechet_distance(a, a + 3.0) == pytest.approx(8 * 9.0, rel=1e-6)
    # disjoint supports (orthogonal embeddings): no pair has positive cosine
    x = np.abs(rng.normal(size=(50, 8)))
    y = np.abs(rng.normal(size=(40, 8)))
    x[:, 4:], y[:, :4] = 0.0, 0.0
    assert tm.lcr(x, y, tau=0.01) == 0.0
    # half of A collapsed onto one point of B: coverage of B drops, LCR is the smaller rate
    b = np.eye(8)
    a2 = np.concatenate([np.eye(8)[:1].repeat(4, 0), -np.eye(8)[:4]])
    ra, rb = tm.coverage(a2, b, [0.9])[0.9]
    assert (ra, rb) == (0.5, 1 / 8) and tm.lcr(a2, b, 0.9) == 1 / 8


def test_lsa_encoder_identical_and_disjoint_sets():
    s = [" ".join(x) for x in _sentences(120, 3)]
    enc = LSAEncoder(s, dim=16)
    e = enc.encode(s)
    assert tm.lcr(e, e, tau=0.95) == 1.0 and tm.frechet_distance(e, e) == pytest.approx(0.0, abs=1e-6)
    other = [" ".join(w.upper() + "x" for w in x) for x in _sentences(60, 4)]  # no shared token
    assert tm.lcr(enc.encode(other), e, tau=0.1) == 0.0


def test_cli_json(tmp_path, capsys):
    gen = tmp_path / "gen.txt"
    ref = tmp_path / "ref.txt"
    gen.write_text("\n".join(" ".join(x) for x in _sentences(60, 5)) + "\n\n")
    ref.write_text("\n".join(" ".join(x) for x in _sentences(80, 6)) + "\n")
    out = tmp_path / "m.json"
    assert textgen.main([f"--generated={gen}", f"--reference={ref}", "--encoder=lsa:16", f"--json={out}"]) == 0
    m = json.loads(out.read_text())
    for key in ("bleu", "self_bleu", "inverse_bleu", "fed", "lcr", "lcr_by_tau"):
        assert key in m
    assert m["bleu"] == m["bleu_by_n"]["5"] and m["lcr"] == m["lcr_by_tau"]["0.65"]
    assert "lsa" in m["encoder"] and "Universal Sentence Encoder" in m["encoder_deviation"]
    assert m["bleu_sizes"] == {"generated": 60, "reference": 80}
    # the same file on both sides: LCR 1 at every τ, FED 0
    assert textgen.main([f"--generated={ref}", f"--reference={ref}", "--no_bleu", f"--json={out}"]) == 0
    m = json.loads(out.read_text())
    assert set(m["lcr_by_tau"].values()) == {1.0} and m["fed"] == pytest.approx(0.0, abs=1e-6)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert textgen.main([f"--generated={empty}", f"--reference={ref}"]) == 2
    assert "empty.txt: no sentences" in capsys.readouterr().err
