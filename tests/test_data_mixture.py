"""Weighted mixtures of corpora (`data.sources`, data_pipelines/mixture.py): source frequencies over 10,000 steps
match the weights within 1%; every source is read in order (nothing skipped or repeated), also across a weight
change on resume; a memory-carrying stream never changes source without `stream_reset`; per-source token counts;
and through the trainer, a mixture run resumed mid-way logs bitwise the uninterrupted run's metrics."""

import json
import os

import numpy as np
import pytest

import data_pipelines as dp
from data_pipelines import corpus as corpus_lib
from data_pipelines import lm, mixture, mlm, vocab, xlnet
from data_pipelines.prepare import prepare_corpus

TOK = vocab.SymbolVocab("char", list(vocab.XLNET_SPECIALS) + [chr(65 + i) for i in range(61)])


def _counting(offset, n=6000):
    """A corpus whose tokens say where they come from: source `offset`, position p -> 9 + (offset + p) % 61."""
    return corpus_lib.TokenCorpus([(np.arange(n, dtype=np.int32) + offset) % 61 + 9], None, TOK, f"c{offset}")


def _sentences(offset, n=6000):
    ids = (np.arange(n, dtype=np.int32) + offset) % 61 + 9
    sent = (np.arange(n) // 7) % 2 == 0  # a sentence every 7 tokens
    return corpus_lib.TokenCorpus([ids], [sent], TOK, f"s{offset}")


def _lm_mixture(weights, stages=None, mix_steps=4, batch=8):
    subs = [lm.LMStreamPipeline(_counting(10 * i), global_batch_size=batch, tgt_len=8) for i in range(len(weights))]
    names = [f"src{i}" for i in range(len(weights))]
    stages = stages or [(0, dict(zip(names, weights)))]
    return mixture.MixturePipeline(
        subs, names, stages, kind="stream", mix_steps=mix_steps, seed=3, rows_per_lane=1, tokens_per_row=8
    )


@pytest.mark.parametrize("weights", [(0.75, 0.25), (0.5, 0.3, 0.2), (0.1, 0.6, 0.05, 0.25)])
def test_source_frequencies_over_10000_steps_match_the_weights(weights):
    """The deal alone (no data read): per-row source choices of 10,000 steps of a stream mixture (episodes of one
    step, the finest deal) and of an example mixture, and the logged tokens/<name>, against the weights."""
    steps = 10_000
    for kind in ("stream", "example"):
        m = _lm_mixture(weights, mix_steps=1) if kind == "stream" else None
        if kind == "example":
            subs = [object()] * len(weights)
            m = mixture.MixturePipeline.__new__(mixture.MixturePipeline)
            m.names, m.kind, m.mix_steps, m.global_batch_size = [f"src{i}" for i in range(len(weights))], kind, 1, 8
            m.row0, m.local_batch_size, m.rows_per_lane, m.tokens_per_row, m.pipelines = 0, 8, 1, 8, subs
            m.deal = mixture.Deal([(0, dict(zip(m.names, weights)))], m.names, 3, lambda t: t * 8)
        src = np.stack([m.sources(s) for s in range(steps)])  # [steps, rows]
        freq = np.bincount(src.ravel(), minlength=len(weights)) / src.size
        np.testing.assert_allclose(freq, weights, atol=0.01)
        for r in range(src.shape[1]) if kind == "stream" else ():  # each stream alone, within a slot per source
            counts = np.bincount(src[:, r], minlength=len(weights))
            assert np.abs(counts - np.asarray(weights) * steps).max() <= len(weights), (r, counts)
        tokens = m.source_tokens(steps)
        assert [tokens[f"tokens/src{i}"] for i in range(len(weights))] == (
            np.bincount(src.ravel(), minlength=len(weights)) * 8
        ).tolist()


def _walk(m, steps):
    """Per step: the coords and batch of every row."""
    return [(m.coords(s), m.batch(s)) for s in range(steps)]


def test_streams_continue_their_source_or_reset():
    """LM mixture: a row whose source changes has stream_reset; a row without reset continues its previous
    segment token for token in the same source; each source's rows are read in order, nothing skipped."""
    m = _lm_mixture((0.6, 0.4), mix_steps=3)
    walk = _walk(m, 60)
    seen = {}
    for t, ((src, (vstep, vrow), switched), b) in enumerate(walk):
        for r in range(8):
            sub = m.pipelines[src[r]]
            np.testing.assert_array_equal(b["input_ids"][r], sub.rows([(int(vstep[r]), r)])["input_ids"][0])
            seen.setdefault((int(src[r]), r), []).append(int(vstep[r]))
            if t == 0:
                assert b["stream_reset"][r]
                continue
            prev_src, _, _ = walk[t - 1][0]
            if prev_src[r] != src[r]:
                assert b["stream_reset"][r], (t, r)
            elif not b["stream_reset"][r]:
                assert b["input_ids"][r][0] == walk[t - 1][1]["labels"][r][-1]  # the stream goes on
    for (s, r), vs in seen.items():
        assert vs == list(range(len(vs))), (s, r)  # the source's row read in order, no skip, no repeat
    assert len({s for s, _ in seen}) == 2


def test_xlnet_and_mlm_mixtures_read_their_sources_rows():
    """XLNet (bi_data: the two rows of a stream share its source) and MLM mixtures: every row is the row of its
    source's own pipeline at the dealt position, and the XLNet streams reset on every source change."""
    kw = dict(global_batch_size=8, seq_len=32, reuse_len=16, perm_size=8, num_predict=5)
    subs = [xlnet.XLNetPipeline(_sentences(17 * i), **kw) for i in range(2)]
    m = mixture.MixturePipeline(
        subs,
        ["a", "b"],
        [(0, {"a": 0.5, "b": 0.5})],
        kind="stream",
        mix_steps=2,
        seed=0,
        rows_per_lane=2,
        tokens_per_row=32,
    )
    prev = None
    for t in range(8):
        src, (vstep, vrow), switched = m.coords(t)
        assert np.all(src[0::2] == src[1::2])
        b = m.batch(t)
        for r in range(8):
            ref = subs[src[r]].rows([(int(vstep[r]), r)])
            for k in ("input_ids", "perm_mask", "target_mapping", "is_forward"):
                np.testing.assert_array_equal(b[k][r], ref[k][0])
            if prev is not None and prev[r] != src[r]:
                assert b["stream_reset"][r]
        prev = src
    subs = [mlm.MLMPipeline(_sentences(5 * i), global_batch_size=4, seq_len=24) for i in range(2)]
    m = mixture.MixturePipeline(
        subs,
        ["a", "b"],
        [(0, {"a": 0.25, "b": 0.75})],
        kind="example",
        mix_steps=1,
        seed=0,
        rows_per_lane=1,
        tokens_per_row=24,
    )
    counts = [0, 0]
    for t in range(6):
        src, _, _ = m.coords(t)
        b = m.batch(t)
        for r in range(4):  # the k-th example of source s is that source's example k
            s = src[r]
            ref = subs[s].rows([divmod(counts[s], 4)])
            np.testing.assert_array_equal(b["input_ids"][r], ref["input_ids"][0])
            counts[s] += 1
    assert m.source_tokens(6) == {"tokens/a": counts[0] * 24, "tokens/b": counts[1] * 24}


def test_weights_changed_on_resume_continue_every_source():
    """A run whose weights change at step 12 (a multiple of mix_steps): steps before it are unchanged, the new
    weights rule after it, and every source still reads its rows in order with nothing skipped or read twice."""
    old = _lm_mixture((0.8, 0.2), mix_steps=4)
    new = _lm_mixture(
        (0.2, 0.8), stages=[(0, {"src0": 0.8, "src1": 0.2}), (12, {"src0": 0.2, "src1": 0.8})], mix_steps=4
    )
    for t in range(12):
        np.testing.assert_array_equal(old.batch(t)["input_ids"], new.batch(t)["input_ids"])
    seen = {}
    for t in range(200):
        src, (vstep, _), _ = new.coords(t)
        for r in range(8):
            seen.setdefault((int(src[r]), r), []).append(int(vstep[r]))
    for vs in seen.values():
        assert vs == list(range(len(vs)))
    late = np.stack([new.sources(t) for t in range(12, 2012, 4)])
    assert abs((late == 1).mean() - 0.8) < 0.01
    tok = new.source_tokens(200)
    counted = np.bincount(np.concatenate([new.sources(t) for t in range(200)]), minlength=2) * 8
    assert [tok["tokens/src0"], tok["tokens/src1"]] == counted.tolist()


def test_history_from_config_changes():
    old = {"sources": "a:0.5,b:0.5", "sources_history": ((4, "a"),)}
    assert mixture.continue_history(old, {"sources": "a:1,b:1"}, 10) == ((4, "a"),)  # same shares: no stage
    assert mixture.continue_history(old, {"sources": "a:0.9,b:0.1"}, 10) == ((4, "a"), (10, "a:0.5,b:0.5"))
    assert mixture.continue_history(old, {"sources": "a:0.9,b:0.1"}, 3) == ((3, "a:0.5,b:0.5"),)  # rolled back
    assert mixture.resolve_sources("x:0.5,y,z")[2].tolist() == [0.5, 0.25, 0.25]  # the others share the rest
    with pytest.raises(ValueError, match="nothing is left"):
        mixture.resolve_sources("x:1,y")
    with pytest.raises(ValueError, match="share the base name 'c'"):
        mixture.resolve_sources("a/c,b/c")
    assert mixture.parse_sources("gs://bkt/x:0.25,/d/y") == [("gs://bkt/x", 0.25), ("/d/y", None)]
    assert mixture.resolve_sources("/d/x,/e/y")[2].tolist() == [0.5, 0.5]


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """Two prepared char corpora sharing one vocabulary (the embedded corpus split in two)."""
    root = tmp_path_factory.mktemp("mix")
    text = open(corpus_lib.EMBEDDED["tinyshakespeare"], encoding="utf-8").read()
    tok = vocab.SymbolVocab.build("char", [text])
    half = len(text) // 2
    dirs = []
    for name, part in (("plays", text[:half]), ("sonnets", text[half:])):
        src = root / f"{name}.txt"
        src.write_text(part, encoding="utf-8")
        valid = root / f"{name}.valid.txt"
        valid.write_text(part[-5000:], encoding="utf-8")
        out = str(root / name)
        prepare_corpus({"train": [str(src)], "valid": [str(valid)]}, tok, out, layout="sentences", progress=False)
        dirs.append(out)
    return dirs


def test_make_pipeline_mixture_of_prepared_corpora(two_corpora):
    a, b = two_corpora
    cfg = dp.default_config("lm")
    cfg.update(dict(sources=f"{a}:0.75,{b}:0.25", batch_size=4, tgt_len=16, mix_steps=2))
    p0, p1 = (dp.make_pipeline(cfg, process_index=i, process_count=2) for i in range(2))
    one = dp.make_pipeline(cfg)
    for t in (0, 5, 9):
        both = {k: np.concatenate([p0.batch(t)[k], p1.batch(t)[k]]) for k in one.batch(t)}
        for k, v in one.batch(t).items():
            np.testing.assert_array_equal(v, both[k])
    assert set(one.source_tokens(4)) == {"tokens/plays", "tokens/sonnets"}
    assert dp.make_pipeline(cfg, split="valid").corpus.description.startswith(a)  # evaluation: the first source
    single = dp.default_config("lm")
    single.update(dict(source=a, batch_size=4, tgt_len=16))
    alone = dp.make_pipeline(dict(cfg.to_dict(), sources=a))  # one source: exactly the single-source pipeline
    for t in (0, 7):
        for k, v in dp.make_pipeline(single).batch(t).items():
            np.testing.assert_array_equal(alone.batch(t)[k], v)


def test_mixture_training_resumes_bitwise_and_logs_source_tokens(two_corpora, tmp_path, capsys):
    """Transformer-XL on a two-corpus mixture through the trainer: 8 steps in one go vs 4, stop, resume -> the
    same losses bitwise; metrics.jsonl carries tokens/plays and tokens/sonnets summing to the tokens trained."""
    from test_train_utils import REPO

    from xlgen.config import load_config
    from xlgen.train import loop

    a, b = two_corpora
    over = {
        "data.sources": f"{a}:0.75,{b}:0.25",
        "data.mix_steps": "2",
        "total_steps": "8",
        "checkpoint.every_steps": "4",
        "log_every_steps": "1",
        "eval_every_steps": "0",
        "tensorboard": "False",
        "mesh.num_devices": "1",
        "model.n_layer": "1",
    }

    def train(wd, stop_at=None):
        return loop.train(load_config(f"{REPO}/configs/pretrain/txl_tiny.py", over), wd, stop_at=stop_at)

    def records(wd):
        with open(os.path.join(wd, "metrics.jsonl")) as f:
            return {r["step"]: r for r in map(json.loads, f) if "split" not in r}

    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    train(full)
    train(part, stop_at=4)
    capsys.readouterr()
    train(part)
    assert f"resumed from {part}/checkpoints/4" in capsys.readouterr().out
    x, y = records(full), records(part)
    for s in range(5, 9):
        assert x[s]["loss"] == y[s]["loss"] and x[s]["tokens/plays"] == y[s]["tokens/plays"], s
    for s, r in x.items():
        assert r["tokens/plays"] + r["tokens/sonnets"] == s * 8 * 32
    assert x[8]["tokens/plays"] > 2 * x[8]["tokens/sonnets"]
