"""Pretraining: the sharded program (`build_program`), objectives registry, loop, eval, metrics.

from xlgen.train import build_program, train, evaluate, register_objective
"""

from xlgen.train.objectives import OBJECTIVES, Objective, get_objective, register_objective
from xlgen.train.program import Program, build_program, make_eval_step


def train(config, workdir, **kwargs):
    from xlgen.train.loop import train as _train

    return _train(config, workdir, **kwargs)


def evaluate(config, workdir):
    from xlgen.train.loop import evaluate as _evaluate

    return _evaluate(config, workdir)


__all__ = [
    "OBJECTIVES",
    "Objective",
    "Program",
    "build_program",
    "evaluate",
    "get_objective",
    "make_eval_step",
    "register_objective",
    "train",
]
