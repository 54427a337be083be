"""Input pipelines: stream continuity, bi_data reversal, resume determinism, multi-process equality, XLNet
permutation-mask invariants, span statistics, MLM masking."""

import numpy as np
import pytest

import data_pipelines as dp
from data_pipelines import corpus as corpus_lib
from data_pipelines import lm, mlm, vocab, xlnet
from data_pipelines.rng import keyed_rng


def _sentences(n_lines, seed=0):
    r = np.random.default_rng(seed)
    words = ["".join(r.choice(list("abcdefghij"), size=r.integers(1, 7))) for _ in range(300)]
    lines = []
    for i in range(n_lines):
        if i % 9 == 8:
            lines.append("")  # end of document
        else:
            lines.append(" ".join(r.choice(words, size=r.integers(2, 12))) + ".")
    return lines


@pytest.fixture(scope="module")
def char_sentences():
    lines = _sentences(3000)
    tok = vocab.SymbolVocab.build("char", ["\n".join(lines)])
    ids, sent, docs = corpus_lib.encode_lines(tok, lines, "sentences")
    return corpus_lib.TokenCorpus([ids], [sent], tok, "synthetic", docs)


@pytest.fixture(scope="module")
def char_stream():
    ids = np.arange(50_000, dtype=np.int32) % 61 + 9
    tok = vocab.SymbolVocab("char", list(vocab.XLNET_SPECIALS) + [chr(65 + i) for i in range(61)])
    return corpus_lib.TokenCorpus([ids], None, tok, "counting")


