"""Pretraining: the sharded program (`build_program`), objectives registry, loop, eval, metrics.

from xlgen.train import build_program, register_objective
from xlgen.train.loop import train, evaluate    # (not re-exported here: the loop imports the finetuning objective)
"""

from xlgen.train.objectives import OBJECTIVES, Objective, get_objective, register_objective
from xlgen.train.program import Program, build_program, make_eval_step

__all__ = [
    "OBJECTIVES",
    "Objective",
    "Program",
    "build_program",
    "get_objective",
    "make_eval_step",
    "register_objective",
]
