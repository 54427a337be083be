"""`xlgen.from_pretrained(workdir)` for xlgen training workdirs.

Reads `workdir/config.json`, builds the model on one device (dropout off) and restores the parameters of the
latest checkpoint (or `step=`), wrapped with the family's HF-convention caller: Transformer-XL `TransfoXLPretrained`
(`.log_probs`, `.mems`), XLNet `XLNetFromHF` (LM head: `.logits`, `.mems`), Funnel `HFFunnel` (MLM: `.logits`;
ELECTRA workdirs: the discriminator, `FunnelForPreTraining`).
"""

from __future__ import annotations

from typing import Any, Optional


def restore_params(workdir: str, step: Optional[int] = None):
    """(config, program, {param name: array}, step) of a workdir's checkpoint (`checkpoints/`, latest unless
    `step` or a `DIR/checkpoints/<step>` path is given), restored onto one device."""
    from xlgen.train.workdir import Workdir

    wd, path_step, sub = Workdir.parse(workdir)
    step = path_step if step is None else step
    config, program, restored = wd.open(
        step=step, sub=sub or "checkpoints", mesh_config=dict(data=1, fsdp=1, tensor=1, num_devices=1, num_slices=1)
    )
    return config, program, program.params_of(restored.state), restored.step


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
    from xlgen import registry
    from xlgen.interop import Interop

    return registry.get(config.model.family).record(Interop).wrap(module, kwargs)
