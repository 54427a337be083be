"""`xlgen finetune`: train a pretrained XLNet / Funnel model on GLUE, SQuAD, RACE or long-text classification.

    xlgen finetune --config=configs/finetune/glue.py --config.task=glue/mrpc --config.data_dir=DATA/MRPC \
                   --config.init_from=PRETRAINED --workdir=DIR

1. The model architecture comes from `init_from` (a Hugging Face directory: config.json + weights; or an xlgen
   workdir / `workdir/checkpoints/<step>`), then command-line `--config.model.*` overrides (e.g. dropout) apply.
   Parameters are restored by name where the shapes agree (partial restore); task heads that do not exist in the
   pretrained model start fresh. `init_from=""` starts from random weights (smoke tests).
2. Data: the task's official files in `data_dir` are read (`data_pipelines.tasks`), tokenized with `tokenizer`
   (default: `spiece.model` / `vocab.txt` found in `init_from`) in the model family's input convention, and
   cached as `.npz` under `DIR/cache/` keyed by everything that affects them.
3. Training reuses the trainer's program (`build_program`: sharding, jitted/donated step, optimizer with warmup,
   decay, clipping and layer-wise LR decay), checkpoints (`DIR/checkpoints/`, resumable by re-running) and
   metrics writer (`DIR/metrics.jsonl`, TensorBoard).
4. Every `eval_every_steps` and at the end the dev split(s) are evaluated with the task's official metrics. The best
   checkpoint by the task's primary metric is kept in `DIR/best/`, and for it `DIR/eval_results.json` and the
   prediction files are written (temp file + rename): GLUE `dev_predictions*.tsv` and submission TSVs
   (`submission/<Task>.tsv` predicted on test.tsv), SQuAD `predictions.json`, `null_odds.json`,
   `nbest_predictions.json`, RACE/classification `dev_predictions.tsv`.

`xlgen eval --config=... --workdir=DIR` on a finetune workdir (or `xlgen finetune --eval_only ...`) re-evaluates
the best (else latest) checkpoint: `evaluate(config, workdir)`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import logging
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

log = logging.getLogger("xlgen")

EVAL_RESULTS = "eval_results.json"


# ----------------------------------------------------------------------------------------------------------------
# Config resolution: architecture from init_from
# ----------------------------------------------------------------------------------------------------------------


def _is_hf_dir(path: str) -> Optional[dict]:
    from data_pipelines import paths

    cfg = paths.as_path(path) / "config.json"
    if not cfg.exists():
        return None
    try:
        d = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg}: invalid JSON ({e})") from e
    return d if ("model_type" in d and "xlgen" not in d) else None


def _split_checkpoint_path(path: str) -> Tuple[str, Optional[int]]:
    """`workdir` -> (workdir, None = best/latest); `workdir/checkpoints/<step>` -> (workdir, step)."""
    from data_pipelines import paths

    p = paths.as_path(path)  # local (absolute) or gs://
    if p.name.isdigit() and p.parent.name in ("checkpoints", "best"):
        return str(p.parent.parent), int(p.name)
    return str(p), None


def pretrained_model_section(init_from: str) -> Dict[str, Any]:
    """The `config.model` dict (with `family`) of the model stored at `init_from`."""
    from data_pipelines import paths
    from xlgen import config as config_lib

    if not paths.as_path(init_from).is_dir():
        raise FileNotFoundError(f"init_from={init_from}: not a directory (a HF model directory or an xlgen workdir)")
    hf = _is_hf_dir(init_from)
    if hf is not None:
        import dataclasses

        mt = hf["model_type"]
        if mt == "xlnet":
            from xlgen.models.xlnet import XLNetConfig

            cfg, fam = XLNetConfig.from_hf(hf), "xlnet"
        elif mt == "funnel":
            from xlgen.models.funnel import FunnelConfig

            cfg, fam = FunnelConfig.from_hf(hf), "funnel"
        else:
            raise ValueError(
                f"{init_from}/config.json: model_type={mt!r} cannot be finetuned here (supported: xlnet, funnel)"
            )
        d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        return {"family": fam, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}}
    workdir, _ = _split_checkpoint_path(init_from)
    old = config_lib.read_workdir_config(workdir)
    if old is None:
        raise FileNotFoundError(f"init_from={init_from}: no config.json (neither a HF directory nor an xlgen workdir)")
    return old.model.to_dict()


def resolve_config(config, model_overrides: Dict[str, str] = ()):
    """Fill derived keys and take the architecture from `init_from` (command-line model.* overrides re-applied)."""
    from ml_collections import ConfigDict

    import xlgen.tasks.objective  # noqa: F401  (registers the "finetune" objective with the trainer)
    from xlgen import config as config_lib
    from xlgen.tasks import get_task

    task = get_task(config.task)  # unknown task -> error listing the known ones
    if config.init_from:
        section = pretrained_model_section(config.init_from)
        with config.unlocked():
            config.model = ConfigDict(config_lib._tuplify(section), type_safe=True)
    for k, v in dict(model_overrides).items():
        config_lib.apply_override(config, f"model.{k}", v)
    with config.unlocked():
        config.objective = "finetune"
        L = int(config.data.max_seq_length)
        config.data.seq_len = L * (task.num_labels if task.kind == "multiple_choice" else 1)  # FLOPs accounting
        config.data.num_predict = 0
    return config


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def _local_tokenizer_file(path: str) -> str:
    """A remote tokenizer file or model directory (gs://) -> a local cached copy of its tokenizer file."""
    from data_pipelines import paths

    p = paths.as_path(path)
    if not paths.is_remote(p):
        return path
    if p.is_dir():
        for name in ("spiece.model", "tokenizer.model", "vocab.txt"):
            if (p / name).exists():
                p = p / name
                break
        else:
            raise FileNotFoundError(f"{p}: no spiece.model, tokenizer.model or vocab.txt in this directory")
    data = p.read_bytes()
    local = os.path.join(paths.cache_dir("tokenizers", hashlib.sha256(data).hexdigest()[:16]), p.name)
    if not os.path.exists(local):
        paths.atomic_write_bytes(local, data)
    return local


def load_tokenizer(config):
    from data_pipelines.tasks.tokenization import load_task_tokenizer

    path = config.tokenizer or (config.init_from if config.init_from else "")
    if not path:
        raise ValueError("config.tokenizer is empty and there is no init_from to find spiece.model / vocab.txt in")
    lower = None if config.data.lower is None else bool(config.data.lower)
    tok = load_task_tokenizer(_local_tokenizer_file(path), lower=lower)
    # The input layout follows the model: XLNet (<cls> last, left padding) or Funnel/BERT (<cls> first).
    tok.style = "xlnet" if config.model.family == "xlnet" else "funnel"
    if tok.vocab_size > int(config.model.vocab_size):
        raise ValueError(f"tokenizer {path} has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}")
    return tok


def _files_fingerprint(data_dir: str) -> str:
    h = hashlib.sha1()
    if data_dir.startswith("tfds:"):
        return hashlib.sha1(data_dir.encode()).hexdigest()[:16]
    for root, _, files in sorted(os.walk(data_dir)):
        for name in sorted(files):
            p = os.path.join(root, name)
            st = os.stat(p)
            h.update(f"{os.path.relpath(p, data_dir)}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def localize_data_dir(config):
    """A copy of `config` whose `data_dir` is local: a gs:// data_dir is mirrored into the local cache
    (task readers read plain files; GLUE/SQuAD/RACE directories are small)."""
    from data_pipelines import paths

    if not config.get("data_dir") or str(config.data_dir).startswith("tfds:") or not paths.is_remote(config.data_dir):
        return config
    local = copy.deepcopy(config)
    with local.unlocked():
        local.data_dir = paths.local_dir_copy(config.data_dir, subdir="task_data")
    return local


def _load_npz(path: str) -> Optional[Dict[str, np.ndarray]]:
    from data_pipelines import paths

    p = paths.as_path(path)
    if not p.exists():
        return None
    with np.load(io.BytesIO(p.read_bytes()) if paths.is_remote(p) else str(p)) as z:
        return {k: z[k] for k in z.files}


def _save_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:
    from data_pipelines import paths

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    paths.makedirs(paths.as_path(path).parent)
    paths.atomic_write_bytes(path, buf.getvalue())


def split_examples_and_features(config, tokenizer, split: str, workdir: Optional[str]):
    """(examples, features) of `split`, features cached in `workdir/cache/`."""
    from data_pipelines.tasks.features import choice_features, text_features
    from data_pipelines.tasks.squad import squad_features
    from xlgen.tasks import get_task

    task = get_task(config.task)
    d = config.data
    examples = task.read(config.data_dir, split, skip_malformed=bool(d.skip_malformed))
    if not examples:
        raise ValueError(f"{config.data_dir}: split {split!r} of {task.name} has no examples")
    key = json.dumps(
        {
            "task": task.name,
            "split": split,
            "files": _files_fingerprint(config.data_dir),
            "tok": [
                config.tokenizer or config.init_from,
                tokenizer.vocab_size,
                tokenizer.style,
                getattr(tokenizer, "lower", None),
            ],
            "data": {k: d[k] for k in ("max_seq_length", "doc_stride", "max_query_length", "max_qa_length")},
        },
        sort_keys=True,
    )
    cache = None
    if workdir and d.cache:
        from data_pipelines import paths

        cache = paths.join(workdir, "cache", f"{split}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz")
        cached = _load_npz(cache)
        if cached is not None:
            return examples, cached
    if task.kind == "squad":
        feats = squad_features(
            examples,
            tokenizer,
            max_seq_length=int(d.max_seq_length),
            doc_stride=int(d.doc_stride),
            max_query_length=int(d.max_query_length),
            is_training=split == "train",
        )
    elif task.kind == "multiple_choice":
        feats = choice_features(
            examples, tokenizer, max_seq_length=int(d.max_seq_length), max_qa_length=int(d.max_qa_length)
        )
    else:
        feats = text_features(
            examples, tokenizer, max_seq_length=int(d.max_seq_length), regression=task.kind == "regression"
        )
    if cache and _is_main():
        _save_npz(cache, feats)
    return examples, feats


def _is_main() -> bool:
    import jax

    return jax.process_index() == 0


# ----------------------------------------------------------------------------------------------------------------
# Initialisation from pretrained weights (partial restore)
# ----------------------------------------------------------------------------------------------------------------


def _module_params(module) -> Dict[str, np.ndarray]:
    from flax import nnx

    _, params, _ = nnx.split(module, nnx.Param, ...)
    return {
        ".".join(str(getattr(p, "key", p)) for p in path): np.asarray(
            v.get_value() if hasattr(v, "get_value") else v.value
        )
        for path, v in nnx.to_flat_state(params)
    }


def pretrained_params(init_from: str) -> Dict[str, np.ndarray]:
    """Flat {name: array} of the pretrained model (HF directory via `xlgen.from_pretrained`, or the best/latest
    checkpoint of an xlgen workdir)."""
    if _is_hf_dir(init_from) is not None:
        import xlgen

        loaded = xlgen.from_pretrained(init_from)
        module = getattr(loaded, "module", None) or getattr(loaded, "model", None) or loaded  # Funnel / XLNet
        return _module_params(module)
    import jax

    from xlgen import config as config_lib
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.train.program import build_program

    workdir, step = _split_checkpoint_path(init_from)
    old = config_lib.read_workdir_config(workdir)
    if old.get("objective") == "finetune":
        import xlgen.tasks.objective  # noqa: F401  (registers the objective)
    mesh = sharding.make_mesh(old.mesh)
    program = build_program(old, mesh)
    from data_pipelines import paths

    sub = "best" if step is None and paths.as_path(workdir).joinpath("best").is_dir() else "checkpoints"
    ckpt = Checkpointer(paths.join(workdir, sub), keep=0, async_save=False)
    with jax.set_mesh(mesh):
        if step is None:
            restored = ckpt.restore_latest(program.abstract_state(), None)
            if restored is None:
                raise FileNotFoundError(f"{workdir}/{sub}: no checkpoint to initialise from")
            state = restored[0]
        else:
            state = ckpt.restore(step, program.abstract_state(), None)[0]
    ckpt.close()
    return {k: np.asarray(jax.device_get(v)) for k, v in state["params"].items()}


def match_pretrained(
    target_shapes: Dict[str, Tuple[int, ...]], source: Dict[str, np.ndarray]
) -> Tuple[Dict[str, str], List[str], List[str]]:
    """Map task-model parameter names to pretrained names with equal shapes: the same name, else the same name
    below its top-level module on either side (`transformer.x` <-> `x`, `funnel.x` <-> `discriminator.funnel.x` of
    an ELECTRA workdir). Among several candidates the one with the fewest dropped components wins, then the
    alphabetically first (ELECTRA: discriminator before generator). Returns (target->source, fresh, unused)."""

    def suffixes(n, max_drop=3):
        parts = n.split(".")
        return [".".join(parts[k:]) for k in range(min(max_drop, len(parts) - 1) + 1)]

    index: Dict[str, List[Tuple[int, str]]] = {}
    for n in sorted(source):
        for k, suf in enumerate(suffixes(n)):
            index.setdefault(suf, []).append((k, n))
    mapping, fresh, used = {}, [], set()
    for t, shape in target_shapes.items():
        best = None
        for kt, suf in enumerate(suffixes(t, 1)):
            for ks, n in index.get(suf, []):
                if n in used or tuple(source[n].shape) != tuple(shape):
                    continue
                key = (kt + ks, n)
                if best is None or key < best:
                    best = key
        if best is None:
            fresh.append(t)
        else:
            mapping[t] = best[1]
            used.add(best[1])
    unused = [n for n in source if n not in used]
    return mapping, fresh, unused


def load_pretrained_into(state, program, source: Dict[str, np.ndarray], init_from: str = "init_from"):
    """Overwrite `state["params"]` with the pretrained values `source` (`pretrained_params(init_from)`, read
    outside any `jax.set_mesh` context) resharded like the current parameters. Returns (state, report)."""
    import jax

    shapes = program.train_spec.shapes
    mapping, fresh, unused = match_pretrained(shapes, source)
    if not mapping:
        raise ValueError(
            f"init_from={init_from}: no parameter matches the task model by name and shape "
            f"(pretrained has e.g. {sorted(source)[:5]}, the task model {sorted(shapes)[:5]})"
        )
    shardings = program.state_shardings["params"]
    params = dict(state["params"])
    for t, s in mapping.items():
        params[t] = jax.device_put(source[s].astype(np.dtype(program.train_spec.dtypes[t])), shardings[t])
    state = dict(state)
    state["params"] = params
    report = {"loaded": len(mapping), "fresh": fresh, "unused": unused}
    return state, report


# ----------------------------------------------------------------------------------------------------------------
# Prediction and evaluation
# ----------------------------------------------------------------------------------------------------------------


class Predictor:
    """Jitted eval-mode forward over a split; returns host NumPy outputs for the real rows."""

    def __init__(self, program):
        import jax

        from xlgen import sharding
        from xlgen.tasks.objective import batch_spec, forward
        from xlgen.train.program import concrete_rest, merge_model

        self.program = program
        config = program.config
        spec = program.eval_spec
        self.bspec = batch_spec(config, "eval")
        self.shardings = {k: sharding.batch_sharding(program.mesh, len(s)) for k, (s, _) in self.bspec.items()}
        rest = concrete_rest(spec.rest)
        rep = sharding.replicated(program.mesh)

        def predict(params, batch):
            model = merge_model(spec, params, rest)
            return forward(model, batch, config, train=False)

        self._predict = jax.jit(
            predict, in_shardings=(program.state_shardings["params"], self.shardings), out_shardings=rep
        )

    def __call__(self, params, features: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Outputs for every row of `features` (eval batches padded; padding rows dropped)."""
        import jax

        from data_pipelines.tasks.pipeline import eval_batches
        from xlgen import sharding
        from xlgen.train.loop import global_batch

        gb = self.bspec["input_ids"][0][0]
        r0, r1 = sharding.process_rows(self.program.mesh, gb)
        n = len(features["input_ids"])
        outs: Dict[str, list] = {}
        for b in eval_batches(features, gb, keys=set(self.bspec)):
            local = {k: v[r0:r1] for k, v in b.items() if k in self.bspec}
            out = jax.device_get(self._predict(params, global_batch(local, self.shardings, self.bspec)))
            for k, v in out.items():
                outs.setdefault(k, []).append(np.asarray(v))
        return {k: np.concatenate(v)[:n] for k, v in outs.items()}


def _write_text(path: str, text: str) -> None:
    """Atomic write, local (temp + fsync + rename) or gs:// (one object upload)."""
    from data_pipelines import paths
    from xlgen.tasks.atomic import atomic_write_text

    if paths.is_remote(path):
        paths.atomic_write_text(path, text)
    else:
        atomic_write_text(path, text)


def _write_json(path: str, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_tsv(path: str, header: List[str], rows: List[List[Any]]) -> None:
    _write_text(path, "\n".join(["\t".join(header)] + ["\t".join(str(x) for x in r) for r in rows]) + "\n")


def evaluate_split(config, task, examples, features, outputs, split: str) -> Tuple[Dict[str, float], Dict[str, Any]]:
    """Task metrics of one dev split and the prediction artefacts to write."""
    from xlgen.tasks import metrics as M
    from xlgen.tasks import squad_decode, squad_eval

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
    from xlgen.tasks import get_task

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


def write_artefacts(workdir: str, results: Dict[str, Any], artefacts: Dict[str, Any]) -> None:
    from data_pipelines import paths

    for name, a in artefacts.items():
        path = paths.join(workdir, name)
        if name.endswith(".json"):
            _write_json(path, a)
        else:
            _write_tsv(path, *a)
    _write_json(paths.join(workdir, EVAL_RESULTS), results)


def write_test_predictions(config, predictor, params, tokenizer, workdir: str) -> List[str]:
    """GLUE submission files from the test split(s), when the test files exist."""
    from data_pipelines import paths
    from xlgen.tasks import get_task
    from xlgen.tasks.submission import glue_submission_text

    task = get_task(config.task)
    written = []
    if not task.name.startswith("glue/"):
        return written
    from data_pipelines.tasks.glue import glue_file

    for split in task.test_splits:
        if not os.path.exists(glue_file(task.name[5:], config.data_dir, split)):
            continue
        examples, feats = split_examples_and_features(config, tokenizer, split, workdir)
        out = predictor(params, feats)
        preds = out["logits"][:, 0] if task.kind == "regression" else out["logits"].argmax(-1)
        stem = task.submission
        if task.name == "glue/mnli":
            stem = "MNLI-mm" if split == "test_mismatched" else "MNLI-m"
        path = paths.join(workdir, "submission", f"{stem}.tsv")
        paths.makedirs(paths.as_path(path).parent)
        _write_text(path, glue_submission_text(task.label_names, [e.guid for e in examples], preds))
        written.append(path)
    return written


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def _better(task, new: Dict[str, float], old: Optional[Dict[str, float]]) -> bool:
    if old is None:
        return True
    return new[task.primary_metric] > old[task.primary_metric]


def _read_results(workdir: str) -> Optional[Dict[str, Any]]:
    from data_pipelines import paths

    p = paths.as_path(workdir) / EVAL_RESULTS
    if not p.exists():
        return None
    return json.loads(p.read_text())


def write_finetune_config(config, workdir: str) -> None:
    from data_pipelines import paths
    from xlgen import __version__
    from xlgen import config as config_lib

    paths.makedirs(workdir)
    d = config_lib.to_json_dict(config)
    d["xlgen"] = {"version": __version__, "kind": "finetune"}
    config_lib.write_json_atomic(paths.join(workdir, "config.json"), d)


def finetune(config, workdir: str) -> Dict[str, Any]:
    """Train (or resume) to config.total_steps with dev evaluation; returns the best eval results."""
    import jax

    import xlgen.tasks.objective  # noqa: F401  (registers the "finetune" objective)
    from data_pipelines import paths
    from data_pipelines.tasks.pipeline import FeaturePipeline
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.tasks import get_task
    from xlgen.train import metrics as metrics_lib
    from xlgen.train.loop import global_batch
    from xlgen.train.program import build_program

    workdir = paths.display(workdir)  # absolute if local; a URL stays a URL
    task = get_task(config.task)
    is_main = _is_main()
    if is_main:
        write_finetune_config(config, workdir)
    config = localize_data_dir(config)  # after writing: config.json keeps the gs:// data_dir
    tokenizer = load_tokenizer(config)
    t0 = time.time()
    _, train_feats = split_examples_and_features(config, tokenizer, "train", workdir)
    dev = {s: split_examples_and_features(config, tokenizer, s, workdir) for s in task.eval_splits}
    if is_main:
        print(
            f"{task.name}: {len(train_feats['input_ids'])} train features, "
            + ", ".join(f"{len(v[1]['input_ids'])} {s}" for s, v in dev.items())
            + f" ({time.time() - t0:.1f}s)",
            flush=True,
        )

    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    total = int(config.total_steps)
    ckpt = Checkpointer(
        paths.join(workdir, "checkpoints"),
        keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save),
    )
    best_ckpt = Checkpointer(paths.join(workdir, "best"), keep=1, async_save=False)
    writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, tensorboard=bool(config.get("tensorboard", True)))
    best = _read_results(workdir)

    source = None
    if config.init_from and not ckpt.all_steps():
        source = pretrained_params(config.init_from)
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), None)
        if restored is not None:
            state, _, _, start = restored
            if is_main:
                metrics_lib.truncate_after(writer.path, start)
                print(f"resumed from {ckpt.directory}/{start}", flush=True)
        else:
            state, _ = program.init_state()
            start = 0
            if source is not None:
                state, report = load_pretrained_into(state, program, source, config.init_from)
                if is_main:
                    print(
                        f"init_from {config.init_from}: {report['loaded']} tensors loaded; fresh: "
                        f"{report['fresh'] or 'none'}; unused: {len(report['unused'])}",
                        flush=True,
                    )
            best = None
        bspec = program.objective.batch_spec(config, "train")
        gb = bspec["input_ids"][0][0]
        r0, r1 = sharding.process_rows(mesh, gb)
        keys = set(bspec)
        pipe = FeaturePipeline(train_feats, global_batch_size=gb, seed=int(config.seed), keys=keys)
        predictor = Predictor(program)
        eval_every = int(config.eval_every_steps)
        every = int(config.checkpoint.every_steps)
        log_every = max(int(config.log_every_steps), 1)
        progress = metrics_lib.Progress(total, start, enabled=is_main)
        tokens = program.tokens_per_step

        def do_eval(step):
            nonlocal best
            res, arts = run_evaluation(config, predictor, state["params"], dev, step)
            writer.write({"step": step, "split": "dev", **{k: v for k, v in res.items() if k != "step"}})
            progress.message(f"eval @ step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items() if k != "step"))
            if _better(task, res, best):
                best = res
                best_ckpt.save(step, state, None, {"step": step, "task": task.name, "results": res})
                best_ckpt.wait()
                if is_main:
                    write_artefacts(workdir, res, arts)
                    if bool(config.eval.predict_test):
                        write_test_predictions(config, predictor, state["params"], tokenizer, workdir)

        t_last, s_last = time.time(), start
        try:
            for s in range(start, total):
                local = pipe.batch(s)
                local = {k: v[r0:r1] for k, v in local.items()} if (r1 - r0) != gb else local
                batch = global_batch(local, program.batch_shardings, bspec)
                state, _, m = program.train_step(state, batch, None)
                step = s + 1
                if step % log_every == 0 or step == total:
                    vals = {k: float(v) for k, v in jax.device_get(m).items()}
                    dt = max(time.time() - t_last, 1e-9)
                    rec = {"step": step, **vals, "tokens_per_sec": (step - s_last) * tokens / dt}
                    writer.write(rec)
                    progress.update(step, rec)
                    t_last, s_last = time.time(), step
                else:
                    progress.update(step)
                if (every > 0 and step % every == 0) or step == total:
                    writer.flush()  # records up to `step` are durable before its checkpoint (gs://: no append)
                    ckpt.save(step, state, None, {"step": step, "task": task.name})
                if eval_every > 0 and step % eval_every == 0 and step != total:
                    do_eval(step)
            if total > start or best is None:
                do_eval(max(total, start))
        finally:
            progress.close()
            ckpt.close()
            best_ckpt.close()
            writer.close()
    return best


def evaluate(config, workdir: str) -> Dict[str, Any]:
    """Re-evaluate a finetune workdir: the best checkpoint (else the latest) on the dev split(s); rewrites
    eval_results.json and the prediction files; returns the results."""
    import jax

    import xlgen.tasks.objective  # noqa: F401
    from data_pipelines import paths
    from xlgen import sharding
    from xlgen.checkpointing import Checkpointer
    from xlgen.tasks import get_task
    from xlgen.train.program import build_program

    workdir = paths.display(workdir)
    task = get_task(config.task)
    config = localize_data_dir(config)
    tokenizer = load_tokenizer(config)
    dev = {s: split_examples_and_features(config, tokenizer, s, workdir) for s in task.eval_splits}
    mesh = sharding.make_mesh(config.mesh)
    program = build_program(config, mesh)
    sub = "best" if paths.as_path(workdir).joinpath("best").is_dir() else "checkpoints"
    ckpt = Checkpointer(paths.join(workdir, sub), keep=0, async_save=False)
    with jax.set_mesh(mesh):
        restored = ckpt.restore_latest(program.abstract_state(), None)
        if restored is None:
            raise FileNotFoundError(f"{workdir}/{sub}: no checkpoint to evaluate")
        state, _, _, step = restored
        predictor = Predictor(program)
        res, arts = run_evaluation(config, predictor, state["params"], dev, step)
        if _is_main():
            write_artefacts(workdir, res, arts)
            if bool(config.eval.predict_test):
                write_test_predictions(config, predictor, state["params"], tokenizer, workdir)
    ckpt.close()
    return res


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------


def is_finetune_workdir(workdir: str) -> bool:
    """True if `workdir/config.json` was written by `xlgen finetune` (hook for `xlgen eval`)."""
    from data_pipelines import paths

    p = paths.as_path(workdir) / "config.json"
    try:
        if not p.exists():
            return False
        return json.loads(p.read_text()).get("xlgen", {}).get("kind") == "finetune"
    except (OSError, json.JSONDecodeError):
        return False


def load_finetune_config(config_path: Optional[str], overrides: Dict[str, str], workdir: str):
    """The config file with overrides (model.* overrides applied on top of the architecture read from
    init_from); with no config file, the workdir's stored config.json (re-evaluation)."""
    from xlgen import config as config_lib

    model_over = {k[len("model.") :]: v for k, v in overrides.items() if k.startswith("model.")}
    other = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    if config_path:
        config = config_lib.load_config(config_path, other)
        return resolve_config(config, model_over)
    config = config_lib.read_workdir_config(workdir)
    if config is None:
        raise config_lib.ConfigError(f"{workdir}: no config.json; pass --config=configs/finetune/<task>.py")
    for k, v in overrides.items():
        config_lib.apply_override(config, k, v)
    return config


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen import config as config_lib

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, rest = config_lib.parse_overrides(argv)
    except config_lib.ConfigError as e:
        print(f"xlgen finetune: error: {e}", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="xlgen finetune", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config",
        default=None,
        help="configs/finetune/<task>.py (omit with --eval_only to reuse the workdir's config.json)",
    )
    p.add_argument("--workdir", required=True)
    p.add_argument(
        "--eval_only",
        action="store_true",
        help="re-evaluate the workdir's best checkpoint (with the workdir's stored config.json when it has one)",
    )
    p.add_argument("--platform", default=None)
    p.add_argument("--distributed", default="auto", choices=("auto", "on", "off"))
    args = p.parse_args(rest)
    if not args.config and not args.eval_only:
        p.error("--config is required (unless --eval_only)")
    from xlgen.cli import _default_platform, setup_runtime

    config_path = args.config
    if args.eval_only and is_finetune_workdir(args.workdir):
        config_path = None  # the stored, resolved config is the truth for an existing run
    try:
        config = load_finetune_config(config_path, overrides, args.workdir)
    except (config_lib.ConfigError, ValueError, FileNotFoundError) as e:
        print(f"xlgen finetune: error: {e}", file=sys.stderr)
        return 2
    setup_runtime(args.platform or _default_platform(), args.distributed)
    try:
        res = evaluate(config, args.workdir) if args.eval_only else finetune(config, args.workdir)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"xlgen finetune: error: {e}", file=sys.stderr)
        return 2
    if _is_main():
        print(
            f"\n{config.task} @ step {res.get('step')}: "
            + "  ".join(f"{k} {v:.4f}" for k, v in res.items() if k != "step" and isinstance(v, float))
        )
        from data_pipelines import paths

        print(f"  results      {paths.join(args.workdir, EVAL_RESULTS)}", flush=True)
    return 0
