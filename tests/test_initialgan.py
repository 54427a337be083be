"""InitialGAN pieces (seed 004 §III): the fully normalised LSTM against a hand-written NumPy cell, Table III's
parameter counts, dropout sampling's determinism, the Lipschitz penalty and the batch ratio."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from xlgen.systems.initialgan import gan, lstm


def _ln(x, g, b, eps=1e-3):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _reference_fn_lstm(p, xs, hidden):
    """Eq. 3 written out in NumPy, float64, gates (f, i, o, ĉ)."""
    h = np.zeros((xs.shape[0], hidden))
    c = np.zeros((xs.shape[0], hidden))
    out = []
    for t in range(xs.shape[1]):
        a = _ln(h @ p["w_h"], *p["ln_h"]) + _ln(xs[:, t] @ p["w_x"], *p["ln_x"]) + p["b"]
        f, i, o, g = np.split(a, 4, axis=-1)
        c = _ln(_sig(f), *p["ln_f"]) * c + _sig(i) * np.tanh(g)
        h = _ln(_sig(o), *p["ln_o"]) * np.tanh(c)
        out.append(h)
    return np.stack(out, 1)


def _np(x):
    return np.asarray(x[...], np.float64)


def test_fully_normalised_lstm_matches_reference_cell():
    rng = np.random.default_rng(0)
    hidden, d_in = 6, 5
    stack = lstm.LSTMStack(d_in, hidden, 1, cell="fn", rngs=nnx.Rngs(0))
    cell = stack.cells[0]
    # LN gains and biases away from (1, 0) so that each LN's affine part is exercised
    for ln in (cell.ln_x, cell.ln_h, cell.ln_f, cell.ln_o):
        ln.scale[...] = jnp.asarray(rng.uniform(0.5, 1.5, ln.scale.shape), jnp.float32)
        ln.bias[...] = jnp.asarray(rng.normal(0, 0.3, ln.bias.shape), jnp.float32)
    cell.b[...] = jnp.asarray(rng.normal(0, 0.3, cell.b.shape), jnp.float32)
    p = {
        "w_x": _np(cell.w_x.kernel),
        "w_h": _np(cell.w_h.kernel),
        "b": _np(cell.b),
        **{k: (_np(getattr(cell, k).scale), _np(getattr(cell, k).bias)) for k in ("ln_x", "ln_h", "ln_f", "ln_o")},
    }
    xs = rng.normal(size=(3, 7, d_in))
    got = np.asarray(stack(jnp.asarray(xs, jnp.float32)))
    np.testing.assert_allclose(got, _reference_fn_lstm(p, xs, hidden), atol=2e-5)
    # the LayerNorm LSTM differs exactly where eq. 3 adds LN(σ(f)), LN(σ(o))
    ln_stack = lstm.LSTMStack(d_in, hidden, 1, cell="ln", rngs=nnx.Rngs(0))
    assert not np.allclose(np.asarray(ln_stack(jnp.asarray(xs, jnp.float32))), got, atol=1e-3)


@pytest.mark.parametrize("cell,count", [("fn", 2_109_440), ("ln", 2_108_416)])
def test_parameter_counts_of_table_iii(cell, count):
    """Table III: one layer, input and hidden 512."""
    m = nnx.eval_shape(lambda: lstm.LSTMCell(512, 512, cell=cell, rngs=nnx.Rngs(0)))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(m, nnx.Param))) == count


def _generator(dropout_sampling=True):
    return gan.Generator(30, 8, 4, 16, 2, 6, rate=0.75, dropout_sampling=dropout_sampling, rngs=nnx.Rngs(1))


def test_dropout_sampling_same_seed_same_sentences_other_masks_other_sentences():
    g = _generator()
    f_lt = (jax.random.normal(jax.random.key(2), (6, 30)), jnp.zeros((30,)))
    k_noise, k_mask = jax.random.key(10), jax.random.key(11)
    run = nnx.jit(lambda g, nk, mk: g(f_lt, nk, mk, batch=16, length=12, bos_id=1))
    r1, w1 = run(g, k_noise, k_mask)
    r2, w2 = run(g, k_noise, k_mask)
    np.testing.assert_array_equal(np.asarray(w1), np.asarray(w2))
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
    _, w3 = run(g, k_noise, jax.random.key(12))  # same noise, other dropout masks
    assert (np.asarray(w3) != np.asarray(w1)).any(axis=1).mean() > 0.5
    # the mask is all the randomness that differs: without dropout sampling, another mask key changes nothing
    g0 = _generator(dropout_sampling=False)
    np.testing.assert_array_equal(
        np.asarray(run(g0, k_noise, k_mask)[1]), np.asarray(run(g0, k_noise, jax.random.key(12))[1])
    )
    # the mask drops ~ρ of z's inputs
    _, keep = g.randomness(k_noise, k_mask, 64, 12)
    assert abs(float(keep.mean()) - 0.25) < 0.02


def test_lipschitz_penalty_and_batch_ratio():
    assert gan.generator_batch(128, 0.75) == 512 and gan.generator_batch(128, 0.75, dropout_sampling=False) == 128
    d = gan.Discriminator(4, 8, 2, rngs=nnx.Rngs(0))
    r_d = jax.random.normal(jax.random.key(0), (5, 6, 4))
    r_g = jax.random.normal(jax.random.key(1), (5, 6, 4))
    key = jax.random.key(3)

    @nnx.jit
    def both(d):
        # by hand: each sentence's own gradient of D at the same r_m, one at a time
        e = jax.random.uniform(key, (5, 1, 1))
        r_m = e * r_d + (1 - e) * r_g
        norms = jnp.stack([jnp.linalg.norm(jax.grad(lambda r: d(r[None])[0])(r_m[b])) for b in range(5)])
        loss, m = gan.critic_loss(d, r_d, r_g, key, lambda_d=50.0)
        return norms, gan.lipschitz_penalty(d, r_d, r_g, key), loss, m["wasserstein"]

    norms, pen, loss, w = both(d)
    expect = np.mean(np.maximum(0, np.asarray(norms, np.float64) - 1) ** 2)
    assert float(pen) == pytest.approx(expect, rel=1e-4, abs=1e-9)
    assert float(loss) == pytest.approx(-float(w) + 50 * expect, rel=1e-4, abs=1e-6)


def _write_corpus(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_train_resume_is_exact_eval_and_generate_are_deterministic(tmp_path, capsys):
    """xlgen train through the one loop and the shared game: 8 steps (4 aligner + 4 adversarial) equal 6 steps, stop,
    resume to 8, bit for bit; the aligner stays frozen in the adversarial phase; xlgen generate gives the same
    sentences for the same seed and others for another seed; xlgen eval writes every text metric."""
    from xlgen import cli
    from xlgen.train.workdir import Workdir

    corpus = tmp_path / "train.txt"
    _write_corpus(corpus)
    base = ["train", "--config=configs/textgan/initialgan.py:tiny", f"--config.data.train={corpus}", "--platform=cpu"]
    base += ["--config.checkpoint.keep=0", "--config.mesh.num_devices=1"]  # keep every checkpoint (steps 4 and 8)
    assert cli.main(base + [f"--workdir={tmp_path / 'a'}"]) == 0
    assert cli.main(base + [f"--workdir={tmp_path / 'b'}", "--stop_at_step=6"]) == 0
    assert cli.main(base + [f"--workdir={tmp_path / 'b'}"]) == 0
    _, _, ra = Workdir(str(tmp_path / "a")).open()
    _, _, rb = Workdir(str(tmp_path / "b")).open()
    assert ra.step == rb.step == 8
    for x, y in zip(jax.tree.leaves(ra.state), jax.tree.leaves(rb.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the aligner is frozen in the adversarial phase: steps 4 -> 8 leave it as at step 4; the others moved
    _, _, r4 = Workdir(str(tmp_path / "a")).open(step=4)
    for x, y in zip(jax.tree.leaves(r4.state["params"]["aligner"]), jax.tree.leaves(ra.state["params"]["aligner"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for p in ("generator", "discriminator"):
        moved = [not np.array_equal(x, y) for x, y in zip(*(jax.tree.leaves(r.state["params"][p]) for r in (r4, ra)))]
        assert any(moved), p
    capsys.readouterr()
    outs = []
    for seed in (1, 1, 2):
        assert cli.main(["generate", f"--workdir={tmp_path / 'a'}", "--num_samples=6", f"--seed={seed}"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0] != outs[2] and len(outs[0].splitlines()) == 6
    assert cli.main(["generate", f"--workdir={tmp_path / 'a'}", "--prompt=the"]) == 2  # unconditional: no prompt
    assert cli.main(["eval", f"--workdir={tmp_path / 'a'}", "--platform=cpu"]) == 0
    res = json.load(open(tmp_path / "a" / "eval_results.json"))
    for k in ("bleu", "self_bleu", "inverse_bleu", "fed", "lcr", "lcr_tau_0.5", "mean_length"):
        assert np.isfinite(res[k]), k
    assert len((tmp_path / "a" / "eval" / "samples.txt").read_text().splitlines()) == 64


def test_sentence_data_rows_split_and_batches():
    from xlgen.systems.initialgan import data as d

    sents = [["a", "b", "a"], ["c"], ["b", "a", "x", "y", "z"], ["a"]]
    v = d.WordVocab.build(sents)
    assert v.itos[: d.FIRST_WORD + 2] == list(d.SPECIALS) + ["a", "b"]  # by frequency, ties alphabetical
    rows = d.encode_rows(v, sents, max_len=4)  # at most 3 words: the 5-word sentence is dropped
    assert rows.shape == (3, 4) and rows[0].tolist() == [v.stoi["a"], v.stoi["b"], v.stoi["a"], d.EOS]
    assert rows[1].tolist() == [v.stoi["c"], d.EOS, d.PAD, d.PAD] and v.decode(rows[1]) == "c"
    assert d.WordVocab.from_json(v.to_json()).itos == v.itos
    train, ref = d.split_sentences([[str(i)] for i in range(20)], None, 0.25, seed=3)
    assert len(ref) == 5 and len(train) == 15 and not {s[0] for s in ref} & {s[0] for s in train}
    b1, b2 = d.batch_rows(rows, 7, 11, 8), d.batch_rows(rows, 7, 11, 8)
    np.testing.assert_array_equal(b1, b2)  # a batch is a function of (seed, step)
    assert not np.array_equal(d.batch_rows(rows, 7, 12, 8), b1)
