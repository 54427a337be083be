"""`xlgen.from_pretrained(workdir)` for xlgen training workdirs.

Reads `workdir/config.json`, builds the model on one device (dropout off) and restores the parameters of the
latest checkpoint (or `step=`), wrapped with the family's HF-convention caller: Transformer-XL `TransfoXLPretrained`
(`.log_probs`, `.mems`), XLNet `XLNetFromHF` (LM head: `.logits`, `.mems`), Funnel `HFFunnel` (MLM: `.logits`;
ELECTRA workdirs: the discriminator, `FunnelForPreTraining`).
"""

from __future__ import annotations

from typing import Any, Optional

import jax


def restore_params(workdir: str, step: Optional[int] = None):
    """(config, {param name: array}, step) of a workdir's checkpoint, restored onto one device."""
    from data_pipelines import paths
    from xlgen import config as config_lib
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.train.program import build_program

    wd = paths.as_path(workdir)  # local (absolute) or gs://
    if wd.name.isdigit() and wd.parent.name == "checkpoints":
        step = int(wd.name) if step is None else step
        wd = wd.parent.parent
    workdir = str(wd)
    from xlgen import finetune

    if finetune.is_finetune_workdir(workdir):
        import xlgen.tasks.objective  # noqa: F401  (registers the finetune objective before the config resolves)
    config = config_lib.read_workdir_config(workdir)
    if config is None:
        raise FileNotFoundError(f"{workdir}: no config.json (not an xlgen workdir)")
    with config.mesh.unlocked():
        config.mesh.update(dict(data=1, fsdp=1, tensor=1, num_devices=1))
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    ckpt = Checkpointer(paths.join(workdir, "checkpoints"), keep=0, async_save=False)
    try:
        with jax.set_mesh(mesh):
            if step is None:
                restored = ckpt.restore_latest(program.abstract_state(), None)
                if restored is None:
                    raise FileNotFoundError(f"{workdir}/checkpoints: no checkpoint")
                state, _, _, step = restored
            else:
                state, _, _ = ckpt.restore(step, program.abstract_state(), None)
    finally:
        ckpt.close()
    return config, program, state["params"], step


def from_workdir(path: str, step: Optional[int] = None, **kwargs) -> Any:
    """The workdir's model with the HF-convention caller; `.tokenizer` is the run's tokenizer (encode/decode;
    None when the workdir stores none)."""
    model = _from_workdir(path, step, **kwargs)
    from data_pipelines import paths
    from xlgen.train import tokenizer_store

    wd = paths.as_path(path)
    if wd.name.isdigit() and wd.parent.name == "checkpoints":
        wd = wd.parent.parent
    try:
        model.tokenizer = tokenizer_store.load(str(wd))
    except AttributeError:  # pragma: no cover - a wrapper without instance attributes
        pass
    return model


def _from_workdir(path: str, step: Optional[int] = None, **kwargs) -> Any:
    config, program, params, step = restore_params(path, step)
    module = program.make_model(params, train=False)
    from xlgen.models import registry

    return registry.get(config.model.family).wrap(module, kwargs)
