"""`xlgen convert --from-tf`: the original TensorFlow releases' checkpoints, read without TensorFlow.

Each test writes a small TF checkpoint (TensorFlow's own SaveV2 writer, the V2 tensor-bundle format of the
releases) holding random weights under the variable names of the original code (zihangdai/xlnet modeling.py,
laiguokun/Funnel-Transformer tensorflow/modeling.py, kimiyoung/transformer-xl tf/model.py), plus the extras a real
checkpoint carries (global_step, optimizer slots, the ELECTRA generator), then
* converts it with `xlgen convert` and loads the result with `xlgen.from_pretrained`, and
* loads it into the Hugging Face PyTorch model with transformers 4.34.1's own TF loaders
  (`load_tf_weights_in_xlnet` / `_funnel` / `_transfo_xl`),
and checks that both give the same outputs (<= 1e-5). The reader itself is checked against `tf.train.load_checkpoint`
on every dtype. Needs the `tf` extra (TensorFlow) and the `parity` extra (torch, transformers).
"""

import json

import numpy as np
import pytest

import xlgen
from xlgen.interop import convert
from xlgen.interop.tf_checkpoint import CheckpointError, TFCheckpoint

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5


def save_tf(prefix, variables):
    """A TF checkpoint at `prefix` holding {name: array} (bfloat16 given as ("bfloat16", float32 array))."""
    names = sorted(variables)
    tensors = []
    for n in names:
        v = variables[n]
        tensors.append(tf.cast(tf.constant(v[1]), tf.bfloat16) if isinstance(v, tuple) else tf.constant(v))
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    return str(prefix)


def rand(rng, *shape, ln=False):
    x = rng.normal(size=shape).astype(np.float32)
    return (1.0 + 0.1 * x) if ln else 0.3 * x


def extras(rng, variables):
    """What a training checkpoint carries besides the model: global_step and Adam slots."""
    out = dict(variables)
    out["global_step"] = np.int64(1000)
    for name in list(variables)[:3]:
        out[name + "/Adam"] = np.zeros_like(variables[name])
        out[name + "/Adam_1"] = np.zeros_like(variables[name])
    return out


def run_convert(tmp_path, prefix, family, hf_config: dict, name="out"):
    cfg = tmp_path / f"{name}_config.json"
    cfg.write_text(json.dumps(hf_config))
    out = tmp_path / name
    rc = convert.main([f"--from-tf={prefix}", f"--family={family}", f"--config={cfg}", f"--out={out}"])
    assert rc == 0
    return str(out)


def hf_and_ours(tmp_path, prefix, family, hf_cfg, hf_model, tf_loader):
    """(the HF model loaded by transformers' TF loader, xlgen.from_pretrained of `xlgen convert`'s output)."""
    tf_loader(hf_model, hf_cfg, prefix)
    return hf_model.eval(), xlgen.from_pretrained(run_convert(tmp_path, prefix, family, hf_cfg.to_dict()))


def norms_and_ffn(rng, p, d, di, attn="rel_attn/LayerNorm", ff="ff/LayerNorm"):
    """A layer's two LayerNorms and its FFN under the original names (`p` = the layer's scope)."""
    v = {}
    for norm in (attn, ff):
        v[p + norm + "/gamma"], v[p + norm + "/beta"] = rand(rng, d, ln=True), rand(rng, d)
    v[p + "ff/layer_1/kernel"], v[p + "ff/layer_1/bias"] = rand(rng, d, di), rand(rng, di)
    v[p + "ff/layer_2/kernel"], v[p + "ff/layer_2/bias"] = rand(rng, di, d), rand(rng, d)
    return v


