"""The model families, one `Family` record each (`xlgen.models.family` lists what a record holds).

    from xlgen.models import registry
    fam = registry.get(config.model.family)          # KeyError-free: ValueError naming the known families
    cfg = fam.model_config(config.model)             # the family's config dataclass
    model = fam.models["lm"](cfg, rngs=rngs)
    fam = registry.by_hf_model_type(hf_config["model_type"])

Built-in families register in their package (`xlgen/models/<family>/family.py`); `register` adds another.
"""

from __future__ import annotations

from typing import Dict, Tuple

from xlgen.models.family import Family
from xlgen.models.funnel.family import FAMILY as _FUNNEL
from xlgen.models.transformer_xl.family import FAMILY as _TRANSFORMER_XL
from xlgen.models.xlnet.family import FAMILY as _XLNET

_FAMILIES: Dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add (or replace) a family; returns it."""
    _FAMILIES[family.name] = family
    return family


for _family in (_TRANSFORMER_XL, _XLNET, _FUNNEL):
    register(_family)


def names() -> Tuple[str, ...]:
    """The registered `config.model.family` values."""
    return tuple(_FAMILIES)


def get(name: str) -> Family:
    """The family called `name` (`config.model.family`); ValueError naming the registered ones otherwise."""
    if name not in _FAMILIES:
        raise ValueError(f"model.family={name!r}: unknown; expected one of {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def by_hf_model_type(model_type: str) -> Family:
    """The family loading Hugging Face `config.json` files with this `model_type`."""
    for family in _FAMILIES.values():
        if family.hf_model_type == model_type:
            return family
    supported = sorted(f.hf_model_type for f in _FAMILIES.values())
    raise ValueError(f"model_type={model_type!r} is not supported; supported: {supported}")


def hf_model_types() -> Tuple[str, ...]:
    return tuple(f.hf_model_type for f in _FAMILIES.values())


def family_of(module) -> Family:
    """The family an xlgen module (model or head) belongs to: the family package that defines its class."""
    parts = type(module).__module__.split(".")
    if parts[:2] == ["xlgen", "models"] and len(parts) > 2 and parts[2] in _FAMILIES:
        return _FAMILIES[parts[2]]
    for family in _FAMILIES.values():  # families registered from elsewhere: a model class they list
        if any(type(module) is cls for cls in family.models.values() if isinstance(cls, type)):
            return family
    raise ValueError(f"{type(module).__name__}: not a model of a registered family ({sorted(_FAMILIES)})")
