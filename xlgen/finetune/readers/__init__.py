"""Readers of the official finetuning data formats and model-input creation (GLUE, SQuAD, RACE, long-text
classification). The task registry that ties them to metrics lives in `xlgen.finetune.tasks`."""

from xlgen.finetune.readers.examples import ChoiceExample, SquadExample, TaskDataError, TextExample  # noqa: F401
