"""Training: the sharded program (`build_program`), the loop, the optimizer (`optim`), checkpoints (`checkpointing`),
evaluation, metrics.

from xlgen.train import build_program
from xlgen.train.loop import train, evaluate
Objectives belong to their system (`xlgen.registry.objective(config)`).

The program's names are imported on first use (PEP 562): the modules that need no JAX (`metrics`, `goodput`,
`outdir`, ...) load without it, so `xlgen plot` and the argument checks of the commands do not import JAX.
"""

__all__ = ["Program", "TrainProgram", "build_program", "make_eval_step"]


def __getattr__(name):  # noqa: V103  (PEP 562: called by the import system)
    if name in __all__:
        from xlgen.train import program

        return getattr(program, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
