"""`xlgen export --to-hf`: round trips with transformers 4.34.1 for every family and finetuning head.

* HF -> xlgen -> HF: a random HF model, loaded by `xlgen.from_pretrained` and exported again, gives back the same
  state dict (bitwise) and the same outputs (bitwise), for every class xlgen exports (xlgen-vs-HF parity of the
  loaded models is tests/test_{transformer_xl,xlnet,funnel}.py's).
* xlgen -> HF -> xlgen: a random xlgen model (including xlgen-only layouts: scanned layers, shared u/v biases)
  exported and loaded by HF gives HF outputs equal to xlgen's within 1e-5; loaded back by xlgen, bitwise the same parameters.
* a trained workdir through the CLI: tests/test_workdir_tools.py.
"""

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

import xlgen
from xlgen.interop import export

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5
FAST = {"xla_backend_optimization_level": 0}


def randomize(model, seed=0, std=0.3):
    """N(0, std) weights (LayerNorm around 1) so that every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "layer_norm" in name.lower():
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            else:
                p.copy_(std * noise)
    return model


def hf_outputs(model, kw):
    with torch.no_grad():
        out = model(**{k: torch.tensor(v) for k, v in kw.items()})
    return {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}


def check_state_dicts_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def reload_hf(cls, path):
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def assert_same_params(a, b):
    """Two xlgen models are the same model: bitwise equal parameters in the HF layout (an xlgen-only layout such as
    shared u/v biases loads back as HF's per-layer copies)."""
    pa, pb = export.to_hf(a)[1], export.to_hf(b)[1]
    assert set(pa) == set(pb)
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


def random_module(cls, cfg, seed=0, std=0.3, **kw):
    """An xlgen module of class `cls` with N(0, std) parameters (LayerNorm scales around 1), no initialisers run."""
    from xlgen.models.xlnet import materialize

    rng = np.random.default_rng(seed)
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0), **kw))
    value = lambda name, shape: rng.normal(size=shape) * (0.1 if "norm" in name else std) + name.endswith("scale")
    module = materialize(abstract, value)
    module.eval()
    return module


# ----------------------------------------------------------------------------------------------------------------
# Transformer-XL
# ----------------------------------------------------------------------------------------------------------------

TXL_HF = dict(vocab_size=60, d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=2, dropout=0.0, dropatt=0.0)


@pytest.mark.parametrize(
    "kw",
    [
        dict(cutoffs=[20, 40], div_val=2, d_embed=16, mem_len=6, untie_r=False, same_length=True, clamp_len=3),
        dict(cutoffs=[20, 45], div_val=1, d_embed=12, mem_len=5, proj_share_all_but_first=False),
    ],
    ids=["adaptive_div2_shared_r", "div1_proj_untied"],
)
def test_txl_hf_to_xlgen_to_hf(tmp_path, kw):
    hf = randomize(transformers.TransfoXLLMHeadModel(transformers.TransfoXLConfig(**TXL_HF, **kw)).eval())
    hf.save_pretrained(tmp_path / "hf")
    ours = xlgen.from_pretrained(str(tmp_path / "hf"))
    export.export_model(ours, tmp_path / "out")
    hf2 = reload_hf(transformers.TransfoXLLMHeadModel, tmp_path / "out")
    check_state_dicts_equal(hf, hf2)
    ids = np.random.default_rng(0).integers(0, 60, (2, 7))
    ref, again = hf_outputs(hf, {"input_ids": ids}), hf_outputs(hf2, {"input_ids": ids})
    assert maxdiff(ref["prediction_scores"], again["prediction_scores"]) == 0.0


def test_txl_xlgen_to_hf_to_xlgen_with_memory(tmp_path):
    """Scanned layers, shared u/v, mixed projection tying: HF's log-probs over two segments (memory carried)
    equal xlgen's, and the exported directory loads back into the same xlgen model."""
    from xlgen.models.transformer_xl import TransformerXLConfig, TransformerXLLM, TransfoXLPretrained

    cfg = TransformerXLConfig(
        **{k: v for k, v in TXL_HF.items()},
        cutoffs=(20, 40),
        div_val=2,
        d_embed=16,
        mem_len=5,
        clamp_len=-1,
        same_length=False,
        untie_r=False,
        tie_projs=(False, True, False),
        scan_layers=True,
    )
    ours = TransfoXLPretrained(random_module(TransformerXLLM, cfg, seed=1))
    export.export_model(ours, tmp_path / "out")
    hf = reload_hf(transformers.TransfoXLLMHeadModel, tmp_path / "out")
    rng = np.random.default_rng(1)
    segs = [rng.integers(0, 60, (2, 4)) for _ in range(2)]
    assert_same_params(xlgen.from_pretrained(str(tmp_path / "out"), scan_layers=True), ours)
    mems_hf = mems_ours = None
    errs = []
    for ids in segs:
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor(ids), mems=mems_hf)
        out = ours(input_ids=ids, mems=mems_ours)
        errs.append(maxdiff(out.log_probs, ref.prediction_scores.numpy()))
        mems_hf, mems_ours = ref.mems, out.mems
    print(f"TXL xlgen->HF->xlgen: max|log_probs xlgen - HF| over 2 segments = {max(errs):.2e}; xlgen reload exact")
    assert max(errs) < TOL


