"""Fidelity to the original recipes (zihangdai/xlnet, laiguokun/Funnel-Transformer, kimiyoung/transformer-xl):
the training paths that forward-pass parity with Hugging Face cannot see. `docs/fidelity.md` lists what each test
pins."""

import random

import numpy as np
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
    from data_pipelines.vocab import preprocess_with_map
    from xlgen.finetune.readers.squad import cover_span

    pre_tok = vocab.load_tokenizer("sentencepiece", number_spm)  # as pretraining stores it
    task_tok = vocab.load_tokenizer_file(number_spm)  # as finetuning finds it
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


# ----------------------------------------------------------------------------------------------------------------
# Optimizer: the originals' Adam / AdamWeightDecayOptimizer, weight-decay masks, faithful layer decay
# ----------------------------------------------------------------------------------------------------------------

OPT_NAMES = {
    "layers.0.rel_attn.q.kernel": (3, 4),
    "layers.0.rel_attn.r_w_bias": (2, 2),
    "layers.0.rel_attn.r_r_bias": (2, 2),
    "layers.0.rel_attn.r_s_bias": (2, 2),
    "layers.0.rel_attn.layer_norm.scale": (4,),
    "layers.1.ff.layer_1.bias": (5,),
    "layers.1.ff.layer_1.kernel": (4, 5),
    "layers.1.seg_embed": (2, 2, 2),
    "word_embedding": (7, 4),
    "lm_bias": (7,),
}


