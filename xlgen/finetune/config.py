"""Finetuning config: the architecture resolved from `init_from` (a Hugging Face directory or an xlgen workdir),
command-line overrides, the stored `config.json` of a finetune workdir."""

from __future__ import annotations

from typing import Any, Dict, Optional

from xlgen.train.workdir import Workdir, hf_config


def pretrained_model_section(init_from: str) -> Dict[str, Any]:
    """The `config.model` dict (with `family`) of the model stored at `init_from`."""
    from data_pipelines import paths

    if not paths.as_path(init_from).is_dir():
        raise FileNotFoundError(f"init_from={init_from}: not a directory (a HF model directory or an xlgen workdir)")
    hf = hf_config(init_from)
    if hf is not None:
        import dataclasses

        from xlgen import registry
        from xlgen.finetune.record import Finetuning
        from xlgen.pretrained import Interop, by_hf_model_type

        mt = hf["model_type"]
        finetunable = [f.record(Interop).hf_model_type for f in registry.having(Finetuning) if f.record(Interop)]
        if mt not in finetunable:
            raise ValueError(
                f"{init_from}/config.json: model_type={mt!r} cannot be finetuned here (supported: "
                f"{', '.join(finetunable)})"
            )
        family = by_hf_model_type(mt)
        cfg = family.config_class.from_hf(hf)
        d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        return {"family": family.name, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}}
    old = Workdir.parse(init_from)[0].read_config()
    if old is None:
        raise FileNotFoundError(f"init_from={init_from}: no config.json (neither a HF directory nor an xlgen workdir)")
    return old.model.to_dict()


def check_finetunable(family: str, init_from: str) -> None:
    """A ConfigError when `family` (the model stored at `init_from`) has no finetuning heads in its registry record,
    naming the families that have."""
    from xlgen import config as config_lib
    from xlgen import registry
    from xlgen.finetune.record import Finetuning

    if family not in registry.names():
        return  # reported where the model is built, with the registered names
    if registry.get(family).record(Finetuning) is None:
        with_heads = [f.name for f in registry.having(Finetuning)]
        raise config_lib.ConfigError(
            f"init_from={init_from} holds a {family} model, which has no finetuning heads; finetune a run of "
            f"{' or '.join(with_heads)} (model.family)"
        )


def resolve_config(config, model_overrides: Dict[str, str] = ()):
    """Fill derived keys and take the architecture from `init_from` (command-line model.* overrides re-applied)."""
    from ml_collections import ConfigDict

    from xlgen import config as config_lib
    from xlgen.finetune.tasks import get_task

    task = get_task(config.task)  # unknown task -> error listing the known ones
    if config.init_from:
        section = pretrained_model_section(config.init_from)
        check_finetunable(section.get("family"), config.init_from)
        with config.unlocked():
            config.model = ConfigDict(config_lib._tuplify(section), type_safe=True)
    for k, v in dict(model_overrides).items():
        config_lib.apply_override(config, f"model.{k}", v)
    from xlgen.finetune.objective import max_segments

    n_seg = max(max_segments(config), 1)  # an unsupported task / family is an error naming max_segments
    with config.unlocked():
        config.objective = "finetune"
        L = int(config.data.max_seq_length) * n_seg
        config.data.seq_len = L * (task.num_labels if task.kind == "multiple_choice" else 1)  # FLOPs accounting
        config.data.num_predict = 0
    return config


def is_finetune_workdir(workdir: str) -> bool:
    """True if `workdir/config.json` was written by `xlgen finetune` (hook for `xlgen eval`)."""
    return Workdir(workdir).kind == "finetune"


def load_finetune_config(config_path: Optional[str], overrides: Dict[str, str], workdir: str):
    """The config file with overrides (model.* overrides applied on top of the architecture read from
    init_from); with no config file, the workdir's stored config.json (re-evaluation)."""
    from xlgen import config as config_lib

    model_over = {k[len("model.") :]: v for k, v in overrides.items() if k.startswith("model.")}
    other = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    if config_path:
        config = config_lib.load_config(config_path, other)
        return resolve_config(config, model_over)
    config = config_lib.read_workdir_config(workdir)
    if config is None:
        raise config_lib.ConfigError(f"{workdir}: no config.json; pass --config=configs/finetune/<task>.py")
    for k, v in overrides.items():
        config_lib.apply_override(config, k, v)
    return config_lib.validate(config)


def write_finetune_config(config, workdir: str) -> None:
    Workdir(workdir).write_config(config, "finetune")