@pytest.mark.parametrize("tied", [True, False])
def test_txl_softmax_output_layers_and_spectrum_control_export(tmp_path, tied):
    """`output_layer=softmax` (tied: with spectrum control E = U diag(sigma) V^T, d_embed != d_model; untied: its own
    table and projection) exports as an equivalent HF model; output layers HF lacks (MoS, ...) are refused."""
    from xlgen.models.transformer_xl import TransformerXLConfig, TransformerXLLM, TransfoXLPretrained

    out_cfg = {"spectrum_control": True} if tied else {}
    cfg = TransformerXLConfig(
        **TXL_HF,
        cutoffs=(),
        div_val=1,
        d_embed=12,
        mem_len=4,
        clamp_len=-1,
        same_length=False,
        output_layer="softmax",
        output=out_cfg,
        tie_word_embeddings=tied,
    )
    ours = TransfoXLPretrained(random_module(TransformerXLLM, cfg, seed=5))
    export.export_model(ours, tmp_path / "out")
    hf = reload_hf(transformers.TransfoXLLMHeadModel, tmp_path / "out")
    ids = np.random.default_rng(5).integers(0, 60, (2, 6))
    err = maxdiff(ours(input_ids=ids).log_probs, hf_outputs(hf, {"input_ids": ids})["prediction_scores"])
    print(f"TXL output_layer=softmax tied={tied}: max|log_probs xlgen - HF| = {err:.2e}")
    assert err < TOL
    mos = dataclasses.replace(cfg, output_layer="mos", output={}, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="output_layer='mos'"):
        export.to_hf(nnx.eval_shape(lambda: TransformerXLLM(mos, rngs=nnx.Rngs(0))))


# ----------------------------------------------------------------------------------------------------------------
# XLNet
# ----------------------------------------------------------------------------------------------------------------

XLNET_HF = dict(
    vocab_size=37, d_model=16, n_layer=2, n_head=2, d_inner=24, dropout=0.0, summary_last_dropout=0.0, mem_len=None
)
XLNET_HF.update(start_n_top=3, end_n_top=2)


def xlnet_inputs(cls_name, rng, b=2, l=6):
    shape = (b, 3, l) if cls_name == "XLNetForMultipleChoice" else (b, l)
    ids = rng.integers(0, 37, shape)
    kw = {"input_ids": ids, "token_type_ids": rng.integers(0, 2, shape)}
    am = np.ones(shape, np.float32)
    am[..., 0, :2] = 0  # left padding in the first row
    kw["attention_mask"] = am
    if cls_name == "XLNetLMHeadModel":
        kw["perm_mask"] = (rng.random((b, l, l)) < 0.4).astype(np.float32)
        tm = np.zeros((b, 2, l), np.float32)
        tm[:, 0, 1] = tm[:, 1, 4] = 1
        kw["target_mapping"] = tm
    return kw


XLNET_FIELDS = {
    "XLNetLMHeadModel": ("logits",),
    "XLNetForSequenceClassification": ("logits",),
    "XLNetForMultipleChoice": ("logits",),
    "XLNetForTokenClassification": ("logits",),
    "XLNetForQuestionAnswering": ("start_top_log_probs", "end_top_log_probs", "cls_logits"),
}


