"""The `finetune` objective: task model per (model family, task kind), its batch layout and loss.

Named in `xlgen.registry.SHARED_OBJECTIVES` (an objective of every family with finetuning heads), so
`build_program(config, mesh)` gives the sharded, jitted, donated finetuning step with the trainer's optimizer (warmup + decay, clipping, layer-wise LR decay).

Models (heads owned by the model files; "<cls>" summary, fresh head parameters):
    family   classification / regression      multiple choice (RACE)     SQuAD
    xlnet    XLNetForSequenceClassification  XLNetForMultipleChoice    XLNetForQuestionAnswering (beam head)
    funnel   FunnelForSequenceClassification FunnelForMultipleChoice   FunnelForQuestionAnswering (decoder)

Long documents (`max_segments` = N > 0; classification, regression, multiple choice on a family with
`segment_heads`): inputs `[b, N, L]` (RACE `[b, 4, N, L]`), the N segments of `data.max_seq_length` encoded with
the memory carried across them (`finetune.mem_len`, 0 = L), the head on the last segment or the pooled document
(`finetune.segment_pool`); N = 0 is the one-window model, unchanged.

Parameter-efficient finetuning: `finetune.lora.rank` > 0 attaches adapters to the head model
(`xlgen.finetune.peft`); what is frozen leaves the optimizer (`xlgen.train.optim.frozen_parameters`).

Packed training batches (`finetune.packing`; classification, regression, token classification): several examples
per row, attention kept inside each, per-example heads (`xlgen.finetune.packing`).

Losses (XLNet `function_builder.py`, Funnel `classifier.py`/`squad.py`):
    classification  mean cross-entropy;  regression  mean squared error of the single logit;
    multiple choice cross-entropy over the options;
    token classification  cross-entropy over the labelled pieces (each word's first), mean over the batch's pieces;
    SQuAD           (CE(start) + CE(end)) / 2 over positions with p_mask = 0, + 0.5 * BCE(cls_logits,
                    is_impossible) when the model has an answerability head (always on for XLNet, as the
                    original trains v1.1 and v2.0 with the same head).
"""

from __future__ import annotations

from typing import Dict

import jax
import jax.numpy as jnp
import optax

from xlgen import registry
from xlgen.finetune.record import Finetuning, head
from xlgen.finetune.tasks import get_task
from xlgen.models.family import Objective

NEG = -1e30


def num_labels(config) -> int:
    task = get_task(config.task)
    return 1 if task.kind in ("regression", "squad") else task.num_labels


def model_cfg(config):
    """The family's config dataclass for finetuning (`Finetuning.overrides`)."""
    record = registry.get(config.model.family).record(Finetuning)
    return registry.model_config(config, **(record.overrides(num_labels(config)) if record is not None else {}))


def make_model(config, rngs, train: bool):
    """The family's head for the task's kind (`Finetuning.heads`), with the config's LoRA adapters."""
    from xlgen.finetune.peft import attach_adapters

    task = get_task(config.task)
    family = registry.get(config.model.family)
    model = head(
        family,
        task.kind,
        model_cfg(config),
        num_labels=num_labels(config),
        answerability=task.version == "v2.0",
        rngs=rngs,
    )
    return attach_adapters(model, config, rngs)


def max_segments(config) -> int:
    """Segments per document (`max_segments`; 0 = one truncated window). Errors name the key when the task or
    the model family has no segment-recurrent head."""
    n = int(config.get("max_segments", 0) or 0)  # a config.json predating the key: 0
    if n < 0:
        raise ValueError(f"config.max_segments={n}: must be >= 0 (0 = truncate to one window)")
    if n:
        kind = get_task(config.task).kind
        family = registry.get(config.model.family)
        record = family.record(Finetuning)
        segment_heads = record.segment_heads if record is not None else ()
        if kind not in segment_heads:
            raise ValueError(
                f"config.max_segments={n}: task {config.task} ({kind}) on model.family={family.name!r} has no "
                f"segment-recurrent head (supported: {list(segment_heads) or 'none, no memory'})"
            )
    return n


def segment_kwargs(config) -> Dict[str, object]:
    """The head's keyword arguments for N segments: {} when `max_segments` is 0."""
    if not max_segments(config):
        return {}
    ft = config.finetune
    return {"mem_len": int(ft.mem_len) or int(config.data.max_seq_length), "segment_pool": str(ft.segment_pool)}


PACKED_KINDS = ("classification", "regression", "token_classification")


def packing(config) -> bool:
    """Whether training batches are packed (`finetune.packing`, `xlgen.finetune.packing`): for the task kinds in
    PACKED_KINDS on one window (`max_segments` = 0); other tasks read one example per row."""
    ft = config.get("finetune") or {}  # a config.json predating the section: no packing
    return bool(ft.get("packing", False)) and get_task(config.task).kind in PACKED_KINDS and not max_segments(config)


def pack_size(config) -> int:
    """E: the most examples one packed row holds (`finetune.pack_size`)."""
    n = int(config.finetune.pack_size)
    if n < 1:
        raise ValueError(f"config.finetune.pack_size={n}: must be >= 1")
    return n


