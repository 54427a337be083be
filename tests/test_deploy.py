"""`xlgen export --to-stablehlo / --to-onnx` (xlgen/deploy/__init__.py): the deployed functions equal xlgen's.

* StableHLO: every finetuning head of XLNet and Funnel (classification, regression, multiple choice, token
  classification, SQuAD 1.1 / 2.0 with answerability) and the Transformer-XL / XLNet language models with memory,
  tiny random models built here, serialized by `jax.export`, deserialized and called in a fresh Python process
  that cannot import xlgen, on a batch size (and, where the length axis is symbolic, a length) never used at
  export time, the language models over three segments with the memory carried: equal to xlgen's within 1e-5.
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


def new_sizes(axes):
    """A batch size never used at export time, and a new length where the length axis is symbolic."""
    return {"batch": 3, "length": 11 if axes["length"] == "symbolic" else axes["length"]}


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
def stablehlo_runs(tmp_path_factory):
    """Every case exported to StableHLO, its new-size inputs saved, xlgen's outputs computed, then one fresh process
    (no xlgen on its path) runs every artefact."""
    root = tmp_path_factory.mktemp("stablehlo")
    expected, axes_of = {}, {}
    for name, build in cases().items():
        served = build()
        exported, axes = deploy.export_stablehlo(served)
        axes_of[name] = axes
        d = root / name
        d.mkdir()
        (d / "model.stablehlo").write_bytes(bytes(exported.serialize()))
        shapes = [(a.shape, np.dtype(a.dtype).name) for a in exported.out_avals]
        deploy.write_json(str(d / "io.json"), deploy.io_description(served, "stablehlo", axes, shapes, []))
        sizes = new_sizes(axes)
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
    assert axes_of[name]["batch"] == "symbolic"
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
# ONNX (finetuned heads, through the Hugging Face export and torch.onnx; onnxruntime checks)
# ----------------------------------------------------------------------------------------------------------------

ONNX_CASES = [n for n in cases() if not n.endswith("-lm")]
# heads whose transformers graph keeps its shapes symbolic under torch.onnx; the others' graphs hold the traced
# length (Funnel's pooling, XLNet's beam search) or have no HF class (Funnel's answerability head): refused
ONNX_EXACT = {"xlnet-classification", "xlnet-regression", "xlnet-multiple_choice", "xlnet-token_classification"}


@pytest.mark.parametrize("name", ONNX_CASES)
def test_onnx_head_equals_xlgen_at_new_shapes_or_is_refused(name):
    """An exported graph equals xlgen's function within 1e-4 at a batch size and length used neither to trace it
    (2 x 8) nor by the export's own check (3 x 11); a graph that would not is refused in one line, never written."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    import jax

    from xlgen.deploy import onnx_graph as deploy_onnx

    served = cases()[name]()
    if name not in ONNX_EXACT:
        with pytest.raises(ValueError, match=r"^--to-onnx: .*--to-stablehlo exports this model$") as e:
            deploy_onnx.export_onnx(served)
        print(f"{name}: refused: {e.value}")
        return
    payload, axes, shapes, used = deploy_onnx.export_onnx(served)
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == used == [s.name for s in served.inputs if s.name in used]
    assert [o.name for o in session.get_outputs()] == served.outputs
    assert [i.shape[0] for i in session.get_inputs()] == ["batch"] * len(used) and axes["length"] == "symbolic"
    arrays = served.example({"batch": 4, "length": 13}, seed=3)  # neither traced (2 x 8) nor checked (3 x 11)
    got = session.run(None, {s.name: a for s, a in zip(served.inputs, arrays) if s.name in used})
    want = [np.asarray(x) for x in jax.jit(served.fn)(*arrays)]
    err = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want))
    print(f"{name}: max |onnxruntime - xlgen| at batch 4, length 13 = {err:.1e}")
    assert err <= deploy_onnx.TOLERANCE