def _original_reference(params, grads_seq, *, lr, b1, b2, eps, wd, clip, decayed, bias_correction, layer_scale):
    """NumPy transcription of the originals' step: clip_by_global_norm -> grad *= layer scale (XLNet get_train_op)
    -> AdamWeightDecayOptimizer.apply_gradients (m, v uncorrected; update = m/(sqrt(v)+eps) + wd*param for the
    decayed names; Funnel's bias correction multiplies lr by sqrt(1-b2^t)/(1-b1^t))."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads_seq, start=1):
        norm = np.sqrt(sum(np.sum(np.square(x.astype(np.float64))) for x in g.values()))
        for k in p:
            gk = g[k].astype(np.float64) * (clip / max(norm, clip)) * layer_scale[k]
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk**2
            u = m[k] / (np.sqrt(v[k]) + eps) + (wd * p[k] if decayed[k] else 0.0)
            f = np.sqrt(1 - b2**t) / (1 - b1**t) if bias_correction else 1.0
            p[k] = p[k] - lr * f * u
    return p


@pytest.mark.parametrize(
    "flavour,mask,bias_correction,decayed_r_biases",
    [("xlnet AdamWeightDecayOptimizer", "original", False, True), ("funnel use_wd_exclusion=false", "all", True, True)],
)
def test_original_adamw_matches_the_original_formulas(flavour, mask, bias_correction, decayed_r_biases):
    import jax
    import numpy as np
    from test_train_utils import _opt_cfg

    from xlgen import registry
    from xlgen.train import optim

    rng = np.random.RandomState(0)
    params = {k: rng.randn(*s).astype(np.float32) for k, s in OPT_NAMES.items()}
    grads = [{k: (rng.randn(*s) * 0.3).astype(np.float32) for k, s in OPT_NAMES.items()} for _ in range(3)]
    meta = {k: (s, (None,) * len(s)) for k, s in OPT_NAMES.items()}
    cfg = _opt_cfg(
        learning_rate=0.01,
        warmup_steps=0,
        schedule="constant",
        b1=0.9,
        b2=0.99,
        eps=1e-6,
        weight_decay=0.1,
        clip_norm=1.0,
        lr_layer_decay_rate=0.5,
        layer_decay_mode="faithful",
        update_rule="original",
        bias_correction=bias_correction,
        weight_decay_mask=mask,
    )
    tx, _ = optim.make_optimizer(cfg, 10, meta, layer_ids=registry.get("xlnet").layer_ids)
    state = tx.init(params)
    p = dict(params)
    for g in grads:
        u, state = jax.jit(tx.update)(g, state, p)
        p = {k: p[k] + np.asarray(u[k]) for k in p}
    import re

    # the originals' _do_use_weight_decay: include_in_weight_decay first, then BERT's exclusion (if used)
    excl = ["LayerNorm", "layer_norm", "bias"] if mask == "original" else []
    decayed = {
        k: bool(re.search("r_s_bias|r_r_bias|r_w_bias", k)) or not any(re.search(r, k) for r in excl) for k in OPT_NAMES
    }
    scale = {k: (0.5 if k.startswith("layers.0.") else 1.0) for k in OPT_NAMES}  # 2 layers: rate^(L-1-l)
    want = _original_reference(
        params, grads, lr=0.01, b1=0.9, b2=0.99, eps=1e-6, wd=0.1, clip=1.0, decayed=decayed,
        bias_correction=bias_correction, layer_scale=scale,
    )  # fmt: skip
    for k in OPT_NAMES:
        np.testing.assert_allclose(p[k], want[k], rtol=1e-5, atol=1e-7, err_msg=f"{flavour}: {k}")
    assert optim.weight_decay_mask(list(OPT_NAMES), mask) == decayed
    assert all(decayed[k] for k in OPT_NAMES if re.search("r_[wrs]_bias", k)) == decayed_r_biases
    if mask == "original":  # LayerNorm and the other biases are not decayed
        assert not decayed["layers.1.ff.layer_1.bias"] and not decayed["layers.0.rel_attn.layer_norm.scale"]
        assert not decayed["lm_bias"] and decayed["word_embedding"] and decayed["layers.1.seg_embed"]


def test_faithful_layer_decay_ratios_match_adam_simulation():
    """The per-layer update ratios docs/training.md quotes for XLNet-Large (24 layers, rate 0.75, eps 1e-6): the
    closed form `effective_layer_ratios` equals the running original Adam with per-layer scaled gradients."""
    import jax
    import jax.numpy as jnp

    from xlgen.train import optim

    n, rate, g, eps = 24, 0.75, 5e-5, 1e-6
    tx = optim.original_adam(0.9, 0.99, eps, True)  # b2 0.99: the moments settle within the 3000 steps
    c = rate ** (n - 1 - np.arange(n))
    grads = {"g": jnp.asarray(c * g, jnp.float32)}

    def step(state, _):
        u, state = tx.update(grads, state)
        return state, u["g"]

    _, us = jax.lax.scan(step, tx.init(grads), None, length=3000)
    sim = np.asarray(us[-1]) / float(us[-1][-1])
    closed = optim.effective_layer_ratios(n, rate, g, eps, "faithful")
    np.testing.assert_allclose(sim, closed, rtol=1e-3)
    np.testing.assert_allclose(closed[[16, 8, 0]], [0.89, 0.42, 0.067], atol=0.03)  # the figures
    np.testing.assert_allclose(optim.effective_layer_ratios(n, rate, g, eps, "lr")[[16, 8, 0]], c[[16, 8, 0]])


@pytest.mark.parametrize(
    "config_file,want",
    [
        # XLNet train.py: min_lr_ratio 0.001; weight decay > 0 -> model_utils.AdamWeightDecayOptimizer
        ("xlnet_large.py", dict(min_lr_ratio=0.001, update_rule="original", bias_correction=False)),
        ("xlnet_base.py", dict(min_lr_ratio=0.001, update_rule="original", bias_correction=False)),
        # Transformer-XL tf/train.py (the TPU large runs): cosine to 0.01, tf.train.AdamOptimizer
        ("txl_enwik8_large.py", dict(min_lr_ratio=0.01, update_rule="original", bias_correction=True, eps=1e-8)),
        ("txl_wt103_large.py", dict(min_lr_ratio=0.01, update_rule="original", bias_correction=True, eps=1e-8)),
    ],
)
def test_paper_pretraining_configs_use_the_original_optimizer(config_file, want):
    from test_train_utils import REPO

    from xlgen.config import load_config

    opt = load_config(f"{REPO}/configs/pretrain/{config_file}", {}).optimizer
    assert {k: opt.get(k) for k in want} == want
    if opt.weight_decay > 0:
        assert opt.weight_decay_mask == "original"


# ----------------------------------------------------------------------------------------------------------------
# Funnel pretraining rows: [CLS] A [SEP] B [SEP] with segment ids (create_pretrain_data.py)
# ----------------------------------------------------------------------------------------------------------------


def _compile_cheap(f, *args):
    """f(*args) compiled without XLA's expensive CPU passes (these tests are compile-bound)."""
    import jax

    opts = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
    return jax.jit(f).lower(*args).compile(compiler_options=opts)(*args)


