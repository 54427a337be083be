"""What a model family provides to the rest of xlgen: one `Family` record per family.

Each family package defines its record in one place (`xlgen/models/<family>/family.py`) and `xlgen.models.registry`
collects them; everything outside `xlgen/models` asks the registry (`registry.get(config.model.family)`,
`registry.by_hf_model_type(...)`) instead of importing a family module by name or branching on the family.

    name               `config.model.family`: "transformer_xl" | "xlnet" | "funnel"
    hf_model_type      Hugging Face `config.json["model_type"]`: "transfo-xl" | "xlnet" | "funnel"
    config_class       frozen dataclass whose fields are the keys of `config.model` (minus `family`); has
                       `.from_hf(hf_config_dict, **overrides)`
    default_objective  the pretraining objective when `config.objective` is empty (`xlgen.train.objectives`)
    models             {role: constructor(cfg, *, rngs, **options) -> nnx.Module}: the pretraining models
                       ("lm", Funnel "mlm" / "electra", ...)
    heads              {task kind: constructor(cfg, *, num_labels, answerability, rngs) -> nnx.Module}: finetuning
                       heads ("classification", "regression", "multiple_choice", "squad"); empty = not finetunable
    squad_outputs      (head model, batch, *, train) -> {name: array}: the SQuAD head's outputs in the finetuning
                       objective's names (training: start/end logits, cls_logits; inference: the family's
                       beam arrays or logits)
    finetune_overrides num_labels -> {config field: value} applied to `config_class` for finetuning
    input_style        task-input convention of the family's tokenizer ("xlnet": <cls> last, left padding;
                       "funnel": BERT's <cls> first); None for language models
    from_hf            (hf_config, state_dict, kwargs) -> HF-convention callable (`xlgen.from_pretrained`)
    to_hf              module -> (hf_config, state_dict): the inverse of `from_hf` (`xlgen export --to-hf`); None
                       while a family has no writer
    wrap               (module, kwargs) -> HF-convention callable around a trained xlgen module
                       (`xlgen.from_pretrained(workdir)`)
    layer_ids          {dotted param name: (shape, logical axes)} -> ({name: None | int array}, n_layer): the
                       numbering of parameters into layers for layer-wise LR decay (`xlgen.optim`)
    train_flops        config -> analytic model FLOPs of one global training step (`xlgen.flops`)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

Meta = Dict[str, Tuple[Tuple[int, ...], Tuple]]
LayerIds = Tuple[Dict[str, Optional[np.ndarray]], int]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    hf_model_type: str
    config_class: type
    default_objective: str
    models: Mapping[str, Callable[..., Any]]
    from_hf: Callable[[Dict[str, Any], Dict[str, np.ndarray], Dict[str, Any]], Any]
    wrap: Callable[[Any, Dict[str, Any]], Any]
    layer_ids: Callable[[Meta], LayerIds]
    train_flops: Callable[[Any], float]
    heads: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    squad_outputs: Optional[Callable[..., Dict[str, Any]]] = None
    finetune_overrides: Callable[[int], Dict[str, Any]] = lambda num_labels: {}
    input_style: Optional[str] = None
    to_hf: Optional[Callable[[Any], Tuple[Dict[str, Any], Dict[str, np.ndarray]]]] = None

    def model_config(self, model_section: Mapping[str, Any], **overrides):
        """`config_class` from a `config.model` mapping (its `family` key ignored), lists as tuples; an unknown key
        is an error naming it and the valid fields."""
        cls = self.config_class
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in dict(model_section).items() if k != "family"}
        unknown = sorted(set(kw) - fields)
        if unknown:
            raise ValueError(
                f"config.model.{unknown[0]}: not a field of {cls.__name__}; valid fields: {sorted(fields)}"
            )
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kw.items()}
        kw.update(overrides)
        return cls(**kw)

    def head(self, kind: str, cfg, *, num_labels: int, answerability: bool, rngs):
        """The finetuning model for a task of `kind` (see `heads`)."""
        if kind not in self.heads:
            supported = sorted(self.heads) or "none: this family has no finetuning heads"
            raise ValueError(f"model.family={self.name!r}: no finetuning head for task kind {kind!r} ({supported})")
        return self.heads[kind](cfg, num_labels=num_labels, answerability=answerability, rngs=rngs)
