"""XLNet: parity with Hugging Face transformers 4.34.1 for every class, and the paper's properties.

Parity models are small random HF models (weights redrawn with a larger std so that attention is far from uniform
and any position/mask/segment mistake shows), saved with `save_pretrained` and loaded by `xlgen.from_pretrained`.
HF 4.34.1 has two bugs in `attn_type="uni"` (`create_mask` passes the device as a size; `attn_mask += data_mask`
cannot broadcast over the batch): the reference fixes the first and runs "uni" one row at a time.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from transformers.models.xlnet import modeling_xlnet as hf_xlnet  # noqa: E402

import xlgen  # noqa: E402
from xlgen.models.params import materialize  # noqa: E402
from xlgen.models.xlnet import heads as XH  # noqa: E402
from xlgen.models.xlnet import model as X  # noqa: E402

TOL = 1e-4
VOCAB = 37


def _hf_create_mask(self, qlen, mlen):  # HF's create_mask with its torch.ones(size, device) bug fixed
    mask = torch.ones((qlen, qlen + mlen))
    if self.same_length:
        mask_lo = mask[:, :qlen].tril(-1)
        mask.triu_(mlen + 1)
        mask[:, :qlen] += mask_lo
    else:
        mask.triu_(mlen + 1)
    return mask


hf_xlnet.XLNetModel.create_mask = _hf_create_mask


def hf_model(cls_name, tmp_path, seed=0, **cfg):
    """A random HF model of class `cls_name`, saved to tmp_path; returns (torch model, directory)."""
    base = dict(
        vocab_size=VOCAB,
        d_model=16,
        n_layer=2,
        n_head=2,
        d_inner=24,
        dropout=0.0,
        mem_len=None,
        summary_last_dropout=0.0,
        start_n_top=3,
        end_n_top=2,
    )
    base.update(cfg)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(transformers.XLNetConfig(**base)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "LayerNorm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    path = tmp_path / cls_name
    model.save_pretrained(path)
    return model, path


def hf_call(model, rowwise=False, **kw):
    """Call the HF model on NumPy kwargs (row by row when rowwise, concatenating outputs and mems)."""

    def t(v):
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            return [t(x) for x in v]
        return torch.tensor(v)

    with torch.no_grad():
        if not rowwise:
            return model(**{k: t(v) for k, v in kw.items()})
        b = kw["input_ids"].shape[0]
        outs = []
        for i in range(b):
            row = {
                k: (None if v is None else [m[:, i : i + 1] for m in v] if k == "mems" else v[i : i + 1])
                for k, v in kw.items()
            }
            outs.append(model(**{k: t(v) for k, v in row.items()}))
        merged = {}
        for key in outs[0].keys():
            if key == "mems":
                merged["mems"] = [torch.cat([o.mems[l] for o in outs], 1) for l in range(len(outs[0].mems))]
            else:
                merged[key] = torch.cat([o[key] for o in outs], 0)
        return transformers.utils.ModelOutput(merged)


def maxdiff(a, b):
    return float(
        np.max(
            np.abs(
                np.asarray(a, np.float64) - np.asarray(b.detach().numpy() if hasattr(b, "detach") else b, np.float64)
            )
        )
    )


def mems_diff(ours, ref):
    return max(maxdiff(o, r) for o, r in zip(ours, ref))


def lm_inputs(rng, b, l, *, n_seg=2, pad=True, perm=True, num_predict=3, token_types=True):
    ids = rng.randint(0, VOCAB, (b, l))
    kw = {"input_ids": ids}
    if token_types:
        kw["token_type_ids"] = rng.randint(0, n_seg, (b, l))
    if pad:
        am = np.ones((b, l), np.float32)
        am[1, :2] = 0  # left padding, as XLNet finetuning
        kw["attention_mask"] = am
    if perm:
        kw["perm_mask"] = (rng.rand(b, l, l) < 0.4).astype(np.float32)
        tm = np.zeros((b, num_predict, l), np.float32)
        for i in range(b):
            for t, z in enumerate(rng.choice(l, num_predict - (i % 2), replace=False)):  # odd rows: a padded target
                tm[i, t, z] = 1
        kw["target_mapping"] = tm
    return kw


LM_CONFIGS = {
    # name: (HF config, input options)
    "bi_bidata_mem_reuse_clamp_gelu": (
        dict(attn_type="bi", bi_data=True, mem_len=5, reuse_len=4, clamp_len=3, ff_activation="gelu"),
        dict(n_seg=2),
    ),
    "uni_samelength_keepall_relu_3seg": (
        dict(attn_type="uni", same_length=True, mem_len=None, ff_activation="relu", untie_r=False),
        dict(n_seg=3),
    ),
    "bi_contentstream_nosegments": (
        dict(attn_type="bi", mem_len=3, clamp_len=-1, ff_activation="relu", untie_r=False),
        dict(perm=False, token_types=False, pad=False),
    ),
}


@pytest.mark.parametrize("name", list(LM_CONFIGS))
def test_lm_head_parity_two_calls_with_memory(tmp_path, name):
    hf_cfg, opts = LM_CONFIGS[name]
    ref_model, path = hf_model("XLNetLMHeadModel", tmp_path, **hf_cfg)
    ours = xlgen.from_pretrained(path)
    rowwise = hf_cfg["attn_type"] == "uni"
    rng = np.random.RandomState(1)
    ref_mems = our_mems = None
    for step in range(2):
        kw = lm_inputs(rng, 4, 7, **opts)
        ref = hf_call(ref_model, rowwise=rowwise, mems=ref_mems, **kw)
        out = ours(mems=our_mems, **kw)
        d_logits, d_mems = maxdiff(out.logits, ref.logits), mems_diff(out.mems, ref.mems)
        print(f"PARITY XLNetLMHeadModel {name} call{step}: logits {d_logits:.2e} mems {d_mems:.2e}")
        assert out.logits.shape == tuple(ref.logits.shape)
        assert d_logits < TOL and d_mems < TOL
        ref_mems, our_mems = ref.mems, out.mems


def test_base_model_parity_and_scan_layers(tmp_path):
    ref_model, path = hf_model("XLNetModel", tmp_path, attn_type="bi", bi_data=True, mem_len=4, clamp_len=2)
    rng = np.random.RandomState(2)
    kw = lm_inputs(rng, 2, 6, n_seg=2)
    ref = hf_call(ref_model, **kw)
    for scan in (False, True):
        out = xlgen.from_pretrained(path, scan_layers=scan, remat=scan)(**kw)
        d, dm = maxdiff(out.last_hidden_state, ref.last_hidden_state), mems_diff(out.mems, ref.mems)
        print(f"PARITY XLNetModel scan_layers={scan}: last_hidden_state {d:.2e} mems {dm:.2e}")
        assert d < TOL and dm < TOL


def test_sequence_classification_and_regression_parity(tmp_path):
    rng = np.random.RandomState(3)
    b, l = 3, 8
    ids = rng.randint(0, VOCAB, (b, l))
    tt = np.array([[4, 4, 0, 0, 0, 1, 1, 2]] * b)  # PAD, A, B, CLS (original segment ids; any ids work)
    am = np.ones((b, l), np.float32)
    am[0, :2] = 0
    for num_labels, labels in ((3, np.array([0, 2, 1])), (1, rng.randn(b).astype(np.float32))):
        ref_model, path = hf_model("XLNetForSequenceClassification", tmp_path / str(num_labels), num_labels=num_labels)
        ref = hf_call(ref_model, input_ids=ids, token_type_ids=tt, attention_mask=am, labels=labels)
        out = xlgen.from_pretrained(path)(input_ids=ids, token_type_ids=tt, attention_mask=am, labels=labels)
        d, dl = maxdiff(out.logits, ref.logits), abs(float(out.loss) - float(ref.loss))
        print(f"PARITY XLNetForSequenceClassification num_labels={num_labels}: logits {d:.2e} loss {dl:.2e}")
        assert out.logits.shape == (b, num_labels) and d < TOL and dl < TOL


def test_token_classification_parity(tmp_path):
    """`XLNetForTokenClassification`: logits at every position and HF's loss (labels -100 ignored) with the same
    weights, and the head of the finetuning registry is that class."""
    rng = np.random.RandomState(4)
    b, l = 2, 9
    ids = rng.randint(0, VOCAB, (b, l))
    tt = np.zeros((b, l), np.int64)
    am = np.ones((b, l), np.float32)
    am[1, :3] = 0
    labels = rng.randint(0, 5, (b, l))
    labels[1, :3] = -100
    ref_model, path = hf_model("XLNetForTokenClassification", tmp_path, num_labels=5)
    ref = hf_call(ref_model, input_ids=ids, token_type_ids=tt, attention_mask=am, labels=labels)
    out = xlgen.from_pretrained(path)(input_ids=ids, token_type_ids=tt, attention_mask=am, labels=labels)
    d, dl = maxdiff(out.logits, ref.logits), abs(float(out.loss) - float(ref.loss))
    print(f"PARITY XLNetForTokenClassification: logits {d:.2e} loss {dl:.2e}")
    assert out.logits.shape == (b, l, 5) and d < TOL and dl < TOL


def test_multiple_choice_parity(tmp_path):
    ref_model, path = hf_model("XLNetForMultipleChoice", tmp_path)
    rng = np.random.RandomState(4)
    b, c, l = 2, 4, 6
    kw = dict(
        input_ids=rng.randint(0, VOCAB, (b, c, l)),
        token_type_ids=rng.randint(0, 2, (b, c, l)),
        attention_mask=(rng.rand(b, c, l) > 0.2).astype(np.float32),
        labels=np.array([1, 3]),
    )
    kw["attention_mask"][..., -1] = 1
    ref = hf_call(ref_model, **kw)
    out = xlgen.from_pretrained(path)(**kw)
    d = maxdiff(out.logits, ref.logits)
    print(f"PARITY XLNetForMultipleChoice: logits {d:.2e} loss {abs(float(out.loss) - float(ref.loss)):.2e}")
    assert out.logits.shape == (b, c) and d < TOL and abs(float(out.loss) - float(ref.loss)) < TOL


def test_question_answering_parity(tmp_path):
    ref_model, path = hf_model("XLNetForQuestionAnswering", tmp_path)
    ours = xlgen.from_pretrained(path)
    rng = np.random.RandomState(5)
    b, l = 3, 9
    kw = dict(
        input_ids=rng.randint(0, VOCAB, (b, l)),
        token_type_ids=np.array([[0] * 3 + [1] * 5 + [2]] * b),
        attention_mask=np.ones((b, l), np.float32),
    )
    p_mask = np.zeros((b, l), np.float32)
    p_mask[:, 3] = 1  # a <sep>
    p_mask[0, :2] = 1
    cls_index = np.full((b,), l - 1)
    ref = hf_call(ref_model, p_mask=p_mask, cls_index=cls_index, **kw)
    out = ours(p_mask=p_mask, cls_index=cls_index, **kw)
    diffs = {}
    for key in ("start_top_log_probs", "end_top_log_probs", "cls_logits"):
        diffs[key] = maxdiff(out[key], ref[key])
        assert out[key].shape == tuple(ref[key].shape)
    for key in ("start_top_index", "end_top_index"):
        np.testing.assert_array_equal(out[key], ref[key].numpy())
    # training mode: end logits on the gold start, answerability loss
    sp, ep, imp = np.array([4, 5, 8]), np.array([6, 5, 8]), np.array([0.0, 0.0, 1.0], np.float32)
    ref_t = hf_call(
        ref_model, start_positions=sp, end_positions=ep, is_impossible=imp, cls_index=cls_index, p_mask=p_mask, **kw
    )
    out_t = ours(start_positions=sp, end_positions=ep, is_impossible=imp, cls_index=cls_index, p_mask=p_mask, **kw)
    diffs["loss"] = abs(float(out_t.loss) - float(ref_t.loss))
    print("PARITY XLNetForQuestionAnswering: " + " ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) < TOL


# ----------------------------------------------------------------------------------------------------------------
# Properties of the native modules
# ----------------------------------------------------------------------------------------------------------------


@nnx.jit
def apply(model, kw):
    """model(**kw) under one jit (eager op-by-op dispatch is far slower for these tests)."""
    return model(**kw)


def build(cls, cfg, seed=0):
    """A module with N(0, initializer_range) weights drawn by NumPy (LayerNorm scales ~1), skipping the jitted
    random initialisers (much faster to build on a loaded CPU)."""
    rng = np.random.RandomState(seed)

    def value(name, shape):
        if name.endswith("layer_norm.scale"):
            return 1.0 + 0.1 * rng.randn(*shape)
        return cfg.initializer_range * rng.randn(*shape)

    model = materialize(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))), value, seed=seed)
    model.eval()
    return model


def small_config(**kw):
    base = dict(
        vocab_size=VOCAB,
        d_model=16,
        n_layer=2,
        n_head=2,
        d_head=8,
        d_inner=24,
        dropout=0.0,
        dropatt=0.0,
        initializer_range=0.3,
    )
    base.update(kw)
    return X.XLNetConfig(**base)


def order_masks(order):
    """Factorization order -> perm_mask (content stream sees order <= own; query stream order < own)."""
    rank = np.argsort(order)
    return (rank[None, :] >= rank[:, None]).astype(np.float32)


def test_query_stream_ignores_own_token_and_later_tokens():
    cfg = small_config(vocab_size=VOCAB)
    model = build(X.XLNetModel, cfg, 0)
    rng = np.random.RandomState(6)
    b, l = 2, 6
    order = rng.permutation(l)
    rank = np.argsort(order)
    kw = dict(
        perm_mask=np.broadcast_to(order_masks(order), (b, l, l)),
        token_type_ids=rng.randint(0, 2, (b, l)),
        mems=jnp.asarray(rng.randn(cfg.n_layer, b, 2, cfg.d_model), jnp.float32),
    )  # always-visible context
    tm = np.broadcast_to(np.eye(l, dtype=np.float32), (b, l, l))
    emb = jnp.asarray(rng.randn(b, l, cfg.d_model).astype(np.float32))

    @nnx.jit
    def jacobians(model, e):
        def streams(e):
            g, _ = model(inputs_embeds=e, target_mapping=tm, **kw)
            h, _ = model(inputs_embeds=e, **kw)
            return g, h

        return jax.jacfwd(streams)(e)  # (jit(jacrev) of this two-output function disagrees with eager on
        # jax 0.10.2 CPU while jit(jacfwd), eager jacrev and every scalar grad agree; see the report)

    jac_g, jac_h = jacobians(model, emb)  # [b,l,d, b,l,d]
    # influence of input position j on output position t (same row), max over widths
    infl_g = np.abs(np.asarray(jac_g)).max(axis=(2, 5))[np.arange(b), :, np.arange(b)]  # [b, t, j]
    infl_h = np.abs(np.asarray(jac_h)).max(axis=(2, 5))[np.arange(b), :, np.arange(b)]
    later_or_self = rank[None, :] >= rank[:, None]  # [t, j]: j is t itself or later in the order
    assert np.all(infl_g[:, later_or_self] == 0.0)  # exactly zero gradient
    assert np.all(infl_g[:, ~later_or_self] > 0.0)
    later = rank[None, :] > rank[:, None]
    assert np.all(infl_h[:, later] == 0.0)
    assert np.all(infl_h[:, ~later] > 0.0)


def test_segment_relabeling_invariance_and_three_segments_without_new_parameters():
    model = build(X.XLNetModel, small_config(), 1)
    rng = np.random.RandomState(7)
    ids = rng.randint(0, VOCAB, (2, 7))
    tt2 = rng.randint(0, 2, (2, 7))
    tt3 = rng.randint(0, 3, (2, 7))
    run = lambda tt: np.asarray(apply(model, {"input_ids": ids, "token_type_ids": tt})[0])  # noqa: E731
    out2, out3 = run(tt2), run(tt3)
    np.testing.assert_allclose(run(1 - tt2), out2, atol=1e-6)
    np.testing.assert_allclose(run((tt3 + 1) % 3), out3, atol=1e-6)
    np.testing.assert_allclose(run(tt3 * 7 + 5), out3, atol=1e-6)  # any labels: no segment embedding table
    assert np.abs(out3 - out2).max() > 1e-3  # segments matter
    seg_params = [p for path, p in nnx.state(model, nnx.Param).flat_state() if "seg_embed" in str(path)]
    assert seg_params and all(p.shape[0] == 2 for p in seg_params)  # only "same"/"different" vectors


def test_fixed_order_probabilities_sum_to_one():
    cfg = small_config(vocab_size=3)
    model = build(X.XLNetLMHeadModel, cfg, 2)
    seqs = np.array(np.meshgrid(*[np.arange(3)] * 3, indexing="ij")).reshape(3, -1).T  # all 27 sequences
    n = len(seqs)
    mems = np.broadcast_to(
        np.random.RandomState(8).randn(cfg.n_layer, 1, 2, cfg.d_model).astype(np.float32),
        (cfg.n_layer, n, 2, cfg.d_model),
    )
    nll, _ = apply(
        model,
        dict(
            input_ids=seqs,
            perm_mask=np.broadcast_to(order_masks(np.array([2, 0, 1])), (n, 3, 3)),
            target_mapping=np.broadcast_to(np.eye(3, dtype=np.float32), (n, 3, 3)),
            target_ids=seqs,
            mems=mems,
        ),
    )
    probs = np.exp(-np.asarray(nll, np.float64).sum(-1))
    assert abs(probs.sum() - 1.0) < 1e-5, probs.sum()
    assert probs.std() > 1e-3  # a non-trivial distribution


def test_content_stream_is_a_bidirectional_transformer_xl_encoder():
    cfg = small_config(mem_len=3)
    model = build(X.XLNetModel, cfg, 3)
    rng = np.random.RandomState(9)
    ids = rng.randint(0, VOCAB, (2, 5))
    mems = jnp.asarray(rng.randn(cfg.n_layer, 2, 3, cfg.d_model), jnp.float32)
    out, _ = apply(model, dict(input_ids=ids, mems=mems, perm_mask=np.zeros((2, 5, 5), np.float32)))
    from xlgen.models.relative_attention import relative_position_sequence, sinusoid_embedding

    @nnx.jit
    def encoder(model):  # the shared core's own layer call (kv = [mem; h], "bi" distances) + FFN, nothing else
        h = jnp.take(model.word_embedding[...], ids, axis=0)
        pos_emb = sinusoid_embedding(relative_position_sequence(5, 8, "bi"), cfg.d_model)
        for i, layer in enumerate(model.layers):
            h = layer.ff(layer.rel_attn(h, jnp.concatenate([mems[i], h], axis=1), pos_emb, offset=5))
        return h

    np.testing.assert_allclose(out, encoder(model), atol=1e-6)


def test_per_row_direction_equals_half_batch_layout_and_survives_resharding():
    model = build(X.XLNetLMHeadModel, small_config(bi_data=True, clamp_len=3), 4)
    kw = lm_inputs(np.random.RandomState(10), 4, 6)
    half = np.asarray(apply(model, kw)[0])  # config.bi_data -> the original first-half-forward layout
    flags = X.half_batch_is_forward(4)
    np.testing.assert_array_equal(flags, [True, True, False, False])
    np.testing.assert_allclose(apply(model, {**kw, "is_forward": flags})[0], half, atol=1e-6)
    shuffle = np.array([2, 0, 3, 1])  # rows moved across "shards": the flags travel with the rows
    moved = {k: v[shuffle] for k, v in kw.items()}
    np.testing.assert_allclose(apply(model, {**moved, "is_forward": flags[shuffle]})[0], half[shuffle], atol=1e-6)
    assert np.abs(np.asarray(apply(model, {**kw, "is_forward": np.ones(4, bool)})[0]) - half).max() > 1e-3


@pytest.mark.slow
def test_scan_layers_and_remat_equal_unscanned_in_value_and_gradient():
    rng = np.random.RandomState(11)
    kw = lm_inputs(rng, 2, 6)
    kw.update(mems=rng.randn(2, 2, 4, 16).astype(np.float32), target_ids=rng.randint(0, VOCAB, (2, 3)))
    ref = build(X.XLNetLMHeadModel, small_config(mem_len=4, reuse_len=3), 5)
    params = {".".join(map(str, k)): v[...] for k, v in nnx.state(ref, nnx.Param).flat_state()}
    n_layer = ref.config.n_layer

    def stacked(name, shape):
        if ".layers." not in name:
            return params[name]
        head, rest = name.split(".layers.")
        return np.stack([params[f"{head}.layers.{i}.{rest}"] for i in range(n_layer)])

    cfg_scan = small_config(mem_len=4, reuse_len=3, scan_layers=True, remat=True)
    scanned = materialize(nnx.eval_shape(lambda: X.XLNetLMHeadModel(cfg_scan, rngs=nnx.Rngs(0))), stacked)

    @nnx.jit
    def value_and_grad(m):
        def loss(m):
            nll, new_mems = m(**kw)
            return nll.sum(), new_mems

        return nnx.value_and_grad(loss, has_aux=True)(m)

    (l_ref, m_ref), g_ref = value_and_grad(ref)
    (l_sc, m_sc), g_sc = value_and_grad(scanned)
    np.testing.assert_allclose(l_sc, l_ref, rtol=1e-6)
    np.testing.assert_allclose(m_sc, m_ref, atol=1e-6)
    g_ref = {".".join(map(str, k)): v[...] for k, v in g_ref.flat_state()}
    for name, g in g_sc.flat_state():
        name = ".".join(map(str, name))
        np.testing.assert_allclose(
            g[...],
            g_ref[name]
            if ".layers." not in name
            else np.stack([g_ref[name.replace(".layers.", f".layers.{i}.")] for i in range(n_layer)]),
            atol=1e-5,
            err_msg=name,
        )


def test_shared_biases_equal_untied_copies_and_bf16_is_close():
    kw = lm_inputs(np.random.RandomState(12), 2, 6)
    tied = build(X.XLNetModel, small_config(untie_r=False), 7)
    params = {".".join(map(str, k)): v[...] for k, v in nnx.state(tied, nnx.Param).flat_state()}

    def untied_value(name, shape):
        for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
            if name.endswith("rel_attn." + b):
                return params[b]
        return params[name]

    untied = materialize(
        nnx.eval_shape(lambda: X.XLNetModel(small_config(untie_r=True), rngs=nnx.Rngs(0))), untied_value
    )
    untied.eval()
    out = np.asarray(apply(tied, kw)[0])
    np.testing.assert_allclose(apply(untied, kw)[0], out, atol=1e-6)
    bf16 = materialize(
        nnx.eval_shape(lambda: X.XLNetModel(small_config(untie_r=False, dtype="bfloat16"), rngs=nnx.Rngs(0))),
        lambda n, s: params[n],
    )
    bf16.eval()
    out_bf16 = apply(bf16, kw)[0]
    assert out_bf16.dtype == jnp.bfloat16
    assert np.abs(np.asarray(out_bf16, np.float32) - out).max() < 0.1


def test_lm_nll_is_vectorised_log_softmax_and_memory_is_cached_with_stop_gradient():
    model = build(X.XLNetLMHeadModel, small_config(mem_len=3, reuse_len=2), 9)
    rng = np.random.RandomState(13)
    kw = lm_inputs(rng, 2, 5)
    tgt = rng.randint(0, VOCAB, (2, 3))
    nll, mems = apply(model, {**kw, "target_ids": tgt})
    assert nll.shape == (2, 3) and nll.dtype == jnp.float32
    logits = rng.randn(2, 3, VOCAB).astype(np.float32)
    ref = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), tgt[..., None], -1)[..., 0]
    np.testing.assert_allclose(X.token_nll(jnp.asarray(logits), tgt), ref, atol=1e-5)
    assert mems.shape == (2, 2, 2, 16)  # only the first reuse_len=2 positions are cached
    _, mems2 = apply(model, {**kw, "mems": mems})
    assert mems2.shape == (2, 2, 3, 16)  # [old 2; new 2] -> last mem_len=3
    np.testing.assert_allclose(mems2[:, :, 0], mems[:, :, 1], atol=0)

    grad = nnx.jit(lambda m, mem: jax.grad(lambda mem: m(**kw, mems=mem)[1].sum())(mem))(model, mems)
    assert np.abs(np.asarray(grad)).max() == 0.0


def test_heads_native_shapes_and_loss():
    cfg = small_config(num_labels=3, start_n_top=2, end_n_top=3)
    rng = np.random.RandomState(14)
    ids = rng.randint(0, VOCAB, (2, 6))
    qa = build(XH.XLNetForQuestionAnswering, cfg, 0)
    out, _ = apply(qa, {"input_ids": ids})
    assert out["end_top_index"].shape == (2, 2, 3) and out["start_top_log_probs"].shape == (2, 2)
    assert np.all(np.diff(np.asarray(out["end_top_log_probs"]), axis=-1) <= 0)  # sorted beams
    train, _ = apply(qa, {"input_ids": ids, "start_positions": np.array([1, 2])})
    loss = XH.squad_loss(train, np.array([1, 2]), np.array([3, 2]), np.array([0, 1]))
    assert loss.shape == (2,) and np.all(np.isfinite(loss)) and np.all(loss > 0)
    cls = build(XH.XLNetForSequenceClassification, cfg, 1)
    assert apply(cls, {"input_ids": ids})[0].shape == (2, 3)
    with pytest.raises(ValueError, match="input_mask"):
        apply(cls, {"input_ids": ids, "input_mask": np.zeros((2, 6)), "attention_mask": np.ones((2, 6))})
