"""SQuAD features: every answer span maps back to the exact original characters through the piece alignment,
across doc-stride windows; layout, p_mask and max-context invariants; beam decoding + evaluation round trip."""

import numpy as np
import pytest

from data_pipelines.vocab import SentencePieceTokenizer, preprocess_with_map
from xlgen.finetune import squad_decode, squad_eval
from xlgen.finetune.readers import synthetic
from xlgen.finetune.readers.squad import cover_span, read_squad, squad_features


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    synthetic.write_squad(str(d), "v2.0", n_paragraphs=6, context_words=70)
    ex = read_squad(str(d / "train-v2.0.json"), version="v2.0", require_answers=True)
    texts = [e.context for e in ex] + [e.question for e in ex]
    tok = SentencePieceTokenizer(model_proto=synthetic.train_sentencepiece(texts, vocab_size=120))
    tok.style = "cls_last"  # XLNet's layout (`Finetuning.input_style`)
    return ex, tok


def test_offsets_point_at_original_characters(data):
    _, tok = data
    text = "A ``naïve'' café, in Zürich (x-ray) costs £3."
    ids, starts, ends = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)
    covered = [text[s:e] for s, e in zip(starts, ends) if e > s]
    assert "".join(covered) == "".join(text.split())  # every non-space character exactly once, in order
    pre, src, src_end = preprocess_with_map("``naïve''", keep_accents=False)
    assert pre == '"naive"' and [("``naïve''")[i:j] for i, j in zip(src, src_end)] == [
        "``",
        "n",
        "a",
        "ï",
        "v",
        "e",
        "''",
    ]


def test_every_answer_maps_back_exactly_across_windows(data):
    examples, tok = data
    f = squad_features(examples, tok, max_seq_length=48, doc_stride=12, max_query_length=10, is_training=True)
    n_feat = len(f["input_ids"])
    per_example = np.bincount(f["example_index"], minlength=len(examples))
    assert per_example.min() >= 3  # long contexts really are split into several windows
    L = 48
    assert np.all(f["input_ids"][:, -1] == tok.cls_id) and np.all(f["token_type_ids"][:, -1] == 2)
    assert np.all(f["cls_index"] == L - 1)
    found = np.zeros(len(examples), bool)
    for i in range(n_feat):
        ex = examples[f["example_index"][i]]
        real = f["attention_mask"][i].astype(bool)
        assert not real[: np.argmax(real)].any() and real[np.argmax(real) :].all()  # left padding
        para = f["tok_start_char"][i] >= 0
        assert np.array_equal(f["p_mask"][i] == 0, para | (np.arange(L) == L - 1))
        assert np.all(f["token_type_ids"][i][~real] == 4) and np.all(f["token_type_ids"][i][para] == 0)
        s, e = f["start_positions"][i], f["end_positions"][i]
        if f["is_impossible"][i]:
            assert s == e == L - 1
            continue
        found[f["example_index"][i]] = True
        text, _ = ex.answers[0]
        assert ex.context[f["tok_start_char"][i, s] : f["tok_end_char"][i, e]] == text
    answerable = np.array([not e.is_impossible for e in examples])
    assert np.array_equal(found, answerable)  # every answer sits whole in at least one window
    # each paragraph piece has exactly one max-context window
    for k in range(len(examples)):
        rows = np.where(f["example_index"] == k)[0]
        doc = f["tok_doc_index"][rows]
        best = doc[f["max_context"][rows]]
        assert sorted(best.tolist()) == list(range(doc.max() + 1))


def test_cover_span_is_minimal():
    starts, ends = [0, 0, 3, 6, 7], [0, 2, 6, 7, 9]  # zero-width piece first
    assert cover_span(starts, ends, 0, 2) == (1, 1)
    assert cover_span(starts, ends, 4, 7) == (2, 3)
    with pytest.raises(ValueError):
        cover_span(starts, ends, 9, 10)


