"""Prediction and task metrics: the jitted eval-mode predictor, official metrics per dev split, the prediction
artefacts to write (`outputs.py` writes them)."""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import numpy as np


class Predictor:
    """Jitted eval-mode forward over a split; returns host NumPy outputs for the real rows."""

    def __init__(self, program):
        import jax

        from xlgen import sharding
        from xlgen.finetune.objective import batch_shapes, forward
        from xlgen.models.params import concrete_rest, materialize

        self.program = program
        config = program.config
        spec = program.eval_spec
        self.bspec = batch_shapes(config, "eval")
        self.shardings = {k: sharding.batch_sharding(program.mesh, len(s)) for k, (s, _) in self.bspec.items()}
        rest = concrete_rest(spec.rest)
        rep = sharding.replicated(program.mesh)

        def predict(params, batch):
            model = materialize(spec.abstract, params, rest=rest)
            return forward(model, batch, config, train=False)

        self._predict = jax.jit(predict, in_shardings=(program.param_shardings, self.shardings), out_shardings=rep)

    def __call__(self, params, features: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Outputs for every row of `features` (eval batches padded; padding rows dropped)."""
        import jax

        from xlgen import sharding
        from xlgen.finetune.readers.pipeline import eval_batches
        from xlgen.train.loop import global_batch

        gb = self.bspec["input_ids"][0][0]
        r0, r1 = sharding.addressable_batch_rows(self.program.mesh, gb)
        n = len(features["input_ids"])
        outs: Dict[str, list] = {}
        for b in eval_batches(features, gb, keys=set(self.bspec)):
            local = {k: v[r0:r1] for k, v in b.items() if k in self.bspec}
            out = jax.device_get(self._predict(params, global_batch(local, self.shardings, self.bspec)))
            for k, v in out.items():
                outs.setdefault(k, []).append(np.asarray(v))
        return {k: np.concatenate(v)[:n] for k, v in outs.items()}


def evaluate_split(config, task, examples, features, outputs, split: str) -> Tuple[Dict[str, float], Dict[str, Any]]:
    """Task metrics of one dev split and the prediction artefacts to write."""
    from xlgen.finetune import metrics as M
    from xlgen.finetune import squad_decode, squad_eval

    arts: Dict[str, Any] = {}
    if task.kind == "squad":
        beam = outputs
        if "start_top_index" not in outputs:
            beam = squad_decode.logits_to_beam(
                outputs["start_logits"],
                outputs["end_logits"],
                features["p_mask"],
                start_n_top=int(config.squad.start_n_top),
                end_n_top=int(config.squad.end_n_top),
            )
            if "cls_logits" in outputs:
                beam["cls_logits"] = outputs["cls_logits"]
        k1 = beam["start_top_index"].shape[1]
        k2 = beam["end_top_index"].shape[1] // k1
        preds, null_odds, nbest = squad_decode.decode(
            examples,
            features,
            beam,
            start_n_top=k1,
            end_n_top=k2,
            max_answer_length=int(config.squad.max_answer_length),
            n_best_size=int(config.squad.n_best_size),
        )
        gold = {e.qas_id: [a for a, _ in e.answers] for e in examples}
        if task.version == "v1.1":
            res = squad_eval.evaluate_v1(gold, preds)
            final = preds
        else:
            raw = squad_eval.evaluate_v2(gold, preds, null_odds)
            thresh = squad_eval.best_f1_null_threshold(gold, preds, null_odds)
            final = squad_decode.apply_null_threshold(preds, null_odds, thresh)
            res = squad_eval.evaluate_v2(gold, final)
            res.update({k: raw[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")})
            arts["null_odds.json"] = null_odds
        arts["predictions.json"] = final
        arts["nbest_predictions.json"] = nbest
        return {k: float(v) for k, v in res.items()}, arts
    if task.kind == "token_classification":
        from seqeval.metrics import f1_score, precision_score, recall_score
        from seqeval.scheme import IOB2

        from xlgen.finetune.readers.conll import conll_text, word_predictions

        pred = outputs["logits"].argmax(-1)
        names = task.label_names
        y_pred = [word_predictions(e, w, p, names) for e, w, p in zip(examples, features["word_index"], pred)]
        y_true = [list(e.tags) for e in examples]
        kw = dict(mode="strict", scheme=IOB2, zero_division=0)
        res = {
            "precision": float(precision_score(y_true, y_pred, **kw)),
            "recall": float(recall_score(y_true, y_pred, **kw)),
            "f1": float(f1_score(y_true, y_pred, **kw)),
        }
        arts["predictions.txt"] = conll_text(examples, y_pred)
        return res, arts
    labels = features["labels"]
    if task.kind == "regression":
        pred = outputs["logits"][:, 0]
        res = M.compute(task.metrics, labels, pred)
        arts["dev_predictions.tsv"] = (
            ["index", "prediction", "label"],
            [[e.guid, f"{p:.4f}", f"{l:.4f}"] for e, p, l in zip(examples, pred, labels)],
        )
        return res, arts
    pred = outputs["logits"].argmax(-1)
    if task.kind == "multiple_choice":
        res = M.race_accuracy(labels, pred, features["level"])
    else:
        res = M.compute(task.metrics, labels, pred)
    names = task.label_names
    arts["dev_predictions.tsv"] = (
        ["index", "prediction", "label"],
        [[e.guid, names[int(p)], names[int(l)]] for e, p, l in zip(examples, pred, labels)],
    )
    return res, arts


def _suffix(task, split: str) -> str:
    """MNLI's second dev split is reported with an `_mm` suffix (accuracy_mm)."""
    return "_mm" if split == "dev_mismatched" else ""


def run_evaluation(config, predictor, params, data: Dict[str, Any], step: int) -> Tuple[Dict[str, float], Dict]:
    from xlgen.finetune.tasks import get_task

    task = get_task(config.task)
    results: Dict[str, float] = {}
    artefacts: Dict[str, Any] = {}
    for split in task.eval_splits:
        examples, feats = data[split]
        outputs = predictor(params, feats)
        res, arts = evaluate_split(config, task, examples, feats, outputs, split)
        sfx = _suffix(task, split)
        results.update({f"{k}{sfx}": v for k, v in res.items()})
        for name, a in arts.items():
            stem, ext = os.path.splitext(name)
            artefacts[f"{stem}{sfx}{ext}"] = a
    results["step"] = step
    return results, artefacts
