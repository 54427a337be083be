"""`xlgen export --to-stablehlo / --to-onnx` (xlgen/deploy/__init__.py): the deployed functions equal xlgen's.

Every finetuning head of XLNet and Funnel (classification, regression, multiple choice, token classification,
SQuAD 1.1 / 2.0 with answerability) and the Transformer-XL / XLNet language models with memory, tiny random models
built here once, exported with batch and length symbolic (no size is used at export time), run on batch 3 and
length 11, the language models over three segments with the memory carried, against xlgen's function (`jax.jit`):
* StableHLO: serialized by `jax.export`, deserialized and called in a fresh Python process that cannot import xlgen:
  equal within 1e-5.
* ONNX: the jaxpr translated (`xlgen.deploy.onnx_graph`), run by onnxruntime: equal within 1e-4.
* A pretraining-only (Funnel MLM) or GAN workdir is refused in one line naming what can be exported (exit 2),
  and nothing is written.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from xlgen import deploy
from xlgen.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL_STABLEHLO = 1e-5
TASKS = {  # task kind -> a task of that kind
    "classification": "glue/mrpc",
    "regression": "glue/stsb",
    "multiple_choice": "race",
    "token_classification": "conll2003",
    "squad": "squad/v1.1",
    "squad_v2": "squad/v2.0",
}
FINETUNE_CONFIGS = {"xlnet": "configs/finetune/tiny.py", "funnel": "configs/finetune/tiny_funnel.py"}
SMALL = {"vocab_size": 40, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 24}


def random_module(make, seed):
    """The module `make()` builds, with N(0, 0.3) parameters (LayerNorm scales around 1), no initialisers run."""
    from xlgen.models.xlnet import materialize

    rng = np.random.default_rng(seed)
    value = lambda name, shape: rng.normal(size=shape) * (0.1 if "norm" in name else 0.3) + name.endswith("scale")
    module = materialize(nnx.eval_shape(make), value)
    module.eval()
    return module


def finetune_served(family, task, seed):
    overrides = [f"task={task}", "data.max_seq_length=8", "data.eval_batch_size=2"]
    overrides += [f"model.{k}={v}" for k, v in SMALL.items()]
    if family == "xlnet":
        overrides += ["model.start_n_top=3", "model.end_n_top=2"]
    config = load_config(os.path.join(REPO, FINETUNE_CONFIGS[family]), [f"--config.{o}" for o in overrides])
    from xlgen.finetune.objective import FINETUNE

    module = random_module(lambda: FINETUNE.make_model(config, nnx.Rngs(seed), False), seed)
    return deploy.served_module(config, module, kind_of_run="finetune")


def lm_served(config_file, seed, data, **model):
    from xlgen import registry

    overrides = [f"model.{k}={v}" for k, v in model.items()] + [f"data.{k}={v}" for k, v in data.items()]
    config = load_config(os.path.join(REPO, config_file), [f"--config.{o}" for o in overrides])
    module = random_module(lambda: registry.objective(config).make_model(config, nnx.Rngs(seed), False), seed)
    return deploy.served_module(config, module, kind_of_run="pretrain")


def cases():
    out = {}
    for family in ("xlnet", "funnel"):
        for kind, task in TASKS.items():
            out[f"{family}-{kind}"] = lambda family=family, task=task, s=len(out): finetune_served(family, task, s)
    out["transformer_xl-lm"] = lambda: lm_served(
        "configs/pretrain/txl_tiny.py",
        20,
        {"eval_batch_size": 2, "eval_tgt_len": 5},
        n_layer=2,
        mem_len=6,
        d_embed=16,
        **SMALL,
    )
    out["xlnet-lm"] = lambda: lm_served(
        "configs/pretrain/xlnet_tiny.py", 21, {"eval_batch_size": 2}, n_layer=2, mem_len=6, **SMALL
    )
    return out


def new_sizes(axes, served):
    """A batch size and length never used at export time (the length only where its axis is symbolic)."""
    return {"batch": 3, "length": max(11, served.min_length) if axes["length"] == "symbolic" else axes["length"]}


@pytest.fixture(scope="module")
def built():
    """Every case's deployed function, built once."""
    return {name: build() for name, build in cases().items()}


