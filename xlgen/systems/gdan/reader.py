"""GDAN's discriminative model D: xlgen's own SQuAD model (the `squad` head of `config.model.reader_family`,
XLNet's beam head or Funnel's start/end head, through the registry) with the domain tags as input tokens
(thesis §3.2.4, "Domain Adaptation with Tags": the tag is appended to the end of both the question and the
paragraph; at test time the tag is d_true).

Input layout, assembled in the jitted step from word ids (the generator's questions are sampled there), the
finetuning layout of xlgen/finetune/readers/squad.py plus one tag token after each segment:

    cls_last  (XLNet):  [<pad> ...] p_1 .. p_n <tag> <sep> q_1 .. q_m <tag> <sep> <cls>     left padding
    cls_first (Funnel): <cls> q_1 .. q_m <tag> <sep> p_1 .. p_n <tag> <sep> [<pad> ...]      right padding

with L = Tp + Tq + 5 positions, segment ids and p_mask as the finetuning features (p_mask = 0 on paragraph words
and <cls>), and `p_off` the position of p_1. log P_D,tag(a | p, q) = log P(start) + log P(end | start)
(`xlgen.finetune.objective.answer_log_prob`); J(L, tag, D) is its mean over a batch (§3.2.4).
"""

from __future__ import annotations

from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

from xlgen import registry
from xlgen.finetune.objective import answer_log_prob
from xlgen.finetune.readers.squad import SEG_CLS, SEG_P, SEG_PAD, SEG_Q
from xlgen.finetune.record import Finetuning, head
from xlgen.finetune.squad_decode import logits_to_beam
from xlgen.systems.gdan import text as T


def family(model_config):
    return registry.get(model_config.reader_family)


def finetuning(model_config) -> Finetuning:
    """The reader family's `Finetuning` record; ValueError when it has no SQuAD head."""
    fam = family(model_config)
    record = fam.record(Finetuning)
    if record is None or record.squad_outputs is None:
        raise ValueError(f"config.model.reader_family={fam.name!r}: no SQuAD head (expected xlnet or funnel)")
    return record


def config(model_config, vocab_size: int):
    """The reader family's config dataclass: `config.model.reader` + the data's vocabulary + finetuning overrides."""
    fam = family(model_config)
    section = model_config.reader or {}
    section = dict(section.to_dict() if hasattr(section, "to_dict") else section)
    record = fam.record(Finetuning)
    return fam.model_config(section, vocab_size=vocab_size, **(record.overrides(1) if record is not None else {}))


def make(model_config, vocab_size: int, rngs):
    finetuning(model_config)
    cfg = config(model_config, vocab_size)
    return head(family(model_config), "squad", cfg, num_labels=1, answerability=False, rngs=rngs)


def assemble(style: str, p, plen, q, qlen, tag) -> Dict[str, jax.Array]:
    """Reader inputs (module docstring) from p [B, Tp], plen [B], q [B, Tq], qlen [B], tag [B] (a tag id):
    input_ids, token_type_ids, attention_mask, p_mask [B, L], cls_index, p_off [B]."""
    b, tp = p.shape
    tq = q.shape[1]
    L = tp + tq + 5
    rows = jnp.arange(b)[:, None]
    ip, iq = jnp.arange(tp)[None], jnp.arange(tq)[None]
    plen, qlen = plen[:, None], qlen[:, None]
    tag = jnp.broadcast_to(jnp.asarray(tag, jnp.int32).reshape(-1, 1), (b, 1))
    one = jnp.ones((b, 1), bool)
    if style == "cls_last":
        off = L - (plen + qlen + 5)
        p_pos, q_pos = off + ip, off + plen + 2 + iq
        marks = [(off + plen, tag, SEG_P), (off + plen + 1, T.SEP, SEG_P), (L - 3, tag, SEG_Q), (L - 2, T.SEP, SEG_Q)]
        cls_pos, pad_seg, p_seg, q_seg = L - 1, SEG_PAD, SEG_P, SEG_Q
        real = jnp.arange(L)[None] >= off
    elif style == "cls_first":
        off = qlen + 3
        p_pos, q_pos = off + ip, 1 + iq
        marks = [(1 + qlen, tag, 0), (2 + qlen, T.SEP, 0), (off + plen, tag, 1), (off + plen + 1, T.SEP, 1)]
        cls_pos, pad_seg, p_seg, q_seg = 0, 0, 1, 0
        real = jnp.arange(L)[None] < plen + qlen + 5
    else:
        raise ValueError(f"reader input_style={style!r}: expected cls_last or cls_first")
    ids = jnp.full((b, L), T.PAD, jnp.int32)
    seg = jnp.full((b, L), pad_seg, jnp.int32)
    p_mask = jnp.ones((b, L), jnp.float32)

    def put(arr, pos, val, valid):
        pos = jnp.where(valid, jnp.broadcast_to(pos, valid.shape), L)  # out of range: dropped
        return arr.at[rows, pos].set(jnp.broadcast_to(val, valid.shape).astype(arr.dtype), mode="drop")

    pv, qv = ip < plen, iq < qlen
    ids, seg = put(ids, p_pos, p, pv), put(seg, p_pos, p_seg, pv)
    ids, seg = put(ids, q_pos, q, qv), put(seg, q_pos, q_seg, qv)
    for pos, val, s in marks:
        ids, seg = put(ids, pos, val, one), put(seg, pos, s, one)
    cls = jnp.full((b, 1), cls_pos)
    ids, seg = put(ids, cls, T.CLS, one), put(seg, cls, SEG_CLS, one)
    p_mask = put(p_mask, p_pos, 0.0, pv)
    p_mask = put(p_mask, cls, 0.0, one)
    return {
        "input_ids": ids,
        "token_type_ids": seg,
        "attention_mask": real.astype(jnp.int32),
        "p_mask": p_mask,
        "cls_index": jnp.full((b,), cls_pos, jnp.int32),
        "p_off": off[:, 0].astype(jnp.int32),
    }


def log_prob(model, model_config, p, plen, q, qlen, tag, start, end) -> jax.Array:
    """log P_D,tag(a | p, q) [B] for answer word spans [start, end] of the windows p."""
    record = finetuning(model_config)
    batch = assemble(record.input_style, p, plen, q, qlen, tag)
    batch["start_positions"] = batch["p_off"] + start
    batch["end_positions"] = batch["p_off"] + end
    return answer_log_prob(record.squad_outputs(model, batch, train=True), batch)


def predict_fn(model_config):
    """(model, p, plen, q, qlen) -> (beam arrays, p_off) with the d_true tag: XLNet's beam, or Funnel's logits."""
    record = finetuning(model_config)

    def f(model, p, plen, q, qlen):
        batch = assemble(record.input_style, p, plen, q, qlen, jnp.full((p.shape[0],), T.D_TRUE))
        out = record.squad_outputs(model, batch, train=False)
        out["p_mask"] = batch["p_mask"]
        return out, batch["p_off"]

    return f


def to_beam(out: Dict[str, np.ndarray], start_n_top: int = 5, end_n_top: int = 5) -> Dict[str, np.ndarray]:
    """The decode format (`xlgen.finetune.squad_decode`): XLNet's beam arrays as they are, start/end logits
    through `logits_to_beam`."""
    if "start_top_index" in out:
        return {k: np.asarray(v) for k, v in out.items()}
    return logits_to_beam(
        np.asarray(out["start_logits"]),
        np.asarray(out["end_logits"]),
        np.asarray(out["p_mask"]),
        start_n_top=start_n_top,
        end_n_top=end_n_top,
    )
