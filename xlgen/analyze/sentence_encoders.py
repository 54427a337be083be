"""Sentence encoders for FED and LCR (`xlgen analyze textgen --encoder=NAME`).

The paper encodes sentences with the Universal Sentence Encoder v4 (a TF-Hub model, seed 004 §IV-A), which cannot
be loaded here. Every result names the encoder used here instead, as a documented deviation (`DEVIATION`).

    lsa[:DIM]   latent semantic analysis: TF-IDF of word unigrams and bigrams (sublinear tf, tokens split on
                whitespace, case kept) projected to DIM (default 256) dimensions by a truncated SVD, both fitted
                on the fit text (`--encoder_fit=FILE`, default: the reference sentences); deterministic. Cosine
                similarity of LSA vectors is the classic sentence-similarity measure of that representation.

An encoder is an object with `name` (a string saying what it is and what it was fitted on) and
`encode(sentences) -> float32 [n, d]`; `make_encoder(spec, fit_sentences)` builds one from its command-line name.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

DEVIATION = (
    "seed 004 uses the Universal Sentence Encoder v4 (TF-Hub), which cannot be loaded here; FED and LCR are "
    "computed with the encoder named in `encoder`, so their values are not comparable to the paper's"
)


class LSAEncoder:
    """TF-IDF (word 1-2 grams) -> truncated SVD, fitted on `fit_sentences` (see the module doc)."""

    def __init__(self, fit_sentences: Sequence[str], dim: int = 256, seed: int = 0, fit_name: str = "reference"):
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.tfidf = TfidfVectorizer(
            analyzer="word", token_pattern=r"\S+", lowercase=False, ngram_range=(1, 2), sublinear_tf=True
        )
        x = self.tfidf.fit_transform(list(fit_sentences))
        self.dim = int(max(1, min(dim, x.shape[1] - 1, x.shape[0] - 1)))
        self.svd = TruncatedSVD(n_components=self.dim, random_state=seed, algorithm="randomized", n_iter=7)
        self.svd.fit(x)
        self.name = f"lsa(tfidf word 1-2grams, svd {self.dim}, fitted on {fit_name}: {len(fit_sentences)} sentences)"

    def encode(self, sentences: Sequence[str]) -> np.ndarray:
        return np.asarray(self.svd.transform(self.tfidf.transform(list(sentences))), np.float32)


ENCODERS = {"lsa": LSAEncoder}


def make_encoder(spec: str, fit_sentences: List[str], fit_name: str = "reference"):
    """`spec` is NAME or NAME:DIM (e.g. `lsa`, `lsa:128`)."""
    name, _, arg = spec.partition(":")
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {spec!r}; expected one of {sorted(ENCODERS)} (optionally NAME:DIM)")
    kwargs = {"dim": int(arg)} if arg else {}
    return ENCODERS[name](fit_sentences, fit_name=fit_name, **kwargs)