def xlgen_outputs(served, arrays, segments):
    """xlgen's outputs per segment (language models: the memory carried from one segment to the next)."""
    import jax

    fn = jax.jit(served.fn)
    outs, arrays = [], list(arrays)
    for seg in range(segments):
        out = [np.asarray(o) for o in fn(*arrays)]
        outs.append(out)
        if served.kind == "language_model" and len(arrays) > 1:
            arrays = [served.example(dict(zip(("batch", "length"), arrays[0].shape)), seed=seg + 1)[0]] + out[1:]
    return outs


STANDALONE = r"""
import json, os, sys


class NoXlgen:  # the deployment process: xlgen and its packages are not importable (the venv has xlgen installed)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("xlgen", "data_pipelines", "configs"):
            raise ImportError(f"{name}: not available in the deployment process")


sys.meta_path.insert(0, NoXlgen())
import numpy as np
import jax
from jax import export
jax.config.update("jax_enable_x64", False)
root = sys.argv[1]
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    exp = export.deserialize(bytearray(open(os.path.join(d, "model.stablehlo"), "rb").read()))
    io = json.load(open(os.path.join(d, "io.json")))
    data = np.load(os.path.join(d, "inputs.npz"))
    arrays = [data[s["name"]] for s in io["inputs"]]
    results = {}
    for seg in range(int(data["segments"])):
        if seg:
            arrays = [data[f"input_ids_{seg}"]] + out[1:]
        out = [np.asarray(o) for o in exp.call(*arrays)]
        for o, spec in zip(out, io["outputs"]):
            results[f"{spec['name']}_{seg}"] = o
    np.savez(os.path.join(d, "outputs.npz"), **results)
assert not [m for m in sys.modules if m.split(".")[0] in ("xlgen", "data_pipelines")]
print("ran", len(os.listdir(root)))
"""


@pytest.fixture(scope="module")
def stablehlo_runs(tmp_path_factory, built):
    """Every case exported to StableHLO, its new-size inputs saved, xlgen's outputs computed, then one fresh process
    (no xlgen on its path) runs every artefact."""
    root = tmp_path_factory.mktemp("stablehlo")
    expected, axes_of = {}, {}
    for name, served in built.items():
        exported, axes = deploy.export_stablehlo(served)
        axes_of[name] = axes
        d = root / name
        d.mkdir()
        (d / "model.stablehlo").write_bytes(bytes(exported.serialize()))
        shapes = [(a.shape, np.dtype(a.dtype).name) for a in exported.out_avals]
        deploy.write_json(str(d / "io.json"), deploy.io_description(served, "stablehlo", axes, shapes, []))
        sizes = new_sizes(axes, served)
        arrays = served.example(sizes, seed=7)
        segments = 3 if served.kind == "language_model" else 1
        expected[name] = xlgen_outputs(served, arrays, segments)
        feed = {s.name: a for s, a in zip(served.inputs, arrays)}
        feed.update({f"input_ids_{k}": served.example(sizes, seed=k)[0] for k in range(1, segments)})
        np.savez(d / "inputs.npz", segments=segments, **feed)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    p = subprocess.run(
        [sys.executable, "-c", STANDALONE, str(root)], cwd=str(root), env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return root, expected, axes_of


@pytest.mark.parametrize("name", list(cases()))
def test_stablehlo_in_a_process_without_xlgen_equals_xlgen(stablehlo_runs, name):
    root, expected, axes_of = stablehlo_runs
    io = json.loads((root / name / "io.json").read_text())
    assert axes_of[name] == {"batch": "symbolic", "length": "symbolic"}
    assert io["inputs"][0]["shape"][0] == "batch"
    got = np.load(root / name / "outputs.npz")
    errs = []
    for seg, outs in enumerate(expected[name]):
        for spec, want in zip(io["outputs"], outs):
            have = got[f"{spec['name']}_{seg}"]
            assert have.shape == want.shape and have.dtype == want.dtype, spec
            errs.append(float(np.max(np.abs(have.astype(np.float64) - want))) if want.size else 0.0)
    print(f"{name}: axes {axes_of[name]}, {len(expected[name])} segment(s), max |StableHLO - xlgen| = {max(errs):.1e}")
    assert max(errs) <= TOL_STABLEHLO


# ----------------------------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config_file,overrides",
    [("configs/pretrain/funnel_tiny.py", []), ("configs/gan/cegan.py", [])],
    ids=["funnel_mlm", "cegan"],
)
@pytest.mark.parametrize("flag", ["--to-onnx", "--to-stablehlo"])
def test_pretraining_only_and_gan_workdirs_are_refused_writing_nothing(tmp_path, capsys, config_file, overrides, flag):
    from xlgen.interop import export
    from xlgen.train.workdir import Workdir

    wd = tmp_path / "wd"
    Workdir(str(wd)).write_config(load_config(os.path.join(REPO, config_file), overrides), kind="pretrain")
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(wd))
    rc = export.main(["--workdir", str(wd), flag, str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "exportable: finetuned heads of" in err and "language models of" in err
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(wd))) == before


