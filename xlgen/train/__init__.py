"""Training: the sharded program (`build_program`), the loop, the optimizer (`optim`), checkpoints (`checkpointing`),
evaluation, metrics.

from xlgen.train import build_program
from xlgen.train.loop import train, evaluate
Objectives belong to their system (`xlgen.registry.objective(config)`).
"""

from xlgen.train.program import Program, TrainProgram, build_program, make_eval_step

__all__ = ["Program", "TrainProgram", "build_program", "make_eval_step"]