def _numpy_init(make, std=0.05, seed=0):
    """`make()`'s module with N(0, std) NumPy parameters (LayerNorm scales around 1), no initialiser run: a random
    init compiles one threefry kernel per parameter (inside a test's program: most of its compile time)."""
    from flax import nnx

    from xlgen.models.params import materialize

    rng = np.random.RandomState(seed)
    value = lambda name, shape: (name.endswith("scale") + std * rng.randn(*shape)).astype(np.float32)  # noqa: E731
    return materialize(nnx.eval_shape(make), value, seed=seed)


TINY_FUNNEL = {
    "model.d_model": 16,
    "model.n_head": 2,
    "model.d_head": 8,
    "model.d_inner": 32,
    "model.block_sizes": (1, 1),
    "model.num_decoder_layers": 1,
    "model.dropout": 0.0,
    "model.dropatt": 0.0,
    "data.seq_len": 32,
    "data.batch_size": 4,
}


def _funnel_config(**over):
    from test_train_utils import REPO

    from xlgen.config import load_config

    config = load_config(f"{REPO}/configs/pretrain/funnel_tiny.py", {})
    with config.unlocked():
        for k, v in {**TINY_FUNNEL, **over}.items():
            sect, key = k.split(".")
            config[sect][key] = v
    return config


def test_funnel_pretraining_rows_are_segment_pairs_and_train_both_seg_embed_slots():
    import jax
    from flax import nnx

    import data_pipelines
    from xlgen import registry

    config = _funnel_config()
    pipe = data_pipelines.make_pipeline(config.data)
    batch = pipe.batch(3)
    again = data_pipelines.make_pipeline(config.data).batch(3)
    assert all(np.array_equal(batch[k], again[k]) for k in batch)  # a pure function of (seed, step, row)
    obj = registry.objective(config)

    graphdef, params, rest = nnx.split(_numpy_init(lambda: obj.make_model(config, nnx.Rngs(0), True)), nnx.Param, ...)

    def seg_embed_grads(params, rest, batch):
        loss = lambda p: obj.loss(nnx.merge(graphdef, p, rest), batch, None, jax.random.key(0), config)[0]  # noqa: E731
        flat = nnx.to_flat_state(jax.grad(loss)(params))
        return {".".join(map(str, k)): v.value for k, v in flat if k[-1] == "seg_embed"}

    seg = _compile_cheap(seg_embed_grads, params, rest, {k: jax.numpy.asarray(v) for k, v in batch.items()})
    assert seg
    for name, g in seg.items():  # [2 = (different, same), heads, d_head]
        per_slot = np.abs(g).reshape(2, -1).sum(1)
        assert np.all(per_slot > 0), (name, per_slot)
    S, cls_id, sep_id = 32, pipe.cls_id, pipe.sep_id
    for ids, types in zip(batch["labels"], batch["token_type_ids"]):
        seps = np.flatnonzero(ids == sep_id)
        assert ids[0] == cls_id and ids[-1] == sep_id and len(seps) == 2 and 1 < seps[0] < S - 2
        la = seps[0] - 1
        assert types[0] == 2 and np.all(types[1 : la + 2] == 0) and np.all(types[la + 2 :] == 1)
    assert not batch["label_mask"][:, [0, -1]].any()  # [CLS] / [SEP] never predicted
    for ids, m in zip(batch["labels"], batch["label_mask"]):
        assert not np.any(m[ids == sep_id])


# ----------------------------------------------------------------------------------------------------------------
# XLNet SQuAD 2.0 answerability: weighted start state + <cls> state in training and inference (get_qa_outputs)
# ----------------------------------------------------------------------------------------------------------------


