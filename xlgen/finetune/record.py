"""`Finetuning`: the record a system with finetuning heads lists in `Family.records` (`xlgen.registry`); the
finetuning objective, readers and deployment read it, `registry.having(Finetuning)` names the finetunable systems."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Finetuning:
    """
    heads          {task kind: constructor(cfg, *, num_labels, answerability, rngs) -> nnx.Module}: the heads
                   ("classification", "regression", "multiple_choice", "squad", "token_classification")
    input_style    the layout of the task inputs (`xlgen.finetune.readers.features`): "cls_last" (XLNet: <cls>
                   last, left padding) or "cls_first" (BERT, Funnel: <cls> first)
    squad_outputs  (head model, batch, *, train) -> {name: array}: the SQuAD head's outputs in the finetuning
                   objective's names (training: start/end logits, cls_logits; inference: the family's beam arrays
                   or logits); None = no SQuAD head
    overrides      num_labels -> {config field: value} applied to `Family.config_class` for finetuning
    segment_heads  the task kinds whose heads take N segments `[b, (c,) N, l]` with the memory carried across them
                   (`max_segments`, XLNet `recurrence.py`); empty = no segment-recurrent finetuning
    """

    heads: Mapping[str, Callable[..., Any]]
    input_style: str
    squad_outputs: Optional[Callable[..., Dict[str, Any]]] = None
    overrides: Callable[[int], Dict[str, Any]] = lambda num_labels: {}
    segment_heads: Tuple[str, ...] = ()


def head(family, kind: str, cfg, *, num_labels: int, answerability: bool, rngs):
    """The finetuning model of a `Family` for a task of `kind` (`Finetuning.heads`); ValueError naming the
    supported kinds otherwise."""
    record = family.record(Finetuning)
    heads = record.heads if record is not None else {}
    if kind not in heads:
        supported = sorted(heads) or "none: this family has no finetuning heads"
        raise ValueError(f"model.family={family.name!r}: no finetuning head for task kind {kind!r} ({supported})")
    return heads[kind](cfg, num_labels=num_labels, answerability=answerability, rngs=rngs)


def input_style(family) -> Optional[str]:
    """The task-input layout of a `Family`'s finetuning inputs (`Finetuning.input_style`); None without heads."""
    record = family.record(Finetuning)
    return record.input_style if record is not None else None
