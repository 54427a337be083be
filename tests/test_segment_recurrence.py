"""Segment-recurrent finetuning (`--config.max_segments=N`, xlgen/models/xlnet/recurrence.py): long documents
through XLNet's memory.

* The recurrence is the memory model it claims to be: encoding N segments with memory equals one pass over the
  whole document when the memory holds it all (no dropout), and an all-padding leading slot changes nothing.
* A recurrent run sharded over 8 devices and interrupted / resumed halfway ends bit-identical.
* Memory reads what truncation drops (`synthetic.write_long_documents`): 4 classes = 2 * key + query, the key word
  among a document's first words, the query word among its last, 20-27 pieces per document and windows of L = 16.
  Today's truncation keeps a document's head (one window of 14 pieces: the key, never the query), so its Bayes
  ceiling is 1/2 (it must guess the query bit); a label in the first segment alone would be trivially visible to it.
  With `max_segments=2` the whole document fits, the head reads the last segment (the query, `<cls>`) and the key
  reaches it only through the memory of the first segment (forward content; the gradient stops at the boundary).
  Same tiny XLNet, data and 300 steps: held-out accuracy truncation 0.365 (the key learned, the query guessed),
  recurrence 1.000.
* `max_segments=0` is today's model: a config without the new keys and one with their defaults train bit-identically.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlgen import finetune as ft
from xlgen.finetune.readers import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XLNET = os.path.join(ROOT, "configs", "finetune", "tiny.py")
L = 16


def _config(overrides, workdir):
    return ft.load_finetune_config(XLNET, {k: str(v) for k, v in overrides.items()}, workdir)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("longdocs")
    synthetic.write_long_documents(str(d / "ag"), n_train=256, n_dev=96)
    synthetic.write_glue(str(d / "sst2"), "sst2", n_train=64, n_dev=16, n_test=4)
    texts = synthetic.corpus_for(str(d / "ag")) + synthetic.corpus_for(str(d / "sst2"))
    synthetic.train_sentencepiece(texts, str(d / "spiece.model"), vocab_size=80)
    return d


def _common(data, **over):
    return {
        "task": "ag",
        "data_dir": data / "ag",
        "tokenizer": data / "spiece.model",
        "data.max_seq_length": L,
        "data.batch_size": 16,
        "data.eval_batch_size": 32,
        "total_steps": 160,
        "eval_every_steps": 0,
        "optimizer.learning_rate": 3e-3,
        "optimizer.warmup_steps": 10,
        "checkpoint.every_steps": 1000,
        **over,
    }


def test_recurrence_equals_one_pass_over_the_document():
    """With mem_len >= the document and causal attention, N segments with memory = the full-length model on the concatenation (left
    padding: the all-padding leading slot is skipped), for the last segment's states."""
    from flax import nnx

    from xlgen.models.xlnet.model import XLNetConfig, XLNetModel
    from xlgen.models.xlnet.recurrence import encode_segments

    # causal attention: the one-pass model's earlier pieces do not see later ones either (the Transformer-XL identity)
    cfg = XLNetConfig(
        vocab_size=50, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0, attn_type="uni"
    )
    model = XLNetModel(cfg, rngs=nnx.Rngs(0))
    model.eval()
    rng = np.random.default_rng(0)
    n, l = 3, 8
    real = np.array([13, 20])  # row 0: two segments used (slot 0 empty), row 1: all three
    ids = rng.integers(5, 50, size=(2, n * l))
    mask = (np.arange(n * l)[None] >= n * l - real[:, None]).astype(np.int32)
    ids = np.where(mask, ids, 0)
    types = np.zeros_like(ids)
    # jitted (eager op-by-op dispatch of the layers costs several times the compile)
    h_seg, mems = nnx.jit(encode_segments, static_argnames="mem_len")(
        model,
        jnp.asarray(ids.reshape(2, n, l)),
        jnp.asarray(types.reshape(2, n, l)),
        jnp.asarray(mask.reshape(2, n, l)),
        mem_len=2 * l,
    )
    one_pass = nnx.jit(lambda model, ids, types: model(ids, types)[0])
    for row in range(2):
        k = real[row]
        full = one_pass(model, jnp.asarray(ids[row : row + 1, -k:]), jnp.asarray(types[row : row + 1, -k:]))
        np.testing.assert_allclose(np.asarray(h_seg[row]), np.asarray(full[0, -l:]), atol=2e-5)
    assert mems.shape == (2, 2, 2 * l, 16)


def test_recurrent_finetuning_shards_and_resumes_exactly(data, tmp_path):
    """max_segments=2 sharded over the 8 test devices; stopped halfway and resumed with the same call -> the same
    parameters bit for bit as the uninterrupted run."""
    full_wd, part_wd = str(tmp_path / "full"), str(tmp_path / "part")
    over = _common(data, max_segments=2, total_steps=20)
    assert jax.device_count() == 8 and int(_config(over, full_wd).mesh.data) == -1
    ft.finetune(_config(over, full_wd), full_wd)
    feats = np.load(os.path.join(full_wd, "cache", sorted(os.listdir(os.path.join(full_wd, "cache")))[0]))
    # every document spans both segments: the first holds real pieces (the key word), the last ends with <cls>
    assert feats["input_ids"].shape[1:] == (2, L) and (feats["attention_mask"][:, 0].sum(-1) > 0).all()
    ft.finetune(_config(over, part_wd), part_wd, stop_at=10)
    ft.finetune(_config(over, part_wd), part_wd)
    a, b = (_params(wd) for wd in (full_wd, part_wd))
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def _features(workdir, split):
    (name,) = [n for n in os.listdir(os.path.join(workdir, "cache")) if n.startswith(split)]
    return np.load(os.path.join(workdir, "cache", name))


