"""Parameter-efficient finetuning: `--config.finetune.freeze=REGEX` and LoRA (`--config.finetune.lora.rank=R`).

* LoRA: only the adapters train (every other parameter bit-identical to its initial value after training); the
  optimizer state covers only what trains and the checkpoint holds the adapters (`params`) apart from the frozen
  base (`frozen`); resume is exact; `xlgen export --to-hf` folds the adapters into the weights and transformers'
  XLNetForSequenceClassification reproduces the unmerged model's logits to 1e-5; summary.json counts trainable
  vs total parameters.
* Freezing embeddings + the first layer leaves them bit-identical while the rest trains.
"""

import json
import math
import os

import jax
import numpy as np
import pytest
from flax import nnx

from xlgen import finetune as ft
from xlgen.finetune.readers import synthetic
from xlgen.models import lora

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XLNET = os.path.join(ROOT, "configs", "finetune", "tiny.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("peft")
    synthetic.write_glue(str(d / "sst2"), "sst2", n_train=128, n_dev=32, n_test=4)
    synthetic.train_sentencepiece(synthetic.corpus_for(str(d / "sst2")), str(d / "spiece.model"), vocab_size=80)
    return d


def _config(data, workdir, **over):
    over = {
        "task": "glue/sst2",
        "data_dir": data / "sst2",
        "tokenizer": data / "spiece.model",
        "total_steps": 20,
        "eval_every_steps": 0,
        "optimizer.learning_rate": 3e-3,
        "checkpoint.every_steps": 1000,
        "mesh.num_devices": 1,
        **over,
    }
    return ft.load_finetune_config(XLNET, {k: str(v) for k, v in over.items()}, workdir)


def _initial_and_final(cfg, wd):
    """(initial params, final state, program) of a finetune run from random init (init_state is deterministic)."""
    from xlgen.train.workdir import Workdir

    ft.finetune(cfg, wd)
    _, program, restored = Workdir(wd).open(sub="checkpoints")
    with jax.set_mesh(program.mesh):
        init, _ = program.init_state()
    return jax.device_get(program.params_of(init)), jax.device_get(restored.state), program


def test_lora_trains_only_adapters_resumes_and_exports_merged(data, tmp_path):
    wd = str(tmp_path / "lora")
    # adapters only (lora.trainable empty: the random head stays as initialised, too)
    cfg = _config(data, wd, **{"finetune.lora.rank": 4, "finetune.lora.alpha": 8, "finetune.lora.trainable": ""})
    init, state, program = _initial_and_final(cfg, wd)
    final = program.params_of(state)
    adapters = sorted(n for n in final if lora.is_adapter(n))
    # q, k, v, o of both layers, A and B each
    assert len(adapters) == 2 * 4 * 2 and set(state["params"]) == set(adapters)
    assert set(state["frozen"]) == set(final) - set(adapters)
    for n in state["frozen"]:
        assert np.array_equal(final[n], init[n]), n  # the base is bit-identical after training
    assert any(not np.array_equal(final[n], init[n]) for n in adapters if n.endswith("lora_b"))
    # optimizer state only for the adapters: Adam's two moments per adapter
    moments = [x for x in jax.tree.leaves(state["opt_state"]) if getattr(x, "ndim", 0) > 0]
    assert sum(x.size for x in moments) == 2 * sum(final[n].size for n in adapters)
    summary = json.load(open(os.path.join(wd, "summary.json")))
    assert summary["trainable_parameters"] == sum(final[n].size for n in adapters)
    assert summary["parameters"] == sum(math.prod(v.shape) for v in final.values())
    print(f"LoRA r=4: {summary['trainable_parameters']} of {summary['parameters']} parameters train")

    # exact resume: stop at 10, resume to 20 -> the same adapters bit for bit
    part = str(tmp_path / "part")
    ft.finetune(
        _config(data, part, **{"finetune.lora.rank": 4, "finetune.lora.alpha": 8, "finetune.lora.trainable": ""}),
        part,
        stop_at=10,
    )
    _, again, _ = _initial_and_final(
        _config(data, part, **{"finetune.lora.rank": 4, "finetune.lora.alpha": 8, "finetune.lora.trainable": ""}), part
    )
    assert all(np.array_equal(again["params"][n], state["params"][n]) for n in adapters)

    # merged export: transformers loads a plain XLNetForSequenceClassification equal to the unmerged forward
    import torch
    import transformers

    from xlgen.interop import export

    out = export.export_workdir(wd, str(tmp_path / "hf"), with_tokenizer=False)
    hf = transformers.XLNetForSequenceClassification.from_pretrained(out).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 80, size=(3, 12))
    mask = np.ones_like(ids)
    unmerged = program.make_model(final, train=False)
    ours, _ = unmerged(ids, np.zeros_like(ids), attention_mask=mask)
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.zeros(3, 12, dtype=torch.long),
            attention_mask=torch.tensor(mask),
        ).logits.numpy()
    diff = float(np.abs(np.asarray(ours) - theirs).max())
    print(f"merged export vs unmerged forward: max |diff| {diff:.2e}")
    assert diff <= 1e-5
    # the adapters changed the model (the comparison is not between two base models)
    base = program.make_model({**final, **{n: np.zeros_like(final[n]) for n in adapters if n.endswith("lora_b")}})
    assert (
        float(np.abs(np.asarray(base(ids, np.zeros_like(ids), attention_mask=mask)[0]) - np.asarray(ours)).max()) > 1e-4
    )