def close(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = float(np.max(np.abs(a - b)))
    print(f"max abs diff {diff:.2e}")
    assert diff <= TOL, diff


# ----------------------------------------------------------------------------------------------------------------
# The reader
# ----------------------------------------------------------------------------------------------------------------


def test_reader_matches_tensorflow_on_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    variables = {
        "a/float32": rand(rng, 3, 4, 5),
        "a/float64": rng.normal(size=(7,)),
        "a/int32": rng.integers(-5, 5, (2, 3)).astype(np.int32),
        "a/int64": np.int64(123456789012),
        "a/float16": rng.normal(size=(4,)).astype(np.float16),
        "a/bool": np.array([True, False, True]),
        "a/uint8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "a/bfloat16": ("bfloat16", rand(rng, 2, 2)),
        "a/empty": np.zeros((0, 3), np.float32),
    }
    # enough entries for several index-table blocks (TensorFlow cuts blocks at ~4 KB of keys/values)
    variables.update({f"model/transformer/layer_{i}/rel_attn/q/kernel": rand(rng, 2, 3) for i in range(300)})
    prefix = save_tf(tmp_path / "model.ckpt-7", variables)
    ours = TFCheckpoint(prefix)
    ref = tf.train.load_checkpoint(prefix)
    assert ours.names() == sorted(n for n, _ in tf.train.list_variables(prefix))
    for name in ours.names():
        want = ref.get_tensor(name)
        got = ours[name]
        if name == "a/bfloat16":
            assert got.dtype == np.float32
            want = np.asarray(want, np.float32)
        else:
            assert got.dtype == want.dtype, name
        assert got.shape == want.shape == ours.shape(name), name
        np.testing.assert_array_equal(got, want, err_msg=name)
    # a directory with one checkpoint, and the PREFIX.index path, name the same checkpoint
    assert TFCheckpoint(str(tmp_path)).prefix == prefix == TFCheckpoint(prefix + ".index").prefix


def test_reader_errors_name_the_file(tmp_path):
    prefix = save_tf(tmp_path / "ckpt", {"w": np.arange(1000, dtype=np.float32)})
    with pytest.raises(FileNotFoundError, match="nope.index"):
        TFCheckpoint(str(tmp_path / "nope"))
    data = tmp_path / "ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    pytest.importorskip("google_crc32c")
    with pytest.raises(CheckpointError, match="checksum mismatch for variable 'w'"):
        TFCheckpoint(prefix)["w"]
    (tmp_path / "bad.index").write_bytes(b"not a table" * 10)
    with pytest.raises(CheckpointError, match="bad.index: not a TensorFlow checkpoint index"):
        TFCheckpoint(str(tmp_path / "bad"))


# ----------------------------------------------------------------------------------------------------------------
# XLNet
# ----------------------------------------------------------------------------------------------------------------

XLNET = dict(vocab_size=37, d_model=16, n_layer=2, n_head=2, d_inner=24, ff_activation="gelu", untie_r=True)
XLNET.update(dropout=0.0, mem_len=None)


def xlnet_tf_variables(rng, c=XLNET, shared_biases=False):
    """Random weights under zihangdai/xlnet's variable names (modeling.py: transformer_xl + lm_loss)."""
    V, d, L, n, di = c["vocab_size"], c["d_model"], c["n_layer"], c["n_head"], c["d_inner"]
    dh = d // n
    t = "model/transformer/"
    v = {t + "word_embedding/lookup_table": rand(rng, V, d), t + "mask_emb/mask_emb": rand(rng, 1, 1, d)}
    lead = () if shared_biases else (L,)
    for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
        v[t + name] = rand(rng, *lead, n, dh)
    v[t + "seg_embed"] = rand(rng, L, 2, n, dh)
    for i in range(L):
        p = f"{t}layer_{i}/"
        for name in "qkvro":
            v[p + f"rel_attn/{name}/kernel"] = rand(rng, d, n, dh)
        v.update(norms_and_ffn(rng, p, d, di))
    v["model/lm_loss/bias"] = rand(rng, V)
    return v


def xlnet_inputs(rng, b=2, l=6):
    am = np.ones((b, l), np.float32)
    am[0, :2] = 0
    tm = np.zeros((b, 2, l), np.float32)
    tm[:, 0, 1] = tm[:, 1, 4] = 1
    return {
        "input_ids": rng.integers(0, XLNET["vocab_size"], (b, l)),
        "token_type_ids": rng.integers(0, 2, (b, l)),
        "attention_mask": am,
        "perm_mask": (rng.random((b, l, l)) < 0.4).astype(np.float32),
        "target_mapping": tm,
    }


def test_xlnet_checkpoint_converts_like_hf(tmp_path):
    rng = np.random.default_rng(1)
    prefix = save_tf(tmp_path / "xlnet_model.ckpt", extras(rng, xlnet_tf_variables(rng)))
    hf_cfg = transformers.XLNetConfig(**XLNET)
    load = transformers.models.xlnet.modeling_xlnet.load_tf_weights_in_xlnet
    hf, ours = hf_and_ours(tmp_path, prefix, "xlnet", hf_cfg, transformers.XLNetLMHeadModel(hf_cfg), load)
    assert type(ours.model).__name__ == "XLNetLMHeadModel"
    kw = xlnet_inputs(rng)
    with torch.no_grad():
        want = hf(**{k: torch.tensor(x) for k, x in kw.items()}).logits.numpy()
    close(ours(**kw).logits, want)
    # the release's own xlnet_config.json names the same architecture
    release = {k: XLNET[k] for k in ("d_model", "n_layer", "n_head", "d_inner", "ff_activation", "untie_r")}
    (tmp_path / "xlnet_config.json").write_text(json.dumps(dict(release, n_token=37, d_head=8)))
    args = ["--family=xlnet", f"--config={tmp_path / 'xlnet_config.json'}", f"--out={tmp_path / 'o2'}"]
    assert convert.main([f"--from-tf={prefix}"] + args) == 0
    close(xlgen.from_pretrained(str(tmp_path / "o2"))(**kw).logits, want)


def test_xlnet_shared_biases_equal_per_layer_copies(tmp_path):
    """untie_r=False checkpoints ([n, dh] biases) load as every layer holding the shared bias."""
    rng = np.random.default_rng(2)
    shared = xlnet_tf_variables(rng, shared_biases=True)
    copied = dict(shared)
    for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
        copied["model/transformer/" + name] = np.stack([shared["model/transformer/" + name]] * XLNET["n_layer"])
    a = run_convert(tmp_path, save_tf(tmp_path / "shared", shared), "xlnet", dict(XLNET, model_type="xlnet"), "a")
    b = run_convert(tmp_path, save_tf(tmp_path / "copied", copied), "xlnet", dict(XLNET, model_type="xlnet"), "b")
    kw = xlnet_inputs(rng)
    np.testing.assert_array_equal(xlgen.from_pretrained(a)(**kw).logits, xlgen.from_pretrained(b)(**kw).logits)


# ----------------------------------------------------------------------------------------------------------------
# Funnel-Transformer
# ----------------------------------------------------------------------------------------------------------------

FUNNEL = dict(vocab_size=30, d_model=16, n_head=2, d_head=8, d_inner=24, block_sizes=[2, 1], block_repeats=[1, 2])
FUNNEL.update(num_decoder_layers=1, hidden_act="gelu_new", hidden_dropout=0.0, attention_dropout=0.0)
FUNNEL.update(activation_dropout=0.0)


def funnel_layer(rng, p, d=16, n=2, dh=8, di=24):
    a = p + "rel_attn/"
    v = {a + f"{x}/kernel": rand(rng, d, n, dh) for x in "qkvr"}
    v.update({a + "k/bias": rand(rng, n, dh), a + "v/bias": rand(rng, n, dh)})
    v.update({a + "o/kernel": rand(rng, n, dh, d), a + "o/bias": rand(rng, d)})
    v.update({a + x: rand(rng, n, dh) for x in ("r_w_bias", "r_r_bias", "r_s_bias")})
    v[a + "seg_embed"] = rand(rng, 2, n, dh)
    v.update(norms_and_ffn(rng, p, d, di, attn="rel_attn/layer_norm", ff="ff/layer_norm"))
    return v


def funnel_tf_variables(rng, decoder=True, electra=False):
    """Random weights under laiguokun/Funnel-Transformer's variable names (encoder layers numbered over the
    blocks' parameter layers, decoder layers after them); the ELECTRA generator's variables ride along."""
    v = {
        "model/input/word_embedding/lookup_table": rand(rng, 30, 16),
        "model/input/layer_norm/gamma": rand(rng, 16, ln=True),
        "model/input/layer_norm/beta": rand(rng, 16),
        "generator/input/word_embedding/lookup_table": rand(rng, 30, 8),
    }
    for g in range(3):  # block_sizes [2, 1]: parameter layers 0, 1 | 2
        v.update(funnel_layer(rng, f"model/encoder/layer_{g}/"))
    if decoder:
        v.update(funnel_layer(rng, "model/decoder/layer_3/"))
    if electra:
        v["model/binary_proj/dense/kernel"], v["model/binary_proj/dense/bias"] = rand(rng, 16, 16), rand(rng, 16)
        v["model/binary_loss/weight"], v["model/binary_loss/bias"] = rand(rng, 16), rand(rng, 1)
    return v


def funnel_inputs(rng, l=11):
    tt = np.zeros((2, l), np.int64)
    tt[:, l // 2 :] = 1
    am = np.ones((2, l), np.int64)
    am[:, -2:] = 0
    return {"input_ids": rng.integers(0, 30, (2, l)), "token_type_ids": tt, "attention_mask": am}


@pytest.mark.parametrize("arch", ["FunnelModel", "FunnelBaseModel", "FunnelForPreTraining"])
def test_funnel_checkpoint_converts_like_hf(tmp_path, arch):
    rng = np.random.default_rng(3)
    v = funnel_tf_variables(rng, decoder=arch != "FunnelBaseModel", electra=arch == "FunnelForPreTraining")
    prefix = save_tf(tmp_path / "model.ckpt", extras(rng, v))
    hf_cfg = transformers.FunnelConfig(**FUNNEL)
    hf = getattr(transformers, arch)(hf_cfg)
    load = transformers.models.funnel.modeling_funnel.load_tf_weights_in_funnel
    if arch == "FunnelForPreTraining":  # HF's loader reads the body; the ELECTRA head by hand (torch layout)
        load(hf.funnel, hf_cfg, prefix)
        head = hf.discriminator_predictions
        with torch.no_grad():
            head.dense.weight.copy_(torch.tensor(v["model/binary_proj/dense/kernel"].T))
            head.dense.bias.copy_(torch.tensor(v["model/binary_proj/dense/bias"]))
            head.dense_prediction.weight.copy_(torch.tensor(v["model/binary_loss/weight"][None]))
            head.dense_prediction.bias.copy_(torch.tensor(v["model/binary_loss/bias"]))
    else:
        load(hf, hf_cfg, prefix)
    hf.eval()
    out = run_convert(tmp_path, prefix, "funnel", hf_cfg.to_dict())
    ours = xlgen.from_pretrained(out)
    assert type(ours.module).__name__ == arch
    kw = funnel_inputs(rng)
    with torch.no_grad():
        want = hf(**{k: torch.tensor(x) for k, x in kw.items()})
    got = ours(**kw)
    field = "logits" if arch == "FunnelForPreTraining" else "last_hidden_state"
    close(getattr(got, field), getattr(want, field).numpy())
    if arch == "FunnelModel":  # the release's net_config.json names the same architecture
        release = dict(block_size="2_1x2", decoder_size="1", vocab_size=30, d_embed=16, d_model=16, n_head=2)
        release.update(d_head=8, d_inner=24, ff_activation="gelu", rel_attn_type="rel_shift", dropout=0.0)
        (tmp_path / "net_config.json").write_text(json.dumps(release))
        args = [f"--from-tf={prefix}", "--family=funnel", f"--config={tmp_path / 'net_config.json'}"]
        assert convert.main(args + [f"--out={tmp_path / 'o2'}"]) == 0
        close(xlgen.from_pretrained(str(tmp_path / "o2"))(**kw).last_hidden_state, want.last_hidden_state.numpy())


# ----------------------------------------------------------------------------------------------------------------
# Transformer-XL
# ----------------------------------------------------------------------------------------------------------------

TXL = dict(vocab_size=40, cutoffs=[10, 20], div_val=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=24)
TXL.update(n_layer=2, mem_len=4, clamp_len=-1, same_length=False, untie_r=True, dropout=0.0, dropatt=0.0)


def txl_tf_variables(rng, c=TXL):
    """Random weights under kimiyoung/transformer-xl's tf/model.py names: mask_adaptive_embedding_lookup /
    mask_adaptive_logsoftmax with div_val > 1 (per-cluster tables and projections; cluster 0's softmax
    projection untied, the tails' tied, as the WT103 release: proj_share_all_but_first)."""
    d, n, dh, di, L = c["d_model"], c["n_head"], c["d_head"], c["d_inner"], c["n_layer"]
    ends = [0] + c["cutoffs"] + [c["vocab_size"]]
    t = "transformer/"
    v = {t + "r_w_bias": rand(rng, L, n, dh), t + "r_r_bias": rand(rng, L, n, dh)}
    for k in range(len(ends) - 1):
        d_emb = c["d_embed"] // c["div_val"] ** k
        v[t + f"adaptive_embed/cutoff_{k}/lookup_table"] = rand(rng, ends[k + 1] - ends[k], d_emb)
        v[t + f"adaptive_embed/cutoff_{k}/proj_W"] = rand(rng, d_emb, d)
        v[t + f"adaptive_softmax/cutoff_{k}/b"] = rand(rng, ends[k + 1] - ends[k])
    v[t + "adaptive_softmax/cutoff_0/proj"] = rand(rng, c["d_embed"], d)
    v[t + "adaptive_softmax/cutoff_0/cluster_W"] = rand(rng, len(c["cutoffs"]), c["d_embed"])
    v[t + "adaptive_softmax/cutoff_0/cluster_b"] = rand(rng, len(c["cutoffs"]))
    for i in range(L):
        p = f"{t}layer_{i}/"
        v[p + "rel_attn/qkv/kernel"] = rand(rng, d, 3 * n * dh)
        v[p + "rel_attn/r/kernel"] = rand(rng, d, n * dh)
        v[p + "rel_attn/o/kernel"] = rand(rng, n * dh, d)
        v.update(norms_and_ffn(rng, p, d, di))
    return v


def test_transformer_xl_checkpoint_converts_like_hf(tmp_path):
    rng = np.random.default_rng(4)
    prefix = save_tf(tmp_path / "model.ckpt-0", extras(rng, txl_tf_variables(rng)))
    hf_cfg = transformers.TransfoXLConfig(**TXL)
    load = transformers.models.transfo_xl.modeling_transfo_xl.load_tf_weights_in_transfo_xl
    hf, ours = hf_and_ours(tmp_path, prefix, "transformer_xl", hf_cfg, transformers.TransfoXLLMHeadModel(hf_cfg), load)
    ids = rng.integers(0, TXL["vocab_size"], (2, 12))
    mems_hf = mems_ours = None
    for seg in (ids[:, :6], ids[:, 6:]):  # two segments: the second attends to the first's memory
        with torch.no_grad():
            want = hf(input_ids=torch.tensor(seg), mems=mems_hf)
        got = ours(input_ids=seg, mems=mems_ours)
        close(got.log_probs, want.prediction_scores.numpy())
        mems_hf, mems_ours = want.mems, got.mems


def test_convert_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    rng = np.random.default_rng(5)
    v = xlnet_tf_variables(rng)
    del v["model/transformer/layer_1/ff/layer_2/bias"]
    prefix = save_tf(tmp_path / "broken", v)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(XLNET, model_type="xlnet")))
    out = tmp_path / "out"
    args = [f"--from-tf={prefix}", "--family=xlnet", f"--config={cfg}", f"--out={out}"]
    assert convert.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "model/transformer/layer_1/ff/layer_2/bias" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert convert.main([f"--from-tf={tmp_path / 'missing'}"] + args[1:]) == 2
    assert "missing.index: no such file" in capsys.readouterr().err
    cfg.write_text(json.dumps(dict(XLNET, model_type="funnel")))
    assert convert.main(args) == 2
    assert "model_type='funnel', expected 'xlnet'" in capsys.readouterr().err
    assert not out.exists()