# ----------------------------------------------------------------------------------------------------------------
# ONNX (the jaxpr translated; onnxruntime runs it)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(cases()))
def test_onnx_graph_equals_xlgen_at_new_shapes(stablehlo_runs, built, name):
    """The ONNX graph of every case (traced with symbolic batch and length) run by onnxruntime at batch 3, length 11,
    the language models over three segments with `new_mems` / `new_mem_valid` fed back: xlgen's outputs within
    1e-4; inputs, outputs and their symbolic axes as io.json describes them."""
    ort = pytest.importorskip("onnxruntime")
    from xlgen.deploy import onnx_graph

    _, expected, axes_of = stablehlo_runs
    served = built[name]
    payload, axes, shapes = onnx_graph.export_onnx(served, verify=False)
    assert axes == {"batch": "symbolic", "length": "symbolic"}
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    out_names = onnx_graph.output_names(served)
    assert [i.name for i in session.get_inputs()] == [s.name for s in served.inputs]
    assert [o.name for o in session.get_outputs()] == out_names
    assert [list(i.shape) for i in session.get_inputs()] == [list(s.shape) for s in served.inputs]
    io = deploy.io_description(served, "onnx", axes, shapes, [])
    assert [o["shape"] for o in io["outputs"]] == [list(o.shape) for o in session.get_outputs()]
    arrays = served.example(new_sizes(axes, served), seed=7)
    feed = {s.name: a for s, a in zip(served.inputs, arrays)}
    errs, got = [], []
    for seg, want in enumerate(expected[name]):
        if seg:  # the next segment with the memory the graph returned
            ids = served.example({"batch": 3, "length": arrays[0].shape[1]}, seed=seg)[0]
            feed = {"input_ids": ids, "mems": got[1], "mem_valid": got[2]}
        got = session.run(None, feed)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            errs.append(0.0 if w.dtype.kind in "iub" and np.array_equal(g, w) else float(np.max(np.abs(g - w))))
    print(
        f"{name}: min_length {served.min_length}, {len(expected[name])} segment(s), max |onnxruntime - xlgen| = {max(errs):.1e}"
    )
    assert max(errs) <= onnx_graph.TOLERANCE


@pytest.mark.parametrize(
    "config_file, data",
    [
        ("configs/pretrain/txl_tiny.py", {"eval_batch_size": 2, "eval_tgt_len": 5}),
        ("configs/pretrain/xlnet_tiny.py", {"eval_batch_size": 2}),
    ],
    ids=["transformer_xl", "xlnet"],
)
def test_a_scanned_language_model_exports_as_its_unrolled_equal(config_file, data):
    """A model trained with `scan_layers=True` (the paper-sized configs) exports through its unrolled equal
    (`deploy.unrolled`): the served function equals the scanned module's own (run eagerly), and traces with
    batch and length symbolic for both formats (onnxruntime checked against xlgen inside `export_onnx`)."""
    import jax

    from xlgen import registry

    overrides = [f"model.{k}={v}" for k, v in {**SMALL, "n_layer": 3, "mem_len": 6, "scan_layers": True}.items()]
    overrides += [f"data.{k}={v}" for k, v in data.items()]
    config = load_config(os.path.join(REPO, config_file), [f"--config.{o}" for o in overrides])
    module = random_module(lambda: registry.objective(config).make_model(config, nnx.Rngs(5), False), 5)
    family = registry.get(config.model.family)
    scanned = family.record(deploy.Stream).prepare(module)
    direct = deploy._served_stream(config, family, *nnx.split(scanned), scanned)
    served = deploy.served_module(config, module, kind_of_run="pretrain")
    args = served.example({"batch": 2, "length": 7}, seed=3)
    for a, b in zip(direct.fn(*args), jax.jit(served.fn)(*args)):  # the scanned stack run eagerly
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
    _, axes = deploy.export_stablehlo(served)
    assert axes == {"batch": "symbolic", "length": "symbolic"}
    from xlgen.deploy import onnx_graph

    onnx_graph.export_onnx(served)  # raises when onnxruntime differs from xlgen by more than 1e-4