def test_decoding_gold_beams_gives_gold_answers_and_null_threshold(data):
    examples, tok = data
    f = squad_features(examples, tok, max_seq_length=48, doc_stride=12, max_query_length=10, is_training=True)
    n, k = len(f["input_ids"]), 5
    # A perfect model: top start = gold start (log-prob 0), its top end = gold end; others far worse.
    # Answerable windows whose gold start is not the max-context window of that piece still point at it.
    st = np.tile(np.arange(k), (n, 1))
    slp = np.full((n, k), -20.0)
    et = np.tile(np.arange(k), (n, k))
    elp = np.full((n, k * k), -20.0)
    cls = np.full(n, 5.0)
    for i in range(n):
        if not f["is_impossible"][i]:
            st[i, 0], slp[i, 0] = f["start_positions"][i], 0.0
            et[i, 0], elp[i, 0] = f["end_positions"][i], 0.0
            cls[i] = -5.0
    f["max_context"][:] = True  # gold spans may start in a non-max-context window of this synthetic model
    out = {
        "start_top_log_probs": slp,
        "start_top_index": st,
        "end_top_log_probs": elp,
        "end_top_index": et,
        "cls_logits": cls,
    }
    preds, null_odds, nbest = squad_decode.decode(examples, f, out, max_answer_length=64)
    for ex in examples:
        if not ex.is_impossible:
            assert preds[ex.qas_id] == ex.answers[0][0]
            assert null_odds[ex.qas_id] == -5.0
        else:
            assert null_odds[ex.qas_id] == 5.0
    gold = {ex.qas_id: [a for a, _ in ex.answers] for ex in examples}
    res = squad_eval.evaluate_v2(gold, preds, null_odds)
    assert res["best_f1"] == pytest.approx(100.0) and res["best_exact"] == pytest.approx(100.0)
    thresh = squad_eval.best_f1_null_threshold(gold, preds, null_odds)
    final = squad_decode.apply_null_threshold(preds, null_odds, thresh)
    assert squad_eval.evaluate_v2(gold, final)["exact"] == pytest.approx(100.0)
    # applying the threshold reproduces best_f1 when no-answer scores are distinct, including "abstain everywhere"
    null_odds = {q: v + 1e-3 * k for k, (q, v) in enumerate(sorted(null_odds.items()))}
    bad = {q: "wrong words" for q in preds}
    res = squad_eval.evaluate_v2(gold, bad, null_odds)
    final = squad_decode.apply_null_threshold(bad, null_odds, squad_eval.best_f1_null_threshold(gold, bad, null_odds))
    assert squad_eval.evaluate_v2(gold, final)["f1"] == pytest.approx(res["best_f1"])


def test_logits_to_beam_respects_p_mask():
    logits = np.array([[5.0, 1.0, 4.0, 0.0]])
    p_mask = np.array([[1.0, 0.0, 0.0, 0.0]])
    b = squad_decode.logits_to_beam(logits, logits, p_mask, start_n_top=2, end_n_top=2)
    assert b["start_top_index"].tolist() == [[2, 1]] and b["end_top_index"].tolist() == [[2, 1, 2, 1]]
    assert np.exp(b["start_top_log_probs"]).sum() < 1.0


def test_null_threshold_with_tied_scores_is_achievable():
    gold = {"a": ["x"], "b": [], "c": ["z"]}
    preds = {"a": "x", "b": "y", "c": "w"}
    na = {"a": 1.0, "b": 1.0, "c": 2.0}
    # official sweep: start 1 (abstain all); a +1 -> 2 at thresh 1.0 (best); b -1 -> 1; c +0 -> 1. best_f1 = 2/3
    assert squad_eval.evaluate_v2(gold, preds, na)["best_f1"] == pytest.approx(200 / 3)
    # no threshold realises it: 1.0 answers both tied a and b (score 1 + 0 + 0), no better than abstaining (0+1+0)
    t = squad_eval.best_f1_null_threshold(gold, preds, na)
    final = squad_decode.apply_null_threshold(preds, na, t)
    assert squad_eval.evaluate_v2(gold, final)["f1"] == pytest.approx(100 / 3) and t == float("-inf")


def test_character_and_byte_vocabularies_are_task_tokenizers(tmp_path):
    """Issue 31: a workdir pretrained on a character (or byte) vocab.json finetunes with it: pretraining's ids,
    each piece covering its own character (a multi-byte character: all its bytes), the XLNet specials framing the
    input; a word vocabulary (no <cls>/<sep>/<pad>) is a one-line error that says what to use."""
    from data_pipelines.vocab import SymbolVocab, load_tokenizer_file

    text = "Où est-il? ROMEO: là"
    for level in ("char", "byte"):
        v = SymbolVocab.build(level, [text])
        v.save(str(tmp_path))
        tok = load_tokenizer_file(str(tmp_path / "vocab.json"))
        tok.check_task_input("vocab.json")
        assert tok.encode(text) == v.encode(text, add_eos=False)
        ids, starts, ends = tok.encode_with_offsets(text)
        assert ids == tok.encode(text) and len(ids) == len(text if level == "char" else text.encode())
        assert [text[s:e] for s, e in zip(starts, ends)][:3] == (
            ["O", "ù", " "] if level == "char" else ["O", "ù", "ù"]
        )
        assert (tok.cls_id, tok.sep_id, tok.pad_id) == (3, 4, 5) and tok.vocab_size == v.vocab_size
        assert cover_span(starts, ends, 11, 16) == ((11, 15) if level == "char" else (12, 16))  # "ROMEO"
    SymbolVocab.build("word", [text]).save(str(tmp_path / "w"))
    with pytest.raises(ValueError, match="word-level vocabulary without <cls>/<sep>/<pad>"):
        load_tokenizer_file(str(tmp_path / "w" / "vocab.json")).check_task_input("w/vocab.json")