def test_merge_folds_adapters_on_scanned_and_multi_axis_kernels():
    """W + s A B on a stacked (scanned) q kernel [layers, d, heads, d_head] and an output kernel [heads, d_head, d]."""
    rng = np.random.default_rng(0)
    w_q, a_q, b_q = rng.normal(size=(3, 8, 2, 4)), rng.normal(size=(3, 8, 5)), rng.normal(size=(3, 5, 2, 4))
    w_o, a_o, b_o = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 4, 5)), rng.normal(size=(5, 8))
    merged = lora.merge(
        {"l.q.kernel": w_q, "l.q.lora_a": a_q, "l.q.lora_b": b_q, "o.kernel": w_o, "o.lora_a": a_o, "o.lora_b": b_o},
        0.5,
    )
    assert set(merged) == {"l.q.kernel", "o.kernel"}
    np.testing.assert_allclose(merged["l.q.kernel"], w_q + 0.5 * np.einsum("ldr,lrhk->ldhk", a_q, b_q), atol=1e-5)
    np.testing.assert_allclose(merged["o.kernel"], w_o + 0.5 * np.einsum("hkr,rd->hkd", a_o, b_o), atol=1e-5)


def test_freeze_regex_keeps_embeddings_and_first_layer_bitwise(data, tmp_path):
    wd = str(tmp_path / "freeze")
    regex = r"^transformer[.](word_embedding|mask_emb|layers[.]0[.])"
    init, state, program = _initial_and_final(_config(data, wd, **{"finetune.freeze": regex}), wd)
    final = program.params_of(state)
    frozen = set(state["frozen"])
    assert frozen == {
        n
        for n in final
        if n.startswith(("transformer.word_embedding", "transformer.mask_emb", "transformer.layers.0."))
    }
    assert all(np.array_equal(final[n], init[n]) for n in frozen)
    moved = [n for n in state["params"] if not np.array_equal(final[n], init[n])]
    assert any(n.startswith("transformer.layers.1.") for n in moved) and "logits_proj.kernel" in moved


def test_bad_patterns_are_clear_errors(data, tmp_path):
    from xlgen import sharding
    from xlgen.train.program import build_program

    with pytest.raises(ValueError, match="finetune.lora.targets='nothing_here'"):
        cfg = _config(data, str(tmp_path), **{"finetune.lora.rank": 2, "finetune.lora.targets": "nothing_here"})
        build_program(cfg, sharding.make_mesh(cfg.mesh))
    with pytest.raises(ValueError, match="finetune.freeze='nothing_here': matches no parameter"):
        cfg = _config(data, str(tmp_path), **{"finetune.freeze": "nothing_here"})
        build_program(cfg, sharding.make_mesh(cfg.mesh))


CONFIGS = sorted(
    os.path.join(ROOT, "configs", "finetune", f)
    for f in os.listdir(os.path.join(ROOT, "configs", "finetune"))
    if f.endswith(".py") and f not in ("__init__.py", "common.py")
)


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_every_finetune_config_takes_the_new_keys(path):
    """`xlgen finetune --config=configs/finetune/<x>.py --config.max_segments=N --config.finetune.lora.rank=R ...`"""
    from xlgen import config as config_lib

    over = {
        "max_segments": "4",
        "finetune.mem_len": "256",
        "finetune.segment_pool": "mean",
        "finetune.freeze": "^transformer[.]word_embedding",
        "finetune.lora.rank": "8",
        "finetune.lora.alpha": "32",
    }
    c = config_lib.load_config(path, over)
    assert (c.max_segments, c.finetune.mem_len, c.finetune.segment_pool) == (4, 256, "mean")
    assert (c.finetune.freeze, c.finetune.lora.rank, c.finetune.lora.alpha) == (over["finetune.freeze"], 8, 32.0)
    defaults = config_lib.load_config(path, {})
    assert defaults.max_segments == 0 and defaults.finetune.lora.rank == 0 and defaults.finetune.freeze == ""


@pytest.mark.parametrize("shapes", [((16,), (4, 8)), ((4, 8), (16,))])
def test_merged_dense_equals_the_heads_product_with_bias_and_adapter(shapes):
    """`Dense(merged=True)` (the head projections where the fused TPU attention kernel runs: input and output head
    dimensions merged into one, a 2-D product) equals the product over the separate dimensions, reshaped, with a
    bias and a LoRA adapter (B nonzero)."""
    from xlgen.models.layers import Dense

    in_shape, out_shape = shapes
    dense = Dense(in_shape, out_shape, ("a",) * len(in_shape), ("b",) * len(out_shape), rngs=nnx.Rngs(0))
    dense.bias[...] = jax.random.normal(jax.random.key(1), out_shape)
    lora.attach(dense, rank=3, alpha=6.0, targets="", rngs=nnx.Rngs(2))
    dense.lora_b[...] = jax.random.normal(jax.random.key(3), dense.lora_b.shape)
    x = jax.random.normal(jax.random.key(4), (2, 5) + in_shape)
    want = dense(x).reshape(2, 5, -1)
    got = dense(x.reshape(2, 5, -1), merged=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