def batch_shapes(config, split: str):
    task = get_task(config.task)
    d = config.data
    b = int(d.batch_size) if split == "train" else int(d.eval_batch_size)
    L = int(d.max_seq_length)
    i32, f32 = jnp.int32, jnp.float32
    if split == "train" and packing(config):  # packed rows (xlgen.finetune.packing)
        spec = {k: ((b, L), i32) for k in ("input_ids", "token_type_ids", "attention_mask", "pack_ids")}
        if task.kind == "token_classification":
            spec.update({"labels": ((b, L), i32), "label_mask": ((b, L), f32)})
        else:
            E = pack_size(config)
            spec.update({"cls_index": ((b, E), i32), "example_mask": ((b, E), f32)})
            spec["labels"] = ((b, E), f32 if task.kind == "regression" else i32)
        return spec
    seq = (max_segments(config), L) if max_segments(config) else (L,)  # [N, L]: N segments with memory
    if task.kind == "multiple_choice":
        n = task.num_labels
        return {
            "input_ids": ((b, n) + seq, i32),
            "token_type_ids": ((b, n) + seq, i32),
            "attention_mask": ((b, n) + seq, i32),
            "labels": ((b,), i32),
        }
    spec = {"input_ids": ((b,) + seq, i32), "token_type_ids": ((b,) + seq, i32), "attention_mask": ((b,) + seq, i32)}
    if task.kind == "squad":
        spec.update(
            {
                "p_mask": ((b, L), f32),
                "cls_index": ((b,), i32),
                "start_positions": ((b,), i32),
                "end_positions": ((b,), i32),
                "is_impossible": ((b,), f32),
            }
        )
    elif task.kind == "token_classification":
        spec.update({"labels": ((b, L), i32), "label_mask": ((b, L), f32)})
    else:
        spec["labels"] = ((b,), f32 if task.kind == "regression" else i32)
    return spec


def forward(model, batch, config, *, train: bool) -> Dict[str, jax.Array]:
    """Task outputs. Training SQuAD: start/end log-probs at every position (XLNet: ends conditioned on the gold
    start) and cls_logits. Inference SQuAD: the beam arrays (XLNet) or start/end/cls logits (Funnel)."""
    task = get_task(config.task)
    fam = config.model.family
    common = dict(token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"])
    if task.kind != "squad":
        packed = {k: batch[k] for k in ("pack_ids", "cls_index") if k in batch}  # packed rows: per-example heads
        out = model(batch["input_ids"], **common, **packed, **segment_kwargs(config))
        logits = out[0] if isinstance(out, tuple) else out.logits  # XLNet: (logits, mems); Funnel: FunnelOutput
        return {"logits": logits.astype(jnp.float32)}
    record = registry.get(fam).record(Finetuning)
    if record is None or record.squad_outputs is None:
        raise ValueError(f"model.family={fam!r}: no SQuAD head")
    return record.squad_outputs(model, batch, train=train)


def _masked_log_softmax(logits, p_mask):
    return jax.nn.log_softmax(jnp.where(p_mask > 0, NEG, logits.astype(jnp.float32)), axis=-1)


def answer_log_prob(outputs: Dict[str, jax.Array], batch) -> jax.Array:
    """log P(a | p, q) = log P(start) + log P(end | start) [b] of the batch's answer span, both softmaxes over the
    positions with p_mask = 0 (XLNet's end logits are conditioned on the gold start). SQuAD's loss is -1/2 of it."""
    p_mask = batch["p_mask"]
    s_lp = _masked_log_softmax(outputs["start_logits"], p_mask)
    e_lp = _masked_log_softmax(outputs["end_logits"], p_mask)
    take = lambda lp, pos: jnp.take_along_axis(lp, jnp.asarray(pos, jnp.int32)[:, None], axis=-1)[:, 0]
    return take(s_lp, batch["start_positions"]) + take(e_lp, batch["end_positions"])


def task_loss(outputs: Dict[str, jax.Array], batch, config) -> jax.Array:
    """Per-example loss [b]."""
    task = get_task(config.task)
    if task.kind == "regression":
        return (outputs["logits"][..., 0] - batch["labels"]) ** 2
    if task.kind in ("classification", "multiple_choice"):
        return optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["labels"])
    if task.kind == "token_classification":
        # HF's loss: the mean over the batch's labelled pieces (each word's first piece); as a per-example value
        # whose batch mean is that token mean
        w = batch["label_mask"]
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["labels"]) * w
        return ce.sum(-1) * (w.shape[0] / jnp.maximum(w.sum(), 1.0))
    loss = -answer_log_prob(outputs, batch) / 2
    if "cls_logits" in outputs:
        loss = loss + 0.5 * optax.sigmoid_binary_cross_entropy(outputs["cls_logits"], batch["is_impossible"])
    return loss


def _loss(model, batch, mems, rng, config):
    del mems, rng
    per_example = task_loss(forward(model, batch, config, train=True), batch, config)
    if "example_mask" in batch:  # packed rows: [b, E], the mean over the real examples
        w = batch["example_mask"]
        return (per_example * w).sum() / jnp.maximum(w.sum(), 1.0), {}, None
    return per_example.mean(), {}, None


def _eval_loss(model, batch, mems, config):
    del mems
    per_example = task_loss(forward(model, batch, config, train=True), batch, config)
    w = batch.get("weights", jnp.ones_like(per_example))
    return (per_example * w).sum(), w.sum(), None


def _tokens(config):
    spec = batch_shapes(config, "train")
    shape = spec["input_ids"][0]
    n = 1
    for s in shape:
        n *= s
    return n


# Shared by every family with finetuning heads: `xlgen.registry.SHARED_OBJECTIVES["finetune"]`.
FINETUNE = Objective(
    name="finetune",
    make_model=make_model,
    batch_shapes=batch_shapes,
    loss=_loss,
    eval_loss=_eval_loss,
    tokens_per_step=_tokens,
)
