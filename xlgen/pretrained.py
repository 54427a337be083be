"""`xlgen.from_pretrained`: dispatch on what a path holds.

* A Hugging Face model directory (`config.json` + `model.safetensors` or `pytorch_model.bin`): dispatched on
  `config.json["model_type"]` ("transfo-xl", "xlnet", "funnel") to the family's HF loader (`Interop.from_hf`,
  `xlgen.interop`). The loader picks the head from `config.json["architectures"]`.
* An xlgen workdir or checkpoint directory: `xlgen.train.workdir_model.from_workdir`.

`path` may be a URL (`gs://bucket/models/xlnet-base-cased`, `gs://bucket/run`): files are read through etils.epath;
a remote `pytorch_model.bin` is read into memory for torch.
"""

from __future__ import annotations

import io
import os
from typing import Any, Dict

import numpy as np

from data_pipelines import paths


def read_hf_state_dict(path: str) -> Dict[str, np.ndarray]:
    """Read a HF weights file as float32/int NumPy arrays: `model.safetensors` (no torch needed) or
    `pytorch_model.bin` (needs torch). Raises FileNotFoundError naming the directory otherwise."""
    root = paths.as_path(path)
    st = root / "model.safetensors"
    if st.exists():
        from safetensors.numpy import load, load_file

        return dict(load_file(str(st))) if not paths.is_remote(st) else dict(load(st.read_bytes()))
    bin_path = root / "pytorch_model.bin"
    if bin_path.exists():
        try:
            import torch
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"{bin_path}: reading a .bin checkpoint needs torch (pip install 'xlgen[parity]'), "
                "or convert it to model.safetensors"
            ) from e
        src = str(bin_path) if not paths.is_remote(bin_path) else io.BytesIO(bin_path.read_bytes())
        sd = torch.load(src, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}
    raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin")


def from_pretrained(path: str, **kwargs) -> Any:
    """Load a model from `path` (HF directory or xlgen workdir/checkpoint). Extra kwargs go to the loader."""
    path = os.fspath(path) if not paths.is_remote(path) else str(path)
    if not paths.as_path(path).is_dir():
        raise FileNotFoundError(
            f"{path}: not a directory (expected a Hugging Face model directory or an xlgen workdir)"
        )
    from xlgen.train.workdir import hf_config

    cfg_path = paths.as_path(path) / "config.json"
    hf_cfg = hf_config(path)  # None: an xlgen workdir (config.json with an `xlgen` block) or checkpoint directory
    if hf_cfg is not None:
        from xlgen.interop import Interop, by_hf_model_type, hf_model_types  # here: `import xlgen` stays cheap

        model_type = hf_cfg["model_type"]
        if model_type not in hf_model_types():
            raise ValueError(
                f"{cfg_path}: model_type={model_type!r} is not supported; supported: {sorted(hf_model_types())}"
            )
        weights = read_hf_state_dict(path)
        return by_hf_model_type(model_type).record(Interop).from_hf(hf_cfg, weights, kwargs)
    from xlgen.train.workdir_model import from_workdir

    return from_workdir(path, **kwargs)
