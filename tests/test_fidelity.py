"""Fidelity to the original recipes (zihangdai/xlnet, laiguokun/Funnel-Transformer, kimiyoung/transformer-xl):
the training paths that forward-pass parity with Hugging Face cannot see. `docs/fidelity.md` lists what each test
pins."""

import random

import pytest

# ----------------------------------------------------------------------------------------------------------------
# XLNet finetuning tokenises as pretraining (prepro_utils.encode_ids), with exact character offsets
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def number_spm(tmp_path_factory):
    """A tiny XLNet-recipe SentencePiece model whose vocabulary has "<digits>," pieces (as the released one)."""
    from data_pipelines import vocab

    d = tmp_path_factory.mktemp("spm_numbers")
    r = random.Random(0)
    words = "the cat sat on a mat in year and people were born there".split()
    lines = [
        " ".join(r.choice(words) for _ in range(5))
        + f" in {r.randint(0, 3000)}, and {r.randint(1, 99)},{r.randint(100, 999)} people, {r.choice(words)}."
        for _ in range(2000)
    ]
    (d / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    return vocab.train_sentencepiece([str(d / "corpus.txt")], str(d / "spm"), vocab_size=300)


NUMBER_TEXTS = [
    "I was born in 2000, and 1,234 cats sat on 12, mats.",
    "  The  year 1999,\\tthe  people 45,000, ``there'' in 7,  café  ",
    "9, 10,11 and 2001,",
]


def test_finetune_tokenizer_matches_pretraining_on_numbers(number_spm):
    from data_pipelines import vocab
    from data_pipelines.tasks.tokenization import SentencePieceTaskTokenizer, cover_span, preprocess_with_map

    pre_tok = vocab.SentencePieceTokenizer(number_spm)
    task_tok = SentencePieceTaskTokenizer(number_spm)
    n_split = 0
    for text in NUMBER_TEXTS:
        pieces = pre_tok.sp.EncodeAsPieces(vocab.preprocess_text(text))
        n_split += sum(len(p) > 1 and p[-1] == "," and p[-2].isdigit() for p in pieces)
        want = pre_tok.encode(text)
        assert task_tok.encode(text) == want, text
        ids, starts, ends = task_tok.encode_with_offsets(text)
        assert ids == want, text
        # every non-space original character covered exactly once, in order; each piece's span is its surface
        covered = [text[s:e] for s, e in zip(starts, ends) if e > s]
        assert "".join(covered) == "".join(text.split())
        assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))
        for i, s, e in zip(ids, starts, ends):  # each piece spans exactly the original characters it encodes
            if i != pre_tok.sp.unk_id():
                surface = pre_tok.id_to_piece(i).replace(vocab.SPIECE_UNDERLINE, "")
                assert vocab.preprocess_text(text[s:e]) == surface, (text, pre_tok.id_to_piece(i), text[s:e])
        assert preprocess_with_map(text)[0] == vocab.preprocess_text(text)
    assert n_split >= 4  # the texts really exercise the "<digits>," split
    # a SQuAD answer inside a re-split piece maps to its exact characters
    text = NUMBER_TEXTS[0]
    _, starts, ends = task_tok.encode_with_offsets(text)
    for answer in ("1,234", "2000", "12"):
        c = text.index(answer)
        i, j = cover_span(starts, ends, c, c + len(answer))
        assert text[starts[i] : ends[j]] == answer