def test_onnx_rules_beyond_the_models_equal_jax():
    """Rules the model cases do not reach (a scan, unrolled; reverse, cumulative sum, argmax / argmin, dynamic slice
    and update, negative padding, clamp, integer power, integer division and remainder, an integer `select_n`,
    boolean reductions, split / unstack, ...), traced with symbolic batch and length: onnxruntime equals `jax.jit`
    at two new shapes."""
    ort = pytest.importorskip("onnxruntime")
    import jax
    import jax.numpy as jnp

    from xlgen.deploy import onnx_graph

    def fn(x, n):
        def body(carry, xs):
            return carry * 0.5 + xs, xs.sum(-1)

        carry, ys = jax.lax.scan(body, jnp.zeros_like(x), jnp.stack([x, 2 * x, x * x]))
        first = jnp.argmax(x, axis=1).astype(jnp.int32)
        window = jax.lax.dynamic_slice_in_dim(x, first[0], 2, axis=1)
        padded = jax.lax.pad(x, 0.0, ((0, 0, 0), (2, -1, 0)))
        ints = (n // 3) * 7 + jax.lax.rem(n, 4) - (n[:, ::-1] % 5) + jnp.argmin(x, axis=1)[:, None]
        updated = jax.lax.dynamic_update_slice_in_dim(x, jnp.ones_like(x[:, :2]), first[-1], axis=1)
        picked = jax.lax.select_n(jnp.abs(n) % 3, x, jnp.exp2(x), jnp.expm1(x)) * jnp.sign(x) + jnp.log1p(x * x)
        flags = jnp.any(x > 1, axis=1) ^ jnp.isfinite(x).all(axis=1)
        a, b = jnp.unstack(jnp.stack([x, 2 * x]), axis=0)
        parts = jnp.split(jnp.concatenate([a, b, a * b], axis=0), 3, axis=0)
        rest = (parts[2] - parts[1], jnp.prod(jnp.clip(x, 0.5, 1.5), axis=1))
        outs = (carry, ys, jnp.cumsum(x[:, ::-1], axis=1), first, window, padded, jnp.clip(x, -0.5, 0.5) ** 3, ints)
        return outs + (updated, picked, flags) + rest

    served = deploy.Served(
        kind="test",
        fn=fn,
        inputs=[
            deploy.TensorSpec("x", ("batch", "length"), "float32"),
            deploy.TensorSpec("n", ("batch", "length"), "int32"),
        ],
        outputs=["carry", "ys", "cumsum", "first", "window", "padded", "clipped", "ints", "updated", "picked", "flags"]
        + ["split", "prod"],
        trained={"batch": 2, "length": 8},
        family="none",
    )
    payload, axes, _ = onnx_graph.export_onnx(served, verify=False)
    assert axes == {"batch": "symbolic", "length": "symbolic"}
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, length in ((3, 5), (1, 12)):
        x = rng.normal(size=(b, length)).astype(np.float32)
        n = rng.integers(-20, 20, (b, length)).astype(np.int32)
        want = [np.asarray(o) for o in jax.jit(fn)(x, n)]
        got = session.run(None, {"x": x, "n": n})
        for name, g, w in zip(served.outputs, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            assert np.allclose(g, w, atol=1e-5, rtol=0), (name, g, w)