def _concat(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


# ------------------------------------------------------------------------------------------------ Transformer-XL
def test_lm_stream_continuity_and_passes(char_stream):
    p = lm.LMStreamPipeline(char_stream, global_batch_size=6, tgt_len=32, seed=3)
    sp = p.steps_per_pass
    prev = p.batch(0)
    assert prev["stream_reset"].all()
    for step in range(1, sp + 3):
        b = p.batch(step)
        np.testing.assert_array_equal(b["labels"][:, :-1], b["input_ids"][:, 1:])
        if step % sp:
            assert not b["stream_reset"].any()
            np.testing.assert_array_equal(b["input_ids"][:, 0], prev["labels"][:, -1])  # every row continues
            # rows are the contiguous streams of batchify: row r starts at r * L
            start = p.row_start(step, 0) % char_stream.num_tokens
            np.testing.assert_array_equal(b["input_ids"][0], char_stream.tokens(start, 32))
        else:
            assert b["stream_reset"].all()
        prev = b
    assert p.pass_offset(1) != p.pass_offset(2)  # random rotations per pass


def test_lm_multiprocess_and_resume(char_stream):
    one = lm.LMStreamPipeline(char_stream, global_batch_size=8, tgt_len=16, seed=1)
    parts = [
        lm.LMStreamPipeline(char_stream, global_batch_size=8, tgt_len=16, seed=1, process_index=i, process_count=4)
        for i in range(4)
    ]
    for step in (0, 5, one.steps_per_pass + 2):
        full = one.batch(step)
        glued = _concat([q.batch(step) for q in parts])
        for k in full:
            np.testing.assert_array_equal(full[k], glued[k])


def test_lm_eval_covers_stream(char_stream):
    ev = lm.LMStreamPipeline(char_stream, global_batch_size=4, tgt_len=100, finite=True)
    batches = list(ev)
    assert len(batches) == ev.num_steps
    labels = np.concatenate([b["labels"] for b in batches], axis=1)
    mask = np.concatenate([b["label_mask"] for b in batches], axis=1).astype(bool)
    L = char_stream.num_tokens // 4
    for r in range(4):
        np.testing.assert_array_equal(labels[r][mask[r]], char_stream.tokens(r * L + 1, L - 1))


def test_demo_config_needs_no_preparation():
    cfg = dp.default_config("lm")
    cfg.batch_size, cfg.tgt_len = 4, 64
    tr, va = dp.make_pipeline(cfg), dp.make_pipeline(cfg, split="valid")
    assert tr.vocab_size == va.vocab_size == 74
    text = tr.tokenizer.decode(tr.batch(0)["input_ids"][0])
    assert text.startswith("First Citizen:\nBefore we proceed")
    assert va.num_steps > 0 and va.corpus.num_tokens < tr.corpus.num_tokens / 5
    with pytest.raises(ValueError, match="unknown config.data key"):
        dp.make_pipeline({"pipeline": "lm", "tgt_lenn": 3})


def test_corpus_smaller_than_global_batch(char_stream):
    with pytest.raises(ValueError, match="counting: corpus too small"):
        lm.LMStreamPipeline(char_stream, global_batch_size=2000, tgt_len=32)
    with pytest.raises(ValueError, match="synthetic: corpus too small"):
        xlnet.XLNetPipeline(
            corpus_lib.TokenCorpus(
                [np.zeros(100, np.int32) + 20], [np.zeros(100, bool)], char_stream.tokenizer, "synthetic"
            ),
            global_batch_size=4,
            seq_len=64,
            reuse_len=32,
            num_predict=10,
        )


# ------------------------------------------------------------------------------------------------------- XLNet
def _xl(corpus, **kw):
    args = dict(global_batch_size=8, seq_len=64, reuse_len=32, perm_size=16, num_predict=12, bi_data=True, seed=7)
    args.update(kw)
    return xlnet.XLNetPipeline(corpus, **args)


def test_xlnet_perm_mask_invariants(char_sentences):
    p = _xl(char_sentences)
    S, R, P = p.seq_len, p.reuse_len, p.num_predict
    batches = _concat([p.batch(s) for s in range(0, 300, 1)])  # 2400 examples
    n = len(batches["input_ids"])
    assert n >= 2000
    ids, seg, pm = batches["input_ids"], batches["token_type_ids"], batches["perm_mask"].astype(bool)
    tm, tid, tmask = batches["target_mapping"], batches["target_ids"], batches["target_mask"]
    func = (ids == p.sep_id) | (ids == p.cls_id)
    # exactly num_predict one-hot targets, split num_predict - num_predict//2 / num_predict//2 between the halves
    assert (tmask == 1).all() and (tm.sum(-1) == 1).all()
    is_tgt = tm.sum(1).astype(bool)
    assert (is_tgt.sum(1) == P).all()
    assert (is_tgt[:, :R].sum(1) == P - P // 2).all()
    pos = tm.argmax(-1)
    assert (np.diff(pos, axis=1) > 0).all()  # ascending positions
    np.testing.assert_array_equal(tid, np.take_along_axis(ids, pos, 1))  # target = the token itself
    assert not (is_tgt & func).any()  # <sep>/<cls> never targets
    ctx = ~is_tgt & ~func
    halves = [slice(0, R), slice(R, S)]
    # cross-half rule
    assert pm[:, :R, R:].all() and not pm[:, R:, :R].any()
    eye = np.eye(S, dtype=bool)
    assert pm[:, eye][is_tgt].all()  # targets never see themselves
    for h in halves:
        blk = pm[:, h, h]
        t, c = is_tgt[:, h], ctx[:, h]
        # everyone sees context tokens; context tokens see no targets
        assert not (blk & c[:, None, :]).any()
        assert (blk | ~(c[:, :, None] & t[:, None, :])).all()
        # among targets, "i sees j" is a strict total order (a transitive tournament)
        for e in range(0, n, 97):
            ti = np.flatnonzero(t[e])
            sees = ~blk[e][np.ix_(ti, ti)]
            k = len(ti)
            assert not sees[np.eye(k, dtype=bool)].any()
            off = ~np.eye(k, dtype=bool)
            assert (sees ^ sees.T)[off].all()
            assert sorted(sees.sum(1).tolist()) == list(range(k))
    # segment ids and layout: [reuse | A <sep> B <sep> <cls>], 0 ... 0 1 ... 1 2
    assert (ids[:, -1] == p.cls_id).all() and (ids[:, -2] == p.sep_id).all()
    assert (seg[:, :R] == 0).all() and (seg[:, -1] == 2).all() and (seg[:, -2] == 1).all()
    assert (np.diff(seg[:, :-1], axis=1) >= 0).all()
    first_b = (seg == 1).argmax(1)
    assert (ids[np.arange(n), first_b - 1] == p.sep_id).all()
    assert ((ids == p.sep_id).sum(1) >= 2).all()
    assert 0.3 < batches["nsp_label"].mean() < 0.7


def test_xlnet_streams_bidirectional(char_sentences):
    p = _xl(char_sentences)
    R, L = p.reuse_len, p.row_len
    b0, b1 = p.batch(0), p.batch(1)
    assert (b0["is_forward"] == np.tile([True, False], 4)).all()
    for s in range(4):
        fwd = char_sentences.tokens(s * L, L)
        for step in range(3):
            b = p.batch(step)
            np.testing.assert_array_equal(b["input_ids"][2 * s, :R], fwd[step * R : (step + 1) * R])
            np.testing.assert_array_equal(b["input_ids"][2 * s + 1, :R], fwd[::-1][step * R : (step + 1) * R])
    assert b0["stream_reset"].all() and not b1["stream_reset"].any()
    # continuity: the reuse part of step t+1 directly follows the reuse part of step t, per direction
    row_f = np.concatenate([p.batch(t)["input_ids"][0, :R] for t in range(4)])
    row_b = np.concatenate([p.batch(t)["input_ids"][1, :R] for t in range(4)])
    np.testing.assert_array_equal(row_f, char_sentences.tokens(0, 4 * R))
    np.testing.assert_array_equal(row_b, char_sentences.tokens(0, L)[::-1][: 4 * R])


def test_xlnet_resume_and_processes(char_sentences):
    k = 11
    run = _xl(char_sentences)
    uninterrupted = [run.batch(s) for s in range(k + 6)][k:]
    fresh = _xl(char_sentences)
    resumed = [fresh.batch(s) for s in range(k, k + 6)]
    for a, b in zip(uninterrupted, resumed):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    parts = [_xl(char_sentences, process_index=i, process_count=2) for i in range(2)]
    for step in (0, k):
        full = run.batch(step)
        glued = _concat([q.batch(step) for q in parts])
        for key in full:
            np.testing.assert_array_equal(full[key], glued[key])
    other_seed = _xl(char_sentences, seed=8).batch(k)
    assert not np.array_equal(other_seed["perm_mask"], run.batch(k)["perm_mask"])


def test_xlnet_uni_mode(char_sentences):
    p = _xl(char_sentences, bi_data=False, global_batch_size=3)
    b = p.batch(2)
    assert b["is_forward"].all()
    L = p.row_len
    np.testing.assert_array_equal(b["input_ids"][2, :32], char_sentences.tokens(2 * L + 64, 32))


@pytest.mark.parametrize("unit,fraction", [("word", 1 / 6), ("piece", 1 / 7)])
def test_span_fraction_and_lengths(unit, fraction):
    rng = keyed_rng(0, 99, 1)
    is_start = np.ones(200_000, bool)
    mask, spans = xlnet.sample_mask(rng, is_start, goal=None, span_unit=unit, return_spans=True)
    assert abs(mask.mean() - fraction) < 0.005, mask.mean()
    counts = np.bincount(spans, minlength=6)[1:6] / len(spans)
    expect = (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum()
    np.testing.assert_allclose(counts, expect, atol=0.01)


def test_word_spans_cover_whole_words():
    rng = keyed_rng(0, 99, 2)
    is_start = rng.random(20_000) < 0.4
    is_start[0] = True
    mask, spans = xlnet.sample_mask(rng, is_start, goal=None, span_unit="word", return_spans=True)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    begins, ends = edges[::2], edges[1::2]
    assert is_start[begins].all()  # spans start at a word start
    assert np.concatenate([is_start, [True]])[ends].all()  # and end at the next word start
    words_per_span = [is_start[b:e].sum() for b, e in zip(begins, ends)]
    assert sum(words_per_span) == sum(spans)
    # the original (piece) mode: spans of n pieces starting at word starts
    mask_p = xlnet.sample_mask(rng, is_start, goal=None, span_unit="piece")
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask_p.astype(int), [0]])))
    assert is_start[edges[::2]].all()
    # goal: exactly the goal after fill-up, never on functional positions, reversed sampling too
    func = np.zeros(20_000, bool)
    func[::50] = True
    for rev in (False, True):
        m = xlnet.sample_mask(rng, is_start[:256], goal=43, functional=func[:256], reverse=rev)
        assert m.sum() == 43 and not (m & func[:256]).any()


