"""`xlgen.from_pretrained`: dispatch on what a path holds.

* A Hugging Face model directory (`config.json` + `model.safetensors` or `pytorch_model.bin`): dispatched on
  `config.json["model_type"]` ("transfo-xl", "xlnet", "funnel") to the family's HF loader (`Interop.from_hf`).
  The loader picks the head from `config.json["architectures"]`.
* An xlgen workdir or checkpoint directory (`from_workdir`): the model built on one device (dropout off) with the
  parameters of the latest checkpoint (or `step=`, `xlgen.train.workdir_model.restore_params`), wrapped with the
  family's HF-convention caller (`Interop.wrap`): Transformer-XL `TransfoXLPretrained` (`.log_probs`, `.mems`),
  XLNet `XLNetFromHF` (LM head: `.logits`, `.mems`), Funnel `HFFunnel` (MLM: `.logits`; ELECTRA workdirs: the
  discriminator, `FunnelForPreTraining`).

`path` may be a URL (`gs://bucket/models/xlnet-base-cased`, `gs://bucket/run`): files are read through etils.epath;
a remote `pytorch_model.bin` is read into memory for torch.

`Interop` is the record a system with a Hugging Face counterpart lists in `Family.records`: what this loader,
`xlgen export --to-hf` and `xlgen convert --from-tf` (`xlgen.interop`) and finetuning's `init_from` read.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from data_pipelines import paths


@dataclasses.dataclass(frozen=True)
class TFImport:
    """How `xlgen convert --from-tf` reads the family's original TensorFlow checkpoints (the family's own
    `tf_import.py` holds its name map: original variable name -> xlgen parameter).

        original_config  (the release's own config JSON as a dict, e.g. XLNet's xlnet_config.json, Funnel's
                         net_config.json) -> config_class; None = only HF config.json / xlgen config files
        load             (checkpoint: `xlgen.tf_checkpoint.TFCheckpoint` (names, `name in ckpt`, `ckpt[name]`),
                         config_class instance) -> nnx.Module holding the checkpoint's weights (no random init);
                         the module's class is the Hugging Face class `Interop.to_hf` writes
    """

    load: Callable[[Any, Any], Any]
    original_config: Optional[Callable[[Dict[str, Any]], Any]] = None


@dataclasses.dataclass(frozen=True)
class Interop:
    """
    hf_model_type  Hugging Face `config.json["model_type"]` ("transfo-xl" | "xlnet" | "funnel"); the family's
                   `config_class.from_hf(hf_config_dict, **overrides)` reads such a config
    from_hf        (hf_config, state_dict, kwargs) -> HF-convention callable (`xlgen.from_pretrained`)
    wrap           (module, kwargs) -> HF-convention callable around a trained xlgen module
                   (`xlgen.from_pretrained(workdir)`)
    to_hf          module -> (hf_config, state_dict): the inverse of `from_hf` (`xlgen export --to-hf`); None while
                   a family has no writer
    hf_wordpiece   the Hugging Face tokenizer class (and special pieces it must be told) for an exported WordPiece
                   vocabulary (`xlgen export`)
    from_tf        `TFImport` (`xlgen convert --from-tf`, in the family's own `tf_import.py`); None = no importer
    """

    hf_model_type: str
    from_hf: Callable[[Dict[str, Any], Dict[str, np.ndarray], Dict[str, Any]], Any]
    wrap: Optional[Callable[[Any, Dict[str, Any]], Any]] = None
    to_hf: Optional[Callable[[Any], Tuple[Dict[str, Any], Dict[str, np.ndarray]]]] = None
    hf_wordpiece: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"tokenizer_class": "BertTokenizer"})
    from_tf: Optional[TFImport] = None


def by_hf_model_type(model_type: str):
    """The `Family` loading Hugging Face `config.json` files with this `model_type`."""
    from xlgen import registry

    for family in registry.having(Interop):
        if family.record(Interop).hf_model_type == model_type:
            return family
    raise ValueError(f"model_type={model_type!r} is not supported; supported: {sorted(hf_model_types())}")


def hf_model_types() -> Tuple[str, ...]:
    """The Hugging Face `model_type`s of the registered systems."""
    from xlgen import registry

    return tuple(f.record(Interop).hf_model_type for f in registry.having(Interop))


def hf_model_type(family) -> Optional[str]:
    """A `Family`'s Hugging Face `model_type`; None for a system with no Hugging Face counterpart."""
    record = family.record(Interop)
    return record.hf_model_type if record is not None else None


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
        model_type = hf_cfg["model_type"]
        if model_type not in hf_model_types():
            raise ValueError(
                f"{cfg_path}: model_type={model_type!r} is not supported; supported: {sorted(hf_model_types())}"
            )
        weights = read_hf_state_dict(path)
        return by_hf_model_type(model_type).record(Interop).from_hf(hf_cfg, weights, kwargs)
    return from_workdir(path, **kwargs)


def from_workdir(path: str, step: Optional[int] = None, **kwargs) -> Any:
    """The workdir's model with the HF-convention caller; `.tokenizer` is the run's tokenizer (encode/decode;
    None when the workdir stores none)."""
    from xlgen import registry
    from xlgen.train import tokenizer_store
    from xlgen.train.workdir_model import restore_params

    config, program, params, step = restore_params(path, step)
    module = program.make_model(params, train=False)
    model = registry.get(config.model.family).record(Interop).wrap(module, kwargs)
    wd = paths.as_path(path)
    if wd.name.isdigit() and wd.parent.name == "checkpoints":
        wd = wd.parent.parent
    try:
        model.tokenizer = tokenizer_store.load(str(wd))
    except AttributeError:  # pragma: no cover - a wrapper without instance attributes
        pass
    return model
