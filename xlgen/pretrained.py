"""`xlgen.from_pretrained`: dispatch on what a path holds.

* A Hugging Face model directory (`config.json` + `model.safetensors` or `pytorch_model.bin`): dispatched on
  `config.json["model_type"]` ("transfo-xl", "xlnet", "funnel") to the loader each model family registers with
  `register_hf_loader`. The loader picks the head from `config.json["architectures"]`.
* An xlgen workdir or checkpoint directory: registered by the trainer via `register_xlgen_loader`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict

import numpy as np

HFLoader = Callable[[Dict[str, Any], Dict[str, np.ndarray], Dict[str, Any]], Any]

_HF_LOADERS: Dict[str, str] = {
    # model_type -> "module:function" (imported lazily so `import xlgen` stays cheap)
    "transfo-xl": "xlgen.models.transformer_xl:from_hf",
    "xlnet": "xlgen.models.xlnet:from_hf",
    "funnel": "xlgen.models.funnel:from_hf",
}
_XLGEN_LOADER = "xlgen.train.workdir_model:from_workdir"


def _resolve(spec: str) -> Callable:
    import importlib

    module, fn = spec.split(":")
    return getattr(importlib.import_module(module), fn)


def read_hf_state_dict(path: str) -> Dict[str, np.ndarray]:
    """Read a HF weights file as float32/int NumPy arrays: `model.safetensors` (no torch needed) or
    `pytorch_model.bin` (needs torch). Raises FileNotFoundError naming the directory otherwise."""
    st = os.path.join(path, "model.safetensors")
    if os.path.exists(st):
        from safetensors.numpy import load_file

        return dict(load_file(st))
    bin_path = os.path.join(path, "pytorch_model.bin")
    if os.path.exists(bin_path):
        try:
            import torch
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(f"{bin_path}: reading a .bin checkpoint needs torch (pip install 'xlgen[parity]'), "
                              "or convert it to model.safetensors") from e
        sd = torch.load(bin_path, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}
    raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin")


def from_pretrained(path: str, **kwargs) -> Any:
    """Load a model from `path` (HF directory or xlgen workdir/checkpoint). Extra kwargs go to the loader."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory (expected a Hugging Face model directory or an xlgen workdir)")
    cfg_path = os.path.join(path, "config.json")
    hf_cfg = None
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            try:
                hf_cfg = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_path}: invalid JSON ({e})") from e
    if hf_cfg is not None and "model_type" in hf_cfg and "xlgen" not in hf_cfg:
        model_type = hf_cfg["model_type"]
        if model_type not in _HF_LOADERS:
            raise ValueError(f"{cfg_path}: model_type={model_type!r} is not supported; "
                             f"supported: {sorted(_HF_LOADERS)}")
        weights = read_hf_state_dict(path)
        return _resolve(_HF_LOADERS[model_type])(hf_cfg, weights, kwargs)
    return _resolve(_XLGEN_LOADER)(path, **kwargs)
