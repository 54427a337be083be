"""Packed finetuning (`finetune.packing`, xlgen/finetune/packing.py): through the finetuning objective's forward,
each example's logits in a packed row equal its logits alone in a row within 1e-5 — XLNet (bi and uni attention)
and Funnel (relative_shift and factorized position terms, three blocks so examples align to the stride-4 pooling,
decoder for token classification) — for classification, regression and token classification; the packed
pipeline is a pure function of the step and covers every example once per epoch."""

import os

import numpy as np
import pytest

from xlgen import finetune as ft
from xlgen.finetune import packing
from xlgen.finetune.readers import features as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L = 32


class _Tok:
    """Word `wN` -> piece N (enough for `features.pack`)."""

    sep_id, cls_id, pad_id = 4, 3, 5

    def __init__(self, style):
        self.style = style

    def encode(self, text):
        return [int(w[1:]) for w in text.split()]


def _features(kind, style, n=14, seed=0):
    """Unpacked features of n random examples of 1..L pieces (one fills the window) in the family's layout."""
    r = np.random.default_rng(seed)
    tok = _Tok(style)
    lens = r.integers(1, 14, size=n)
    lens[3] = L  # one example as long as the window: a row of its own
    out = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask")}
    labels, label_mask = [], []
    for i, m in enumerate(lens):
        if kind == "token_classification":
            a, b = list(r.integers(10, 200, size=min(m, L - 2))), None
        else:
            na = max(1, min(m, L - 3) // 2)
            a, b = F.truncate_pair(
                list(r.integers(10, 200, size=na)), list(r.integers(10, 200, size=max(1, m - na))), L - 3
            )
        ids, seg, mask = F.pack(tok, a, b, L)
        for k, v in zip(out, (ids, seg, mask)):
            out[k].append(v)
        if kind == "token_classification":
            lab = np.where(np.asarray(mask) == 1, r.integers(0, 9, size=L), 0)
            labels.append(lab), label_mask.append(np.asarray(mask, np.float32) * (r.random(L) < 0.7))
        else:
            labels.append(r.normal() if kind == "regression" else int(r.integers(2)))
    feats = {k: np.asarray(v, np.int32) for k, v in out.items()}
    if kind == "token_classification":
        feats["labels"], feats["label_mask"] = np.asarray(labels, np.int32), np.asarray(label_mask, np.float32)
    else:
        feats["labels"] = np.asarray(labels, np.float32 if kind == "regression" else np.int32)
    return feats


TASKS = {"classification": "glue/sst2", "regression": "glue/stsb", "token_classification": "conll2003"}
MODELS = {
    "xlnet-bi": ("configs/finetune/tiny.py", {"model.attn_type": "bi"}),
    "xlnet-uni": ("configs/finetune/tiny.py", {"model.attn_type": "uni"}),
    "funnel-relative_shift": (
        "configs/finetune/tiny_funnel.py",
        {"model.block_sizes": "(1,1,1)", "model.attention_type": "relative_shift"},
    ),
    "funnel-factorized": (
        "configs/finetune/tiny_funnel.py",
        {"model.block_sizes": "(1,1,1)", "model.attention_type": "factorized"},
    ),
}
CASES = [(m, k) for m in MODELS for k in ("classification", "token_classification")] + [
    ("xlnet-bi", "regression"),
    ("funnel-relative_shift", "regression"),
]


@pytest.mark.parametrize("model_name, kind", CASES)
def test_packed_logits_equal_unpacked(model_name, kind, tmp_path):
    import jax
    from flax import nnx

    from xlgen.finetune import objective

    path, over = MODELS[model_name]
    over = {**over, "task": TASKS[kind], "data.max_seq_length": L, "finetune.packing": True, "finetune.pack_size": 6}
    config = ft.load_finetune_config(os.path.join(ROOT, path), {k: str(v) for k, v in over.items()}, str(tmp_path))
    model = objective.make_model(config, nnx.Rngs(0), train=False)
    style = "cls_last" if config.model.family == "xlnet" else "cls_first"
    feats = _features(kind, style)
    stride = packing.pack_stride(config)
    assert stride == (4 if config.model.family == "funnel" else 1)
    packer = packing.Packer(
        feats, cls_last=style == "cls_last", stride=stride, max_examples=6, pad_id=_Tok.pad_id, kind=kind
    )
    rows = packer.rows(np.arange(len(feats["labels"])))
    assert len(rows) < len(feats["labels"]) and max(map(len, rows)) >= 2  # several examples per row
    packed = packer.build(rows)
    keys = ("input_ids", "token_type_ids", "attention_mask", "labels", "label_mask")
    unpacked = {k: feats[k] for k in keys if k in feats}

    @nnx.jit
    def logits_and_losses(model, unpacked, packed):  # one compiled program per case: both layouts, both losses
        alone = objective.forward(model, unpacked, config, train=False)["logits"]
        together = objective.forward(model, packed, config, train=False)["logits"]
        loss = objective._loss(model, packed, None, None, config)[0]
        ref = objective._loss(model, unpacked, None, None, config)[0]
        return alone, together, loss, ref

    alone, together, loss, ref = jax.device_get(logits_and_losses(model, unpacked, packed))
    alone, together = np.asarray(alone), np.asarray(together)
    checked = 0
    for r, members in enumerate(rows):
        o = 0
        for k, i in enumerate(members):
            n = int(packer.lengths[i])
            if kind == "token_classification":  # every real piece of the example
                src = slice(L - n, L) if style == "cls_last" else slice(0, n)
                np.testing.assert_allclose(together[r, o : o + n], alone[i, src], atol=1e-5, rtol=0)
            else:
                np.testing.assert_allclose(together[r, k], alone[i], atol=1e-5, rtol=0)
            checked += 1
            o += int(packer.slots[i])
    assert checked == len(feats["labels"])
    # the training loss over packed rows is the mean over the real examples
    if kind != "token_classification":
        np.testing.assert_allclose(float(loss), float(ref), rtol=1e-5)


def test_packed_pipeline_is_pure_and_covers_each_epoch():
    feats = _features("classification", "cls_first", n=60, seed=1)
    packer = packing.Packer(feats, cls_last=False, stride=4, max_examples=5, pad_id=5, kind="classification")
    pipe = packing.PackedFeaturePipeline(packer, global_batch_size=4, seed=3)
    again = packing.PackedFeaturePipeline(packer, global_batch_size=4, seed=3)
    for step in (7, 0, 3):
        a, b = pipe.batch(step), again.batch(step)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    rows = pipe.epoch_rows(0)
    assert sorted(i for row in rows for i in row) == list(range(60))
    for row in rows:  # slots fit the window, start at multiples of the stride, at most pack_size examples
        assert sum(packer.slots[i] for i in row) <= L and len(row) <= 5
        assert all(s % 4 == 0 or s == L for s in packer.slots[row])
    two = [
        packing.PackedFeaturePipeline(packer, global_batch_size=4, seed=3, process_index=p, process_count=2)
        for p in (0, 1)
    ]
    for k, v in pipe.batch(5).items():
        np.testing.assert_array_equal(v, np.concatenate([t.batch(5)[k] for t in two]))