@pytest.mark.parametrize(
    "cls_name,extra",
    [
        ("XLNetLMHeadModel", dict(attn_type="bi", ff_activation="gelu")),
        ("XLNetForSequenceClassification", dict(num_labels=3, ff_activation="relu")),
        ("XLNetForMultipleChoice", dict()),
        ("XLNetForTokenClassification", dict(num_labels=5)),
        ("XLNetForQuestionAnswering", dict()),
    ],
)
def test_xlnet_hf_to_xlgen_to_hf(tmp_path, cls_name, extra):
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    hf = randomize(cls(transformers.XLNetConfig(**XLNET_HF, **extra)).eval())
    hf.save_pretrained(tmp_path / "hf")
    ours = xlgen.from_pretrained(str(tmp_path / "hf"))
    assert ours.head == cls_name
    export.export_model(ours, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [cls_name]
    hf2 = reload_hf(cls, tmp_path / "out")
    check_state_dicts_equal(hf, hf2)
    kw = xlnet_inputs(cls_name, np.random.default_rng(0))
    ref, again = hf_outputs(hf, kw), hf_outputs(hf2, kw)
    for field in XLNET_FIELDS[cls_name]:
        assert maxdiff(ref[field], again[field]) == 0.0


def test_xlnet_xlgen_to_hf_to_xlgen_scanned_shared_biases(tmp_path):
    """An xlgen-only layout (scanned layers, one u/v/s shared by all layers) exports to an equivalent HF model."""
    from xlgen.models.xlnet import heads as XH
    from xlgen.models.xlnet import model as X
    from xlgen.models.xlnet.hf import XLNetFromHF

    cfg = X.XLNetConfig(
        vocab_size=37, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24, untie_r=False, scan_layers=True
    )
    cfg = dataclasses.replace(cfg, dropout=0.0, dropatt=0.0, num_labels=3, summary_last_dropout=0.0)
    module = random_module(XH.XLNetForSequenceClassification, cfg, seed=2)
    ours = XLNetFromHF(module, "XLNetForSequenceClassification", {})
    export.export_model(ours, tmp_path / "out")
    hf = reload_hf(transformers.XLNetForSequenceClassification, tmp_path / "out")
    kw = xlnet_inputs("XLNetForSequenceClassification", np.random.default_rng(2))
    err = maxdiff(ours(**kw)["logits"], hf_outputs(hf, kw)["logits"])
    assert_same_params(xlgen.from_pretrained(str(tmp_path / "out"), scan_layers=True), ours)
    print(f"XLNet xlgen->HF->xlgen (scanned, shared biases): max|logits xlgen - HF| = {err:.2e}; reload exact")
    assert err < TOL


def test_xlnet_pretrained_with_bi_data_exports_inference_semantics(tmp_path):
    """Issue 31: an XLNet pretrained with bi_data (half of each batch read backwards) exports `"bi_data": false`;
    with it on, HF's XLNet split a batch of 1 into 0 forward + 0 backward rows (logits of shape (0, l, V)). The
    export gives (1, l, V) logits equal to xlgen's own (forward) reading of the exported model."""
    from xlgen.models.xlnet import model as X
    from xlgen.models.xlnet.hf import XLNetFromHF

    cfg = X.XLNetConfig(vocab_size=37, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24, bi_data=True)
    cfg = dataclasses.replace(cfg, dropout=0.0, dropatt=0.0)
    module = random_module(X.XLNetLMHeadModel, cfg, seed=3)
    export.export_model(XLNetFromHF(module, "XLNetLMHeadModel", {}), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["bi_data"] is False
    hf = reload_hf(transformers.XLNetLMHeadModel, tmp_path / "out")
    ids = np.random.default_rng(3).integers(0, 37, (1, 9))
    logits = hf_outputs(hf, {"input_ids": ids})["logits"]
    assert logits.shape == (1, 9, 37)
    ours = xlgen.from_pretrained(str(tmp_path / "out"))(input_ids=ids).logits
    assert maxdiff(ours, logits) < TOL
    assert oct((tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    import os

    m = os.umask(0)
    os.umask(m)
    return m


# ----------------------------------------------------------------------------------------------------------------
# Funnel
# ----------------------------------------------------------------------------------------------------------------

FUNNEL_HF = dict(vocab_size=30, d_model=16, n_head=2, d_head=8, d_inner=32, hidden_dropout=0.0, attention_dropout=0.0)
FUNNEL_HF.update(activation_dropout=0.0)


def funnel_inputs(arch, rng, l=11):
    shape = (2, 3, l) if arch == "FunnelForMultipleChoice" else (2, l)
    ids = rng.integers(0, 30, shape)
    tt = np.zeros(shape, np.int64)
    tt[..., l // 2 :] = 1
    am = np.ones(shape, np.int64)
    am[..., -2:] = 0
    return {"input_ids": ids, "token_type_ids": tt, "attention_mask": am}


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("FunnelForMaskedLM", dict(block_sizes=[1, 1], num_decoder_layers=1)),
        ("FunnelForPreTraining", dict(block_sizes=[1, 2], block_repeats=[2, 1], num_decoder_layers=1)),
        ("FunnelForSequenceClassification", dict(block_sizes=[1, 1, 1], num_labels=3, attention_type="factorized")),
        ("FunnelForMultipleChoice", dict(block_sizes=[1, 1])),
        ("FunnelForTokenClassification", dict(block_sizes=[1, 1], num_decoder_layers=1, num_labels=5)),
        ("FunnelForQuestionAnswering", dict(block_sizes=[1, 1], num_decoder_layers=1)),
    ],
)
def test_funnel_hf_to_xlgen_to_hf(tmp_path, arch, extra):
    cls = getattr(transformers, arch)
    torch.manual_seed(0)
    hf = randomize(cls(transformers.FunnelConfig(**FUNNEL_HF, **extra)).eval())
    hf.save_pretrained(tmp_path / "hf")
    ours = xlgen.from_pretrained(str(tmp_path / "hf"), compiler_options=FAST)
    export.export_model(ours, tmp_path / "out")
    hf2 = reload_hf(cls, tmp_path / "out")
    check_state_dicts_equal(hf, hf2)
    kw = funnel_inputs(arch, np.random.default_rng(0))
    ref, again = hf_outputs(hf, kw), hf_outputs(hf2, kw)
    assert {"logits", "start_logits"} & set(ref)
    for field in ("logits", "start_logits", "end_logits"):
        if field in ref:
            assert maxdiff(ref[field], again[field]) == 0.0


def test_funnel_xlgen_to_hf_to_xlgen_and_unrepresentable_models(tmp_path):
    from xlgen.models.funnel import heads as FH
    from xlgen.models.funnel import model as F
    from xlgen.models.funnel.hf import HFFunnel

    cfg = F.FunnelConfig(
        vocab_size=30, block_sizes=(1, 1), num_decoder_layers=1, d_model=16, n_head=2, d_head=8, d_inner=32
    )
    cfg = dataclasses.replace(cfg, dropout=0.0, dropatt=0.0)
    module = random_module(FH.FunnelForQuestionAnswering, cfg, seed=3)
    ours = HFFunnel(module, "FunnelForQuestionAnswering", FAST)
    export.export_model(ours, tmp_path / "out")
    hf = reload_hf(transformers.FunnelForQuestionAnswering, tmp_path / "out")
    kw = funnel_inputs("FunnelForQuestionAnswering", np.random.default_rng(3))
    ref = hf_outputs(hf, kw)
    out = ours(kw["input_ids"], token_type_ids=kw["token_type_ids"], attention_mask=kw["attention_mask"])
    err = max(maxdiff(out.start_logits, ref["start_logits"]), maxdiff(out.end_logits, ref["end_logits"]))
    assert_same_params(xlgen.from_pretrained(str(tmp_path / "out"), compiler_options=FAST), ours)
    print(f"Funnel xlgen->HF->xlgen QA: max|logits xlgen - HF| = {err:.2e}; reload exact")
    assert err < TOL
    # models HF cannot represent are refused with the reason, never exported wrong
    with pytest.raises(ValueError, match="answerability"):
        export.to_hf(nnx.eval_shape(lambda: FH.FunnelForQuestionAnswering(cfg, answerability=True, rngs=nnx.Rngs(0))))
    shared = dataclasses.replace(cfg, block_sizes="2x2-1", hf_block1_residual=False)
    with pytest.raises(ValueError, match="block 1"):
        export.to_hf(nnx.eval_shape(lambda: F.FunnelForMaskedLM(shared, rngs=nnx.Rngs(0))))


def test_subword_tokenizer_files_encode_like_xlgen(tmp_path):
    """SentencePiece -> spiece.model (XLNetTokenizer) and WordPiece -> vocab.txt (FunnelTokenizer): transformers'
    tokenizers read from the exported files give xlgen's ids."""
    from data_pipelines import vocab as V
    from data_pipelines.corpus import EMBEDDED

    text = V.read_text(EMBEDDED["tinyshakespeare"]).splitlines()[:3000]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(text))
    sp = V.load_tokenizer("sentencepiece", V.train_sentencepiece([str(corpus)], str(tmp_path / "sp"), vocab_size=300))
    wp = V.load_tokenizer("wordpiece", V.train_wordpiece([str(corpus)], str(tmp_path / "wp"), vocab_size=300))
    sample = "ROMEO: But, soft! what light through yonder window breaks?"
    for tok, model_type, cls in ((sp, "xlnet", "XLNetTokenizer"), (wp, "funnel", "FunnelTokenizer")):
        out = tmp_path / model_type
        out.mkdir()
        export.write_tokenizer(tok, str(out), model_type)
        hf_tok = transformers.AutoTokenizer.from_pretrained(out, use_fast=False)
        assert type(hf_tok).__name__ == cls
        assert hf_tok.encode(sample, add_special_tokens=False) == list(tok.encode(sample)), model_type