def test_trim_closed_form_matches_loop():
    for la in range(0, 30):
        for lb in range(0, 30):
            for tot in range(1, 40):
                a, b = la, lb
                while a + b > tot:
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert xlnet.trim_to_length(la, lb, tot) == (a, b)


# --------------------------------------------------------------------------------------------------------- MLM
def test_mlm_masking(char_stream):
    p = mlm.MLMPipeline(char_stream, global_batch_size=64, seq_len=66, seed=2, segment_pairs=False)
    b = p.batch(3)
    lm_ = b["label_mask"].astype(bool)
    assert (lm_.sum(1) == round(0.15 * 64)).all() and not lm_[:, [0, -1]].any()
    # every row predicts the count the Funnel objectives size their prediction rows with (exactly, nothing dropped)
    cfg = dict(pipeline="mlm", seq_len=66, segment_pairs=False)
    assert dp.mlm_predictions_per_row(cfg) == round(0.15 * 64) == mlm.predictions_per_row(66, 0.15, False)
    assert dp.mlm_predictions_per_row(dict(pipeline="lm")) is None
    assert dp.mlm_predictions_per_row(dict(max_seq_length=512, doc_stride=128)) is None  # a finetuning task's data
    assert (b["labels"][:, 0] == p.cls_id).all() and (b["labels"][:, -1] == p.sep_id).all()
    np.testing.assert_array_equal(b["input_ids"][~lm_], b["labels"][~lm_])
    changed = b["input_ids"][lm_]
    frac_mask = (changed == p.mask_id).mean()
    assert 0.7 < frac_mask < 0.9
    parts = [
        mlm.MLMPipeline(
            char_stream, global_batch_size=64, seq_len=66, seed=2, process_index=i, process_count=2, segment_pairs=False
        )
        for i in range(2)
    ]
    glued = _concat([q.batch(3) for q in parts])
    for k in b:
        np.testing.assert_array_equal(b[k], glued[k])
    # one epoch visits every chunk once
    seen = [p.chunk_index(s, r) for s in range(p.num_chunks // 64) for r in range(64)]
    assert len(set(seen)) == len(seen)


def test_mlm_segment_pairs_predict_the_configured_count_in_every_row(char_sentences):
    p = mlm.MLMPipeline(char_sentences, global_batch_size=16, seq_len=66, seed=1, segment_pairs=True)
    k = dp.mlm_predictions_per_row(dict(pipeline="mlm", seq_len=66))
    assert k == round(0.15 * 63)
    for step in range(3):
        assert (p.batch(step)["label_mask"].sum(1) == k).all()


def test_perm_index_matches_original_reshape_transpose_shuffle():
    """rank(p) = p - p % ps + π(p % ps) is the original reshape([-1, ps]) -> transpose -> shuffle rows -> transpose."""
    m, ps = 24, 8
    pi = np.random.default_rng(0).permutation(ps)
    t = np.arange(m).reshape(-1, ps).T  # [ps, m/ps]
    original = t[pi].T.reshape(-1)  # rows shuffled by π
    np.testing.assert_array_equal(original, (np.arange(m) // ps) * ps + np.tile(pi, m // ps))
    # and the perm mask reads it: with every token a target, i sees j iff rank(j) < rank(i)
    all_targets = np.ones(m, bool)
    pm = xlnet.perm_mask_block(xlnet.factorization_rank(pi, m), all_targets, all_targets)
    rank = (np.arange(m) // ps) * ps + np.tile(pi, m // ps)
    np.testing.assert_array_equal(pm, rank[:, None] <= rank[None, :])


def test_row_rng_equals_fresh_keyed_generator():
    from data_pipelines.rng import row_rng

    for args in [(0, 1, 0, 0), (123, 1, 7, 31), (2**40, 3, 2**31, 5)]:
        want = keyed_rng(*args).random(7)
        row_rng(9, args[1], 9, 9).random(3)  # a previous use of the cached generator must not leak
        np.testing.assert_array_equal(row_rng(*args).random(7), want)


# ------------------------------------------------------- literal ports of the original loops (zihangdai/xlnet)
def _split_a_and_b_literal(data, sent_ids, begin_idx, tot_len, rng):
    """`_split_a_and_b(..., extend_target=True)` loop by loop; random draws in the same order as ours."""
    data_len = data.shape[0]
    end_idx = begin_idx + 1
    cut_points = []
    while end_idx < data_len:
        if sent_ids[end_idx] != sent_ids[end_idx - 1]:
            if end_idx - begin_idx >= tot_len:
                break
            cut_points.append(end_idx)
        end_idx += 1
    a_begin = begin_idx
    if len(cut_points) == 0 or rng.random() < 0.5:
        label = 0
        a_end = end_idx if len(cut_points) == 0 else cut_points[int(rng.integers(len(cut_points)))]
        b_len = max(1, tot_len - (a_end - a_begin))
        b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))
        b_end = b_begin + b_len
        while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = cut_points[int(rng.integers(len(cut_points)))]
        b_begin, b_end = a_end, end_idx
    while a_end - a_begin + b_end - b_begin > tot_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    return data[a_begin:a_end], data[b_begin:b_end], label


def test_split_a_and_b_matches_literal_loops(char_sentences):
    p = _xl(char_sentences, seq_len=128, reuse_len=64, perm_size=32)
    labels = []
    for row in range(8):
        view = p.row_view(0, row)
        data, sent = view.tokens(0, view.length), view.sent(0, view.length)
        for begin in range(64, view.length - 200, 997):
            a, b, label = xlnet.split_a_and_b(view, keyed_rng(1, 2, row, begin), begin, 125)
            ra, rb, rlabel = _split_a_and_b_literal(data, sent, begin, 125, keyed_rng(1, 2, row, begin))
            np.testing.assert_array_equal(a, ra)
            np.testing.assert_array_equal(b, rb)
            assert label == rlabel and len(a) + len(b) == 125
            labels.append(label)
    assert 0.3 < np.mean(labels) < 0.7


def _sample_mask_piece_literal(is_start, goal, rng, alpha=6, beta=1, max_gram=5):
    """The original `_sample_mask` loops (bug included: the end loop tests seg[beg]); our block-drawn n, u."""
    seg_len = len(is_start)
    mask = np.zeros(seg_len, bool)
    cdf = np.cumsum(1.0 / np.arange(1, max_gram + 1))
    cdf /= cdf[-1]
    num_predict, cur_len, draws = 0, 0, []
    while cur_len < seg_len:
        if goal is not None and num_predict >= goal:
            break
        if not draws:
            u2 = rng.random(128)
            draws = list(zip((1 + np.searchsorted(cdf, u2[:64], side="right")).tolist(), u2[64:].tolist()))[::-1]
        n, u = draws.pop()
        if goal is not None:
            n = min(n, goal - num_predict)
        ctx_size = (n * alpha) // beta
        l_ctx = int(u * ctx_size)
        r_ctx = ctx_size - l_ctx
        beg = cur_len + l_ctx
        while beg < seg_len and not is_start[beg]:
            beg += 1
        if beg >= seg_len:
            break
        end, cnt_ngram = beg + 1, 1
        while end < seg_len:
            if is_start[beg]:  # sic
                cnt_ngram += 1
                if cnt_ngram > n:
                    break
            end += 1
        if end >= seg_len:
            break
        mask[beg:end] = True
        num_predict += end - beg
        cur_len = end + r_ctx
    return mask


def test_piece_spans_match_literal_loops():
    r = np.random.default_rng(3)
    for trial in range(200):
        is_start = r.random(256) < r.uniform(0.2, 0.9)
        goal = None if trial % 2 else 43
        ours = xlnet.sample_mask(keyed_rng(4, 5, trial), is_start, goal=goal, span_unit="piece")
        ref = _sample_mask_piece_literal(is_start, goal, keyed_rng(4, 5, trial))
        if goal is None:
            np.testing.assert_array_equal(ours, ref)
        else:  # ours then fills up to exactly the goal: the spans are a subset of the result
            assert (ours >= ref).all() and ours.sum() == 43


def test_multi_shard_corpus_reads_like_one_array():
    r = np.random.default_rng(0)
    parts = [r.integers(0, 100, size=n).astype(np.uint16) for n in (50, 7, 300, 1, 64)]
    sents = [r.random(len(p)) < 0.5 for p in parts]
    flat, flat_s = np.concatenate(parts), np.concatenate(sents)
    tok = vocab.SymbolVocab("char", list(vocab.XLNET_SPECIALS))
    # parity that already flips at every shard junction: read exactly like the concatenation
    for i in range(1, len(sents)):
        if sents[i][0] == sents[i - 1][-1]:
            sents[i] = ~sents[i]
    flat, flat_s = np.concatenate(parts), np.concatenate(sents)
    multi_p = corpus_lib.TokenCorpus(parts, sents, tok, "multi")
    sents_bad = [s.copy() for s in sents]
    sents_bad[1] = ~sents_bad[1]  # shard 1 starts with the parity shard 0 ends with
    multi = corpus_lib.TokenCorpus(parts, sents_bad, tok, "multi")
    one = corpus_lib.TokenCorpus([flat], [flat_s], tok, "one")
    n = len(flat)
    for start in list(r.integers(0, 3 * n, size=200)) + [0, n - 1, n, 49, 50, 57]:
        for length in (1, 5, 64, 400):
            want = np.take(flat, np.arange(start, start + length) % n)
            np.testing.assert_array_equal(multi.tokens(int(start), length), want)
            np.testing.assert_array_equal(one.tokens(int(start), length), want)
            np.testing.assert_array_equal(
                multi_p.sentence_parity(int(start), length), np.take(flat_s, np.arange(start, start + length) % n)
            )
    # shards whose parity does not flip at the junction are flipped so every shard boundary is a sentence boundary
    junction = multi.sentence_parity(49, 2)
    assert junction[0] != junction[1]


@pytest.mark.parametrize(
    "pipeline,extra",
    [
        ("lm", dict(tgt_len=24)),
        ("xlnet", dict(seq_len=48, reuse_len=24, perm_size=8, num_predict=8)),
        ("mlm", dict(seq_len=40)),
        ("electra", dict(seq_len=40)),
    ],
)
def test_make_pipeline_resume_and_two_processes(pipeline, extra):
    cfg = dp.default_config(pipeline)
    cfg.update(dict(batch_size=8, eval_batch_size=4, **extra))
    full = dp.make_pipeline(cfg)
    # k..k+5 crosses the end of the first pass (streams) / epoch (MLM)
    k = getattr(full, "steps_per_pass", None) or full.num_chunks // 8
    k -= 2
    run = [full.batch(s) for s in range(k, k + 6)]
    fresh = dp.make_pipeline(cfg)
    halves = [dp.make_pipeline(cfg, process_index=i, process_count=2) for i in range(2)]
    assert halves[0].local_batch_size == 4 and halves[0].global_batch_size == 8
    for i, s in enumerate(range(k, k + 6)):
        again = fresh.batch(s)
        glued = _concat([h.batch(s) for h in halves])
        for key in run[i]:
            np.testing.assert_array_equal(run[i][key], again[key])
            np.testing.assert_array_equal(run[i][key], glued[key])
    if "stream_reset" in run[0]:
        assert [bool(b["stream_reset"][0]) for b in run] == [False, False, True, False, False, False]
    ev = dp.make_pipeline(cfg, split="valid")
    assert ev.num_steps and ev.batch(ev.num_steps - 1)["input_ids"].shape[0] == 4
    with pytest.raises(IndexError):
        ev.batch(ev.num_steps)


def test_original_num_predict_accounting(char_sentences):
    """exact_num_predict=False: <sep>/<cls> may take target slots and are dropped, as in the original."""
    p = _xl(char_sentences, exact_num_predict=False, seq_len=32, reuse_len=16, perm_size=8, num_predict=12)
    b = _concat([p.batch(s) for s in range(40)])
    counts = b["target_mask"].sum(1)
    assert (counts <= 12).all() and (counts < 12).any()
    np.testing.assert_array_equal(b["target_mapping"].sum((1, 2)), counts)
    assert (b["target_mask"][:, :-1] >= b["target_mask"][:, 1:]).all()  # real targets first, then padding


def test_prefetch_yields_the_same_batches(char_sentences):
    p = _xl(char_sentences)
    got = list(dp.prefetch(p, start_step=5, num_steps=4, depth=3))
    assert [s for s, _ in got] == [5, 6, 7, 8]
    for s, b in got:
        want = p.batch(s)
        for k in want:
            np.testing.assert_array_equal(b[k], want[k])
    ev = lm.LMStreamPipeline(char_sentences, global_batch_size=4, tgt_len=500, finite=True)
    assert [s for s, _ in dp.prefetch(ev, start_step=ev.num_steps - 2)] == [ev.num_steps - 2, ev.num_steps - 1]
