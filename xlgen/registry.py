"""The one registry: every trainable system xlgen runs, one line each.

    from xlgen import registry
    fam = registry.get(config.model.family)          # the system's record (`xlgen.models.family.Family`)
    obj = registry.objective(config)                 # its `Objective` for `config.objective` (or its default)
    ft = fam.record(Finetuning)                      # one of its optional records, or None
    [f for f in registry.having(Finetuning)]         # the systems that have one

A system is one package that defines its record and one line in `SYSTEMS` below; it is imported only when a run
asks for it. Objectives shared by every family with finetuning heads (the finetuning losses) are named in
`SHARED_OBJECTIVES`. Nothing outside a system's package branches on its name. docs/architecture.md, "Adding a system", is the recipe.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from typing import Dict, Tuple

from xlgen.models.family import Family, Objective

# config.model.family -> "module:attribute" of its Family record
SYSTEMS: Dict[str, str] = {
    "transformer_xl": "xlgen.models.transformer_xl.family:FAMILY",
    "xlnet": "xlgen.models.xlnet.family:FAMILY",
    "funnel": "xlgen.models.funnel.family:FAMILY",
    "cegan": "xlgen.systems.gan.system:CEGAN",
    "badgan": "xlgen.systems.gan.system:BADGAN",
    "planetoid": "xlgen.systems.planetoid.system:FAMILY",
    "gdan": "xlgen.systems.gdan.system:FAMILY",
    "initialgan": "xlgen.systems.initialgan.system:FAMILY",
}

# config.objective -> "module:attribute" of an Objective that works with any family's finetuning heads
SHARED_OBJECTIVES: Dict[str, str] = {
    "finetune": "xlgen.finetune.objective:FINETUNE",
}

# installed packages add systems under this entry-point group (`_installed`)
ENTRY_POINT_GROUP = "xlgen.systems"

_LOADED: Dict[str, object] = {}


def _load(ref: str):
    if ref not in _LOADED:
        module, attr = ref.split(":")
        _LOADED[ref] = getattr(importlib.import_module(module), attr)
    return _LOADED[ref]


def register(family: Family) -> Family:
    """Add (or replace) a system in this process (a notebook, a script; an installed package declares its systems
    under the `xlgen.systems` entry-point group instead, so that every `xlgen` command finds them)."""
    _LOADED[f"<registered>:{family.name}"] = family
    SYSTEMS[family.name] = f"<registered>:{family.name}"
    return family


@functools.lru_cache(maxsize=1)
def _installed() -> Dict[str, str]:
    """{name: "module:attribute"} of the systems installed packages declare in their metadata:

    [project.entry-points."xlgen.systems"]          # pyproject.toml (setup.py: entry_points={...})
    my_system = "my_package.system:FAMILY"
    """
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _systems() -> Dict[str, str]:
    """The built-in systems and those registered in this process, then the installed ones (a built-in name wins)."""
    return {**_installed(), **SYSTEMS}


def names() -> Tuple[str, ...]:
    """The registered `config.model.family` values."""
    return tuple(_systems())


def get(name: str) -> Family:
    """The system called `name` (`config.model.family`); ValueError naming the registered ones otherwise."""
    systems = _systems()
    if name not in systems:
        raise ValueError(f"model.family={name!r}: unknown; expected one of {sorted(systems)}")
    return _load(systems[name])


def objective_names(family: str) -> Tuple[str, ...]:
    """The `config.objective` values a system accepts: its own, then the shared ones."""
    return tuple(get(family).objectives) + tuple(SHARED_OBJECTIVES)


def objective(config) -> Objective:
    """The `Objective` of a run: `config.objective` (empty = the system's default) among the system's own objectives
    and the shared ones; ValueError naming the valid ones otherwise."""
    fam = get(config.model.family)
    name = config.objective or fam.default_objective
    if name in fam.objectives:
        return fam.objectives[name]
    if name in SHARED_OBJECTIVES:
        return _load(SHARED_OBJECTIVES[name])
    raise ValueError(
        f"objective={name!r}: not an objective of model.family={fam.name!r}; expected one of "
        f"{list(objective_names(fam.name))}"
    )


def having(kind: type) -> Tuple[Family, ...]:
    """The registered systems that have a record of type `kind`."""
    return tuple(f for f in (get(n) for n in _systems()) if f.record(kind) is not None)


def family_of(module) -> Family:
    """The system an xlgen module (model or head) belongs to: the system whose package defines its class."""
    mod = type(module).__module__
    systems = _systems()
    for name, ref in systems.items():
        package = ref.split(":")[0].rsplit(".", 1)[0]
        if mod == package or mod.startswith(package + "."):
            return get(name)
    for name in systems:  # systems registered at run time: a model class they list
        family = get(name)
        if any(type(module) is cls for cls in family.models.values() if isinstance(cls, type)):
            return family
    raise ValueError(f"{type(module).__name__}: not a model of a registered family ({sorted(systems)})")


def model_config(config, **overrides):
    """The system's frozen config dataclass from `config.model` (minus `family`), with clear errors."""
    return get(config.model.family).model_config(config.model, **overrides)
