"""`xlgen export --to-onnx`: a finetuned head as ONNX, through its Hugging Face export (`xlgen.interop.export.to_hf`) and
`torch.onnx` (transformers 4.34.1, torch; the `parity` extra), checked before it is written.

The graph has the deployed function's inputs and outputs (`xlgen.deploy`: names, int32 token inputs) with the batch
and length axes dynamic. Before anything is written, onnxruntime runs it on inputs of a batch size and length other
than the traced ones and its outputs must equal xlgen's (`Served.fn`, the JAX function) within `TOLERANCE`;
otherwise the export is refused naming the difference (a graph whose shapes were traced as constants is never
written). Language models with memory are exported by `--to-stablehlo`: HF's memory has no "empty rows" input
(`mem_valid`), so the two would differ at the start of a text.
"""

from __future__ import annotations

import io
from typing import Any, Dict, List, Tuple

import numpy as np

TOLERANCE = 1e-4
CHECK_SIZES = {"batch": 3, "length": 11}  # the check's shapes: neither is a traced size (2 x 8 below)
TRACE_SIZES = {"batch": 2, "length": 8}


def _hf_model(module):
    """The transformers model equal to an xlgen module (`xlgen.interop.export.to_hf`), in eval mode."""
    import torch
    import transformers

    from xlgen import registry

    hf_config, state_dict = registry.family_of(module).to_hf(module)
    arch = hf_config["architectures"][0]
    cfg_class = transformers.AutoConfig.for_model(hf_config["model_type"]).__class__
    cfg = cfg_class.from_dict({k: v for k, v in hf_config.items() if k != "model_type"})
    model = getattr(transformers, arch)(cfg).eval()
    weights = {k: torch.from_numpy(np.asarray(v)) for k, v in state_dict.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{arch}: the Hugging Face export does not load ({missing[:3]} {unexpected[:3]})")
    return model, hf_config


def _wrapper(served_, model, hf_config):
    """A torch module with the deployed function's positional inputs and outputs around the HF model."""
    import inspect

    import torch

    accepted = set(inspect.signature(model.forward).parameters)
    names = [s.name for s in served_.inputs]
    dtypes = {"input_ids": torch.long, "token_type_ids": torch.long, "attention_mask": torch.float32}
    dtypes.update({"p_mask": torch.float32, "cls_index": torch.long})
    s_top, e_top = hf_config.get("start_n_top", 1), hf_config.get("end_n_top", 1)

    class Deployed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *arrays):
            kw = {n: a.to(dtypes[n]) for n, a in zip(names, arrays) if n in accepted}
            out = self.model(**kw)
            res = []
            for name in served_.outputs:
                x = getattr(out, name)
                if name.startswith("end_top_"):  # HF rows j*S + k -> xlgen's k*E + j (k-th start, j-th end)
                    x = x.reshape(x.shape[0], e_top, s_top).transpose(1, 2).reshape(x.shape[0], s_top * e_top)
                res.append(x.to(torch.int32) if name.endswith("_index") else x)
            return tuple(res)

    return Deployed().eval()


def export_onnx(served_) -> Tuple[bytes, Dict[str, Any], List[Tuple[list, str]], List[str]]:
    """(model.onnx bytes, {axis: "symbolic"}, [(output shape, dtype)], graph input names) of a finetuned head;
    ValueError when the model has no ONNX route or the graph differs from xlgen at the check's shapes."""
    if served_.kind == "language_model":
        raise ValueError(
            f"--to-onnx: the {served_.family} language model (memory in and out) is exported by --to-stablehlo; "
            "--to-onnx exports finetuned heads"
        )
    import torch

    try:
        model, hf_config = _hf_model(served_.module)
    except ValueError as e:
        raise ValueError(f"--to-onnx: {e}; --to-stablehlo exports this model") from None
    wrapper = _wrapper(served_, model, hf_config)
    trace = [torch.from_numpy(a) for a in served_.example(TRACE_SIZES, seed=0)]
    dynamic = {}
    for s in served_.inputs:
        dynamic[s.name] = {i: d for i, d in enumerate(s.shape) if isinstance(d, str)}
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            tuple(trace),
            buf,
            dynamo=False,
            input_names=[s.name for s in served_.inputs],
            output_names=list(served_.outputs),
            dynamic_axes={**dynamic, **{n: {0: "batch"} for n in served_.outputs}},
            opset_version=17,
        )
    payload = buf.getvalue()
    shapes = check(served_, payload)
    return payload, {"batch": "symbolic", "length": "symbolic"}, shapes, graph_inputs(payload)


def check(served_, payload: bytes) -> List[Tuple[list, str]]:
    """Run the graph with onnxruntime at `CHECK_SIZES` against xlgen's function; the outputs' symbolic shapes."""
    import jax
    import onnxruntime as ort

    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    arrays = served_.example(CHECK_SIZES, seed=1)
    used = graph_inputs(payload)
    got = session.run(None, {s.name: a for s, a in zip(served_.inputs, arrays) if s.name in used})
    want = [np.asarray(x) for x in jax.jit(served_.fn)(*arrays)]
    for name, g, w in zip(served_.outputs, got, want):
        err = np.inf if g.shape != w.shape else float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        if name.endswith("_index"):
            err = 0.0 if g.shape == w.shape and np.array_equal(g, w) else np.inf
        if not err <= TOLERANCE:
            raise ValueError(
                f"--to-onnx: the {served_.family} {served_.kind} graph (torch.onnx via transformers) differs from "
                f"xlgen in {name!r} by {err:.2g} at batch {CHECK_SIZES['batch']}, length {CHECK_SIZES['length']} "
                "(a shape it was not traced at): not written; --to-stablehlo exports this model"
            )
    return [([d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim], _dtype(o)) for o in _outputs(payload)]


def graph_inputs(payload: bytes) -> List[str]:
    """The graph's input names: the deployed function's, minus those the model does not read (Funnel's SQuAD 1.1
    head reads no p_mask / cls_index)."""
    import onnx

    return [i.name for i in onnx.load_from_string(payload).graph.input]


def _outputs(payload: bytes):
    import onnx

    return onnx.load_from_string(payload).graph.output


def _dtype(value_info) -> str:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)).name