def _qa_random_label_accuracy(answer_class_start: str, steps: int = 80) -> float:
    """Train a tiny XLNet QA head on fresh random inputs with RANDOM answerability labels (start = <cls> when
    "unanswerable", as the SQuAD features), then measure the training-path accuracy of cls_logits on fresh data.
    Nothing in the input predicts the label, so anything above chance is a leak."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from xlgen.models.xlnet import XLNetConfig
    from xlgen.models.xlnet.heads import XLNetForQuestionAnswering, squad_loss

    cfg = XLNetConfig(
        vocab_size=32, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
        answer_class_start=answer_class_start,
    )  # fmt: skip
    b, L = 32, 10
    model = _numpy_init(lambda: XLNetForQuestionAnswering(cfg, rngs=nnx.Rngs(0)), std=cfg.initializer_range)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adam(3e-3)

    def data(key):
        k1, k2, k3 = jax.random.split(key, 3)
        ids = jax.random.randint(k1, (b, L), 9, 32).at[:, -2].set(4).at[:, -1].set(3)  # ... <sep> <cls>
        imp = jax.random.bernoulli(k2, 0.5, (b,))
        start = jnp.where(imp, L - 1, jax.random.randint(k3, (b,), 0, L - 2))
        p_mask = jnp.zeros((b, L)).at[:, -2].set(1.0)
        kw = dict(p_mask=p_mask, cls_index=jnp.full((b,), L - 1), start_positions=start)
        return ids, kw, imp.astype(jnp.float32)

    def loss_fn(p, key):
        ids, kw, imp = data(key)
        out, _ = nnx.merge(graphdef, p, rest)(ids, **kw)
        return squad_loss(out, kw["start_positions"], kw["start_positions"], imp).mean()

    def run(params, key):
        def step(carry, k):
            p, s = carry
            g = jax.grad(loss_fn)(p, k)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
        ids, kw, imp = data(jax.random.key(12345))  # fresh data, training path (gold start positions given)
        out, _ = nnx.merge(graphdef, params, rest)(ids, **kw)
        return jnp.mean((out["cls_logits"] > 0) == (imp > 0))

    return float(_compile_cheap(run, params, jax.random.key(1)))


def test_squad_answer_class_sees_the_same_input_in_training_and_inference():
    import jax.numpy as jnp
    from flax import nnx

    from xlgen.models.xlnet import XLNetConfig
    from xlgen.models.xlnet.heads import XLNetForQuestionAnswering

    cfg = XLNetConfig(vocab_size=32, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32, dropout=0.1)
    model = nnx.eval_shape(lambda: XLNetForQuestionAnswering(cfg, rngs=nnx.Rngs(0)))
    assert model.answer_class.drop.rate == 0.1  # dropout on the answer feature after its tanh, rate FLAGS.dropout
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(9, 32, (4, 10)))

    model = _numpy_init(lambda: XLNetForQuestionAnswering(cfg, rngs=nnx.Rngs(0)))
    model.eval()
    graphdef, state = nnx.split(model)

    def both_paths(state, ids):
        model = nnx.merge(graphdef, state)
        kw = dict(p_mask=jnp.zeros((4, 10)).at[:, 3].set(1.0), cls_index=jnp.full((4,), 9))
        train_path, _ = model(ids, start_positions=jnp.array([9, 9, 2, 5]), **kw)
        infer_path, _ = model(ids, **kw)
        return train_path["cls_logits"], infer_path["cls_logits"]

    train_cls, infer_cls = _compile_cheap(both_paths, state, ids)
    np.testing.assert_allclose(train_cls, infer_cls, rtol=1e-6, atol=1e-6)


def test_squad_answer_class_random_labels_stay_at_chance_on_the_training_path():
    original, hf = _qa_random_label_accuracy("weighted"), _qa_random_label_accuracy("gold")
    print(f"random-label answerability accuracy, training path: original {original:.2f}, HF gold start {hf:.2f}")
    assert original < 0.72  # chance: 0.5 (32 fresh examples: 0.72 is 2.5 standard deviations)
    assert hf > 0.9  # HF's gold-start input leaks the label: the test has power


@pytest.mark.parametrize(
    "config_file,eps",
    [
        ("squad.py", 1e-6),  # run_squad.py, tpu_squad_large.sh
        ("race.py", 1e-6),  # run_race.py, tpu_race_large_bsz32.sh
        ("glue.py", 1e-8),  # run_classifier.py
        ("glue.py:mnli", 1e-8),
        ("glue.py:stsb", 1e-8),
        ("imdb.py", 1e-8),
        ("yelp5.py", 1e-8),
        ("classification.py", 1e-8),
        ("glue.py:cola", 1e-6),  # Funnel README preset, Funnel optimization.py
    ],
)
def test_paper_finetune_configs_use_the_original_optimizer(config_file, eps):
    from test_train_utils import REPO

    from xlgen.config import load_config

    opt = load_config(f"{REPO}/configs/finetune/{config_file}", {}).optimizer
    want = dict(update_rule="original", bias_correction=True, layer_decay_mode="faithful", weight_decay=0.0, eps=eps)
    assert {k: opt[k] for k in want} == want
    if config_file == "squad.py":
        assert opt.lr_layer_decay_rate == 0.75


@pytest.mark.parametrize("name", ["B6-6-6H768_mlm", "B10-10-10H1024_electra"])
def test_funnel_paper_configs_follow_the_original_objective_and_optimizer(name):
    from test_train_utils import REPO

    from xlgen.config import load_config

    c = load_config(f"{REPO}/configs/pretrain/funnel.py:{name}", {})
    mlm = name.endswith("_mlm")
    # optimization.py: AdamWeightDecayOptimizer with adam_correction=True, use_wd_exclusion=False, beta2 0.99
    opt = c.optimizer
    assert (opt.update_rule, opt.bias_correction, opt.weight_decay_mask, opt.b2) == ("original", True, "all", 0.99)
    # pretrain.py MLM: lm_proj before the tied softmax; [MASK] removed from attention (ELECTRA: padding only)
    assert c.model.mlm_transform == mlm and c.data.hide_masks_from_attention == mlm
    assert c.data.segment_pairs


def test_mlm_rows_hide_mask_tokens_from_attention():
    import data_pipelines

    config = _funnel_config(**{"data.hide_masks_from_attention": True})
    pipe = data_pipelines.make_pipeline(config.data)
    b = pipe.batch(0)
    is_mask = b["input_ids"] == pipe.mask_id
    assert is_mask.any() and np.array_equal(b["attention_mask"] == 0, is_mask)
    base = data_pipelines.make_pipeline(_funnel_config().data).batch(0)  # the same rows, ids; only the mask differs
    assert np.array_equal(base["input_ids"], b["input_ids"]) and base["attention_mask"].all()


def test_electra_discriminator_target_is_one_for_original_tokens():
    """The original `electra_loss_func`: binary_target = equal(origin_input, sample_input), i.e. logit > 0 means
    "original". A discriminator that says "original" everywhere (a large positive output bias) must score the
    fraction of original tokens as its accuracy (`disc_target="replaced"`, HF's convention, would score the
    fraction of replaced ones)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from xlgen.models.funnel import FunnelConfig
    from xlgen.models.funnel.heads import FunnelElectra, electra_loss

    cfg = FunnelConfig(
        vocab_size=40, block_sizes="1-1", num_decoder_layers=1, d_model=16, n_head=2, d_head=8, d_inner=32,
        dropout=0.0, dropatt=0.0,
    )  # fmt: skip
    rng = np.random.RandomState(0)
    labels = rng.randint(9, 40, (4, 12)).astype(np.int32)
    label_mask = np.zeros((4, 12), np.float32)
    label_mask[:, [2, 5, 8]] = 1.0
    batch = {
        "input_ids": jnp.asarray(np.where(label_mask > 0, 6, labels)),
        "labels": jnp.asarray(labels),
        "label_mask": jnp.asarray(label_mask),
        "attention_mask": jnp.ones((4, 12), jnp.int32),
    }

    def parts(batch):
        model = FunnelElectra(cfg, rngs=nnx.Rngs(0))
        model.eval()
        head = model.discriminator.discriminator_predictions.dense_prediction
        head.bias.value = jnp.full(head.bias.shape, 20.0)  # says "original" (logit > 0) everywhere
        _, p = electra_loss(model, batch, jax.random.key(3))
        return p["disc_accuracy"], p["replaced_ratio"]

    acc, replaced = (float(x) for x in _compile_cheap(parts, batch))
    assert 0 < replaced < 0.5
    assert acc == pytest.approx(1.0 - replaced, abs=1e-6)  # HF's convention ("replaced") would score `replaced`


