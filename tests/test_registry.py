"""The registry of systems (`xlgen.registry`) and the one module <-> flat-parameters path
(`xlgen.models.params`). Cheap: abstract models (`nnx.eval_shape`) and NumPy only, nothing compiled."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest
from flax import nnx

from xlgen import registry
from xlgen.bench.hf import HFBench
from xlgen.finetune.record import Finetuning, head
from xlgen.models.cost import FlopCount
from xlgen.models.params import flat_params, materialize, stack_layers
from xlgen.pretrained import Interop, by_hf_model_type

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "transformer_xl": dict(vocab_size=20, cutoffs=(), d_model=8, d_embed=8, n_head=2, d_head=4, d_inner=16, n_layer=2),
    "xlnet": dict(vocab_size=20, d_model=8, n_head=2, d_head=4, d_inner=16, n_layer=2),
    "funnel": dict(vocab_size=20, block_sizes=(1, 1), num_decoder_layers=1, d_model=8, n_head=2, d_head=4, d_inner=16),
}


def test_every_family_is_complete_and_found_by_name_hf_type_and_module():
    assert {"transformer_xl", "xlnet", "funnel"} <= set(registry.names())
    for name in ("transformer_xl", "xlnet", "funnel"):  # the families with Hugging Face counterparts
        fam = registry.get(name)
        interop = fam.record(Interop)
        assert by_hf_model_type(interop.hf_model_type) is fam
        cfg = fam.model_config({"family": name, **TINY[name]})
        assert isinstance(cfg, fam.config_class)
        role, ctor = next(iter(fam.models.items()))  # the pretraining model
        module = nnx.eval_shape(lambda: ctor(cfg, rngs=nnx.Rngs(0)))
        assert registry.family_of(module) is fam, (name, role)
        for fn in (interop.from_hf, interop.wrap, fam.layer_ids, interop.to_hf):
            assert callable(fn)
        assert callable(fam.record(FlopCount).train_step) and fam.record(HFBench) is not None
    with pytest.raises(ValueError, match="model.family='bert'.*expected one of"):
        registry.get("bert")
    with pytest.raises(ValueError, match="model_type='bert' is not supported"):
        by_hf_model_type("bert")
    with pytest.raises(ValueError, match=r"config.model.n_layers: not a field of XLNetConfig"):
        registry.get("xlnet").model_config({"n_layers": 3})


def test_finetuning_heads_per_family():
    """XLNet and Funnel have a head for every task kind; Transformer-XL none (a clear error)."""
    kinds = {"classification", "regression", "multiple_choice", "squad", "token_classification"}
    for name in ("xlnet", "funnel"):
        fam = registry.get(name)
        ft = fam.record(Finetuning)
        assert set(ft.heads) == kinds and ft.squad_outputs is not None
        assert ft.input_style == {"xlnet": "cls_last", "funnel": "cls_first"}[name]
        cfg = fam.model_config(TINY[name], **ft.overrides(3))
        qa = nnx.eval_shape(lambda: head(fam, "squad", cfg, num_labels=3, answerability=False, rngs=nnx.Rngs(0)))
        assert registry.family_of(qa) is fam
        # from_pretrained(finetune workdir) calls the head with its own HF class (was: the LM's, wrong for QA)
        wrapped = fam.record(Interop).wrap(qa, {})
        assert getattr(wrapped, "head", getattr(wrapped, "architecture", None)) == type(qa).__name__
    txl = registry.get("transformer_xl")
    assert txl.record(Finetuning) is None and {f.name for f in registry.having(Finetuning)} >= {"xlnet", "funnel"}
    with pytest.raises(ValueError, match="no finetuning head"):
        head(txl, "classification", None, num_labels=2, answerability=False, rngs=None)


def test_materialize_and_flat_params_round_trip_with_scanned_layers():
    """flat_params(materialize(abstract, p)) == p exactly; a scanned model takes the stacked layout of the same
    numbers (stack_layers) and gives them back unstacked (flat_params(scanned=...)); wrong inputs are errors that
    name the parameter."""
    fam = registry.get("xlnet")
    cfg = fam.model_config(TINY["xlnet"])
    abstract = nnx.eval_shape(lambda: fam.models["lm"](cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    names = {n: v.shape for n, v in flat_params_abstract(abstract).items()}
    values = {n: rng.normal(size=s).astype(np.float32) for n, s in names.items()}
    model = materialize(abstract, values)
    back = flat_params(model)
    assert back.keys() == values.keys() and all(np.array_equal(back[n], values[n]) for n in values)

    scan_cfg = fam.model_config({**TINY["xlnet"], "scan_layers": True})
    scan_abstract = nnx.eval_shape(lambda: fam.models["lm"](scan_cfg, rngs=nnx.Rngs(0)))
    scanned = materialize(scan_abstract, stack_layers(values, cfg.n_layer, prefix="transformer.layers"))
    unstacked = flat_params(scanned, scanned=("transformer.layers",))
    assert unstacked.keys() == values.keys() and all(np.array_equal(unstacked[n], values[n]) for n in values)

    name = next(iter(values))
    with pytest.raises(KeyError, match=name):
        materialize(abstract, {n: v for n, v in values.items() if n != name})
    with pytest.raises(ValueError, match="does not have: \\['extra'\\]"):
        materialize(abstract, {**values, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=f"parameter '{name}': got shape"):
        materialize(abstract, {**values, name: np.zeros((1, 2, 3))})
    zeros = flat_params(materialize(abstract, {n: v for n, v in values.items() if n != name}, strict=False))
    assert not zeros[name].any()


def flat_params_abstract(abstract):
    """{name: abstract Param} of an abstract module (shapes only)."""
    return {".".join(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def test_no_model_module_is_imported_by_string():
    """Nothing asks for a model family by module name: no `importlib.import_module("xlgen.models...")`."""
    offenders = []
    for pkg in ("xlgen", "data_pipelines"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                tree = ast.parse(open(path, encoding="utf-8").read())
                for node in ast.walk(tree):
                    if (
                        isinstance(node, ast.Call)
                        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                        and node.args
                        and isinstance(node.args[0], ast.Constant)
                        and str(node.args[0].value).startswith("xlgen.models")
                    ):
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_objectives_belong_to_their_family_and_name_their_stream():
    """`config.model.family` + `config.objective` select one entry; each built-in objective names its data stream."""
    from ml_collections import ConfigDict

    import data_pipelines

    streams = {"txl_lm": "lm", "xlnet_plm": "xlnet", "funnel_mlm": "mlm", "funnel_electra": "electra"}
    for name in ("transformer_xl", "xlnet", "funnel"):
        fam = registry.get(name)
        assert fam.default_objective in fam.objectives
        for obj_name, obj in fam.objectives.items():
            assert obj.name == obj_name and obj.pipeline in data_pipelines.PIPELINES
            assert streams[obj_name] == obj.pipeline
            config = ConfigDict({"model": {"family": name}, "objective": obj_name})
            assert registry.objective(config) is obj
        assert (
            registry.objective(ConfigDict({"model": {"family": name}, "objective": ""})).name == fam.default_objective
        )
        assert registry.objective(ConfigDict({"model": {"family": name}, "objective": "finetune"})).name == "finetune"
    with pytest.raises(ValueError, match=r"objective='xlnet_plm': not an objective of model.family='funnel'"):
        registry.objective(ConfigDict({"model": {"family": "funnel"}, "objective": "xlnet_plm"}))


def test_data_pipeline_follows_the_objective():
    """ELECTRA on an MLM data section switches the stream (same keys); an objective on another stream's keys is a
    one-line error naming both."""
    from xlgen.config import ConfigError, load_config

    c = load_config(os.path.join(ROOT, "configs/pretrain/funnel_tiny.py"), ["--config.objective=funnel_electra"])
    assert c.data.pipeline == "electra"
    c = load_config(os.path.join(ROOT, "configs/pretrain/funnel_tiny.py"))
    assert c.data.pipeline == "mlm"
    with pytest.raises(ConfigError, match=r"config.data.pipeline='lm': objective 'xlnet_plm' reads the 'xlnet'"):
        load_config(os.path.join(ROOT, "configs/pretrain/txl_tiny.py"), ["--config.model.family=xlnet"])


def test_every_system_resolves_its_objectives_and_streams():
    """Every registered system (GANs and graph models too) has its default objective among its own, and each
    objective reads a named stream of data_pipelines or a pipeline function of its own."""
    from ml_collections import ConfigDict

    import data_pipelines

    for name in registry.names():
        fam = registry.get(name)
        assert fam.name == name and fam.default_objective in fam.objectives
        for obj in fam.objectives.values():
            assert obj.pipeline in data_pipelines.PIPELINES or callable(obj.pipeline), (name, obj.name)
        assert (
            registry.objective(ConfigDict({"model": {"family": name}, "objective": ""})).name == fam.default_objective
        )


def test_a_run_imports_only_its_own_system():
    """The registry names systems by module path; asking for one imports that one only."""
    import subprocess
    import sys

    code = (
        "import sys; from xlgen import registry; registry.get('xlnet'); "
        "print(sorted(m for m in ('xlgen.models.xlnet', 'xlgen.models.funnel', 'xlgen.models.transformer_xl') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "['xlgen.models.xlnet']", out.stdout + out.stderr
