"""`Interop`: the record a system with a Hugging Face counterpart lists in `Family.records` (`xlgen.registry`), read
by `xlgen.from_pretrained`, `xlgen export --to-hf`, `xlgen convert --from-tf` and finetuning's `init_from`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np


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