@pytest.mark.parametrize("model_reuse", [None, 8])
def test_xlnet_pretraining_memory_settings_are_cross_checked(model_reuse):
    """data.reuse_len = 16: the memory must cache exactly those 16 positions (model.reuse_len None would cache the
    whole segment, A/B and separators included); a mismatch is a clear error naming both keys."""
    from test_train_utils import REPO

    from xlgen import registry
    from xlgen.config import load_config
    from xlgen.train.program import abstract_model

    config = load_config(f"{REPO}/configs/pretrain/xlnet_tiny.py", {})
    obj = registry.objective(config)
    abstract_model(lambda r: obj.make_model(config, r, True), train=True)  # the shipped config is consistent
    with config.unlocked():
        config.model.reuse_len = model_reuse
    with pytest.raises(ValueError, match=r"model\.reuse_len.*data\.reuse_len|data\.reuse_len=16.*model\.reuse_len"):
        abstract_model(lambda r: obj.make_model(config, r, True), train=True)


def test_race_input_order_per_family():
    """XLNet run_race.py: article <sep> qa <sep> <cls> (left padded); Funnel race.py: [CLS] qa [SEP] article [SEP]
    (token types CLS 2, qa 0, article 1); both keep the last max_qa_length qa pieces and the article's head, and
    every option starts from the untouched article (xlgen does not repeat run_race.py's shared-list append)."""
    import types

    from xlgen.finetune.readers.examples import ChoiceExample
    from xlgen.finetune.readers.features import choice_features

    enc = lambda s: [int(w) for w in s.split()]  # noqa: E731
    xlnet = types.SimpleNamespace(style="cls_last", cls_id=3, sep_id=4, pad_id=5, encode=enc)
    funnel = types.SimpleNamespace(style="cls_first", cls_id=101, sep_id=102, pad_id=0, encode=enc)
    ex = ChoiceExample("q", "1 2 3", ("20 21 22", "30", "40", "50"), 2, "high")
    fx = choice_features([ex], xlnet, max_seq_length=10, max_qa_length=2)
    assert fx["input_ids"][0, 0].tolist() == [5, 5, 1, 2, 3, 4, 21, 22, 4, 3]
    assert fx["input_ids"][0, 1].tolist() == [5, 5, 5, 1, 2, 3, 4, 30, 4, 3]  # not [.. 4 21 22 4 3 30 ..]
    ff = choice_features([ex], funnel, max_seq_length=10, max_qa_length=2)
    assert ff["input_ids"][0, 0].tolist() == [101, 21, 22, 102, 1, 2, 3, 102, 0, 0]
    assert ff["token_type_ids"][0, 0].tolist() == [2, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    long = ChoiceExample("q", "1 2 3 4 5 6 7 8 9", ("20 21 22", "30", "40", "50"), 2, "high")
    ff = choice_features([long], funnel, max_seq_length=10, max_qa_length=2)
    assert ff["input_ids"][0, 0].tolist() == [101, 21, 22, 102, 1, 2, 3, 4, 5, 102]


def test_txl_evaluation_scores_b_times_l_minus_1_tokens():
    """The docstring of data_pipelines/lm.py: an evaluation pass scores B*(L-1) tokens, L = N // B: the tail and
    each row's first token (the corpus start and the B - 1 row starts) are never predicted, as the original."""
    import data_pipelines

    cfg = data_pipelines.default_config("lm")
    cfg.update(dict(source="tinyshakespeare", vocab="char", batch_size=4, eval_batch_size=4, eval_tgt_len=64))
    ev = data_pipelines.make_pipeline(cfg, split="valid")
    scored = sum(float(ev.batch(s)["label_mask"].sum()) for s in range(ev.num_steps))
    B, N = 4, ev.corpus.num_tokens
    assert scored == B * (N // B - 1)
