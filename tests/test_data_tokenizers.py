"""Tokenizers: XLNet SentencePiece recipe and normalisation, WordPiece, char/byte/word vocabularies (round trips)."""

import numpy as np
import pytest

from data_pipelines import vocab


def _generated_text(n_lines=400, seed=0):
    r = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "ve", "so", "pi", "da"]
    words = ["".join(r.choice(syll, size=r.integers(1, 4))) for _ in range(120)]
    lines = []
    for i in range(n_lines):
        ws = list(r.choice(words, size=r.integers(3, 12)))
        if i % 5 == 0:
            ws.insert(1, f"{r.integers(1, 99)},{r.integers(100, 999)},")
        lines.append(" ".join(ws).capitalize() + (". (" + ws[0] + ")" if i % 7 == 0 else "."))
    return lines


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    src = d / "corpus.txt"
    src.write_text("\n".join(_generated_text()) + "\n", encoding="utf-8")
    return vocab.train_sentencepiece(
        [str(src)], str(d / "spiece"), vocab_size=120, extra_args={"hard_vocab_limit": False}
    )


def test_preprocess_text_matches_xlnet():
    assert vocab.preprocess_text("  a \t b\n c  ") == "a b c"
    assert vocab.preprocess_text("``quoted''") == '"quoted"'
    assert vocab.preprocess_text("Café naïve") == "Cafe naive"
    assert vocab.preprocess_text("Café", keep_accents=True) == "Café"
    assert vocab.preprocess_text("ABC Déf", lower=True) == "abc def"


def test_sentencepiece_recipe_and_round_trip(spm_model):
    tok = vocab.SentencePieceTokenizer(spm_model)
    assert [tok.id_to_piece(i) for i in range(10)] == list(vocab.XLNET_SPECIALS) + ["."]
    assert tok.special_ids == {"unk": 0, "cls": 3, "sep": 4, "pad": 5, "mask": 6, "eod": 7, "eop": 8, "eos": None}
    for line in _generated_text(50, seed=1):
        text = line + "  ka   lo\t"
        pieces = tok.encode_as_pieces(text)
        ids = [tok.sp.PieceToId(p) for p in pieces]
        assert ids == tok.encode(text)
        assert tok.decode(ids) == vocab.preprocess_text(text)
    # XLNet's encode_pieces: a number followed by a comma is re-split so the comma is its own piece
    pieces = tok.encode_as_pieces("Ka 12,345, lo")
    assert "," in pieces and not any(p.endswith(",") and len(p) > 1 and p[-2].isdigit() for p in pieces)
    start = tok.is_start_table()
    assert start[:9].all() and start[tok.sp.PieceToId(".")]
    assert all(
        start[i] == tok.id_to_piece(i).startswith("\u2581")
        for i in range(9, tok.vocab_size)
        if tok.id_to_piece(i) not in '!"#$%&()*+,-./:;?@[\\]^_`{|}~'
    )


def test_sentencepiece_bad_model(tmp_path):
    bad = tmp_path / "spiece.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="spiece.model: not a SentencePiece model"):
        vocab.SentencePieceTokenizer(str(bad))


def test_wordpiece_round_trip(tmp_path):
    src = tmp_path / "c.txt"
    lines = [
        l.lower().replace(".", "").replace("(", "").replace(")", "").replace(",", " ") for l in _generated_text(300)
    ]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = vocab.train_wordpiece([str(src)], str(tmp_path / "wp"), vocab_size=150, min_frequency=1)
    tok = vocab.WordPieceTokenizer(path)
    assert tok.special_ids["cls"] is not None and tok.special_ids["mask"] is not None
    assert any(tok.id_to_piece(i).startswith("##") for i in range(tok.vocab_size))
    for text in lines[:50]:
        text = " ".join(text.split())
        pieces = tok.encode_as_pieces(text)
        ids = [tok.tok.token_to_id(p) for p in pieces]
        assert ids == tok.encode(text)
        assert tok.decode(ids) == text
    start = tok.is_start_table()
    assert not start[tok.tok.token_to_id(next(p for p in tok.tok.get_vocab() if p.startswith("##")))]


@pytest.mark.parametrize("level", ["char", "byte"])
def test_char_byte_round_trip(level):
    text = "Hello, wörld!\nSecond line — ünïcode.\n"
    v = vocab.SymbolVocab.build(level, [text])
    assert v.decode(v.encode(text)) == text
    assert v.special_ids["cls"] == 3 and v.special_ids["eod"] == 7
    v2 = vocab.SymbolVocab(level, v.symbols)
    assert v2.fingerprint() == v.fingerprint()
    assert v.encode("Z")[0] == v.special_ids["unk"]


def test_word_vocab_cutoff_and_eos(tmp_path):
    text = "the cat sat\nthe dog sat\nthe end\n"
    v = vocab.SymbolVocab.build("word", [text], min_freq=2)
    assert v.symbols == ["<unk>", "<eos>", "the", "sat"]  # frequency order, cut-off
    ids = v.encode("the cat sat\n")
    assert ids == [2, 0, 3, 1]
    assert v.decode(ids) == "the <unk> sat\n"
    v.save(str(tmp_path))
    assert vocab.load_tokenizer("word", str(tmp_path / "vocab.json")).symbols == v.symbols


def test_read_text_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff here\n")
    with pytest.raises(ValueError, match="empty.txt: file is empty"):
        vocab.read_text(str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match=r"bad.txt: not valid UTF-8 \(line 2"):
        vocab.read_text(str(tmp_path / "bad.txt"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        vocab.read_text(str(tmp_path / "missing.txt"))


def test_sentencepiece_matches_hf_xlnet_tokenizer(spm_model):
    """Our preprocess_text + encode_pieces equal transformers' XLNetTokenizer (the parity reference)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.XLNetTokenizer(vocab_file=spm_model, do_lower_case=False, keep_accents=False)
    tok = vocab.SentencePieceTokenizer(spm_model)
    for text in _generated_text(60, seed=4) + ["Ka  ``lo'' 12,345, mi", "Kalo 7, ne 1,2,3, (ru)."]:
        assert tok.encode_as_pieces(text) == hf.tokenize(text)
        assert tok.encode(text) == hf.convert_tokens_to_ids(hf.tokenize(text))


def test_plain_word_vocab_file(tmp_path):
    f = tmp_path / "1b_word_vocab.txt"
    f.write_text("<S> 0\n</S> 30301028\n<UNK> 8\nthe 41\ncat 3\n", encoding="utf-8")
    v = vocab.load_tokenizer("word", str(f))
    assert v.special_ids["unk"] == 2 and v.special_ids["eos"] == 1
    assert v.encode("the dog cat\n") == [3, 2, 4, 1]
    f2 = tmp_path / "nounk.txt"
    f2.write_text("a\nb\n")
    with pytest.raises(ValueError, match="nounk.txt: word vocabulary has no <unk>"):
        vocab.load_tokenizer("word", str(f2))
