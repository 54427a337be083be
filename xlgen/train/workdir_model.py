"""A workdir's parameters restored on one device (`restore_params`): what `xlgen.from_pretrained(workdir)`,
`xlgen export` and the analyses build their models from."""

from __future__ import annotations

from typing import Optional


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