def test_recurrence_beats_truncation_on_held_out_documents(data, tmp_path):
    """One device (the sharded recurrent run is tested above), 300 steps: held-out accuracy truncation 0.365,
    recurrence 1.000. The premise is checked on the features: the truncated windows never hold the query word, the
    two segments hold every document whole (key and query)."""
    import sentencepiece as spm

    trunc_wd, rec_wd = str(tmp_path / "trunc"), str(tmp_path / "rec")
    over = {"total_steps": 300, "mesh.num_devices": 1}
    truncated = ft.finetune(_config(_common(data, **over), trunc_wd), trunc_wd)
    recurrent = ft.finetune(_config(_common(data, max_segments=2, **over), rec_wd), rec_wd)
    print(f"held-out accuracy: truncation {truncated['accuracy']:.3f}  recurrence {recurrent['accuracy']:.3f}")

    sp = spm.SentencePieceProcessor(model_file=str(data / "spiece.model"))
    query = [sp.piece_to_id("\u2581" + w) for w in synthetic.LONG_QUERIES]
    assert all(sp.encode(w) == [i] for w, i in zip(synthetic.LONG_QUERIES, query))  # one piece each
    key = sorted({i for w in synthetic.LONG_KEYS for i in sp.encode(w)})
    for split in ("train", "dev"):
        window, segs = _features(trunc_wd, split), _features(rec_wd, split)
        assert not np.isin(window["input_ids"], query).any()
        assert (np.isin(segs["input_ids"], query).sum((1, 2)) == 1).all()
        # the key word only in the first segment: the last one (what the head reads) gets it from memory alone
        assert (np.isin(segs["input_ids"][:, 0], key).sum(-1) >= 1).all()
        assert not np.isin(segs["input_ids"][:, 1], key).any()
        real = segs["attention_mask"].sum((1, 2))
        assert (real > L).all() and (real < 2 * L).all()  # longer than one window, not truncated in two

    # truncation knows the key at best: <= 1/2 (+ noise on 96 documents); recurrence reads the key from memory
    assert truncated["accuracy"] <= 0.6
    assert recurrent["accuracy"] >= 0.9 and recurrent["accuracy"] >= truncated["accuracy"] + 0.3


def _params(workdir):
    from xlgen.train.workdir import Workdir

    _, program, restored = Workdir(workdir).open(sub="checkpoints")
    return {n: np.asarray(v) for n, v in program.params_of(restored.state).items()}


def test_max_segments_zero_is_the_one_window_model(data, tmp_path):
    """The new keys at their defaults (max_segments 0, no LoRA, nothing frozen) build the same program as a config
    without them: same batch layout and state tree, bit-identical parameters after 3 steps."""
    from xlgen import sharding
    from xlgen.train.program import build_program

    over = _common(data, task="glue/sst2", data_dir=data / "sst2")
    new = _config(over, str(tmp_path / "a"))
    old = _config(over, str(tmp_path / "b"))
    with old.unlocked():
        del old["max_segments"]
        del old["finetune"]
    states = []
    for cfg in (new, old):
        program = build_program(cfg, sharding.make_mesh(cfg.mesh))
        assert program.frozen is None
        spec = program.objective.batch_shapes(cfg, "train")
        assert spec["input_ids"][0] == (16, L)
        rng = np.random.default_rng(1)
        batch = {
            "input_ids": rng.integers(5, 80, size=(16, L)).astype(np.int32),
            "token_type_ids": np.zeros((16, L), np.int32),
            "attention_mask": np.ones((16, L), np.int32),
            "labels": rng.integers(0, 2, size=16).astype(np.int32),
        }
        with jax.set_mesh(program.mesh):
            state, mems = program.init_state()
            for _ in range(3):
                state, mems, _ = program.train_step(state, batch, mems)
            states.append(jax.device_get(state))
    a, b = states
    assert jax.tree.structure(a) == jax.tree.structure(b) and set(a) == {"params", "opt_state", "step", "rng"}
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_unsupported_task_or_family_is_a_clear_error(data, tmp_path):
    with pytest.raises(ValueError, match="max_segments=2.*funnel"):
        ft.load_finetune_config(
            os.path.join(ROOT, "configs", "finetune", "tiny_funnel.py"),
            {"task": "ag", "max_segments": "2"},
            str(tmp_path),
        )
    with pytest.raises(ValueError, match="max_segments=2.*token_classification"):
        _config({"task": "conll2003", "max_segments": 2}, str(tmp_path))
