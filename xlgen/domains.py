"""Allowed values of every numeric config key and command-line flag, declared once, checked at config load.

    domains.problems(flat_items)              # {key: "must be ..."} of the keys outside their domain (config.validate)
    p.add_argument("--top_p", type=domains.flag(float, Range(0, 1, lo_open=True)), default=1.0)
    domains.KEYS["optimizer.lamb_*"] = Range(0)   # a new key: one line here (or `declare(...)` from its module)

`KEYS` maps a dotted key pattern (`fnmatch`: `*` matches across dots) to its `Domain`; the first pattern that
matches a key, in declaration order, is its domain, so specific patterns come before general ones. A numeric key
no pattern matches must still be finite (`FINITE`); tests/test_domains.py checks that every numeric key of every
shipped config matches a declared pattern. `None` is always allowed (a key's "not set"). A flag's domain is given
where the flag is defined (`flag(type, domain)` as its argparse `type`): a bad value is argparse's one-line usage
error naming the flag and the allowed range, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import math
from typing import Any, Callable, Dict, Optional, Sequence

INT32_MAX = 2**31 - 1  # steps are int32 in the train state


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclasses.dataclass(frozen=True)
class Range:
    """lo <= x <= hi (`lo_open` / `hi_open`: strict); None = unbounded. `text` replaces the generated wording."""

    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    text: str = ""

    def describe(self) -> str:
        if self.text:
            return self.text
        lo = None if self.lo is None else f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        hi = None if self.hi is None else f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return " and ".join(s for s in (lo, hi) if s) or "finite"

    def problem(self, value) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a number"
        if not math.isfinite(value):
            return "must be finite"
        low = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        return f"must be {self.describe()}" if low or high else None


@dataclasses.dataclass(frozen=True)
class Each:
    """A tuple of numbers, each in `item`; `min_len` items at least."""

    item: Range
    min_len: int = 1

    def describe(self) -> str:
        return f"a tuple of at least {self.min_len} number(s), each {self.item.describe()}"

    def problem(self, value) -> Optional[str]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = (value,)
        if not isinstance(value, (tuple, list)) or len(value) < self.min_len:
            return f"must be {self.describe()}"
        for v in value:
            if self.item.problem(v) is not None:
                return f"must be {self.describe()}"
        return None


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of `values` (e.g. a mesh size: -1 = fill, or a positive size)."""

    values: Sequence[Any] = ()
    otherwise: Optional[Range] = None  # or any value in this range
    text: str = ""

    def describe(self) -> str:
        if self.text:
            return self.text
        listed = ", ".join(map(str, self.values))
        return f"{listed} or {self.otherwise.describe()}" if self.otherwise else f"one of {listed}"

    def problem(self, value) -> Optional[str]:
        if value in self.values and not isinstance(value, bool):
            return None
        if self.otherwise is not None and self.otherwise.problem(value) is None:
            return None
        return f"must be {self.describe()}"


Domain = Any  # Range | Each | OneOf: `.problem(value) -> None | "must be ..."`, `.describe()`

FINITE = Range()
POSITIVE = Range(0, lo_open=True)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1)
DROP_RATE = Range(0, 1, hi_open=True)
STEPS = Range(0, INT32_MAX)
SEED = Range(0, 2**32, hi_open=True, text="an integer in [0, 2**32)")

# dotted key pattern -> domain; first match wins (specific patterns first)
KEYS: Dict[str, Domain] = {
    # ---- run length, intervals, guards (xlgen.config.base_config) ----
    "total_steps": Range(0, INT32_MAX, lo_open=True),
    "log_every_steps": Range(0, INT32_MAX, lo_open=True),
    "eval_every_steps": Range(-1, INT32_MAX),  # 0 = never, -1 = only at the end
    "aligner_steps": STEPS,
    "max_nonfinite_steps": STEPS,  # 0 = never stop
    "divergence_factor": NON_NEGATIVE,  # 0 = off
    "peak_flops_per_device": NON_NEGATIVE,
    "prefetch": STEPS,  # 0 = batches built in line
    "max_segments": NON_NEGATIVE,
    "lambda_*": NON_NEGATIVE,
    "seed": SEED,
    "*.seed": SEED,
    "*.split_seed": SEED,
    "data.label_seed": Range(-1, 2**32, hi_open=True),  # -1 = the split seed
    "checkpoint.every_steps": STEPS,
    "checkpoint.keep": NON_NEGATIVE,
    "checkpoint.local_every_steps": STEPS,
    "mesh.num_devices": NON_NEGATIVE,  # 0 = all
    "mesh.num_slices": Range(1),
    "mesh.*": OneOf((-1,), Range(1)),  # -1 = fill
    "profile.start_step": Range(-1, INT32_MAX),  # -1 = off
    "profile.num_steps": Range(1, INT32_MAX),
    "profile.top_ops": NON_NEGATIVE,
    "watchdog.*": NON_NEGATIVE,
    # ---- evaluation ----
    "eval.steps": Range(-1, INT32_MAX),  # -1 = the whole split
    "eval.mem_len": NON_NEGATIVE,
    "eval.clamp_len": Range(-1),  # -1 = no clamp
    "eval.tau": PROBABILITY,
    "eval.num_samples": POSITIVE,
    "eval.encoder_dim": POSITIVE,
    "eval.*": NON_NEGATIVE,
    # ---- optimizers (config.optimizer, a game's config.players.<name>) ----
    "*learning_rate": Range(0, lo_open=True, text="a finite number > 0"),
    "optimizer.warmup_steps": STEPS,
    "optimizer.grad_accum_steps": Range(1, INT32_MAX),
    "optimizer.poly_power": POSITIVE,
    "optimizer.min_lr_ratio": PROBABILITY,
    "optimizer.lr_layer_decay_rate": Range(0, 1, lo_open=True),
    "optimizer.adafactor.min_dim_size_to_factor": POSITIVE,
    "optimizer.adafactor.decay_rate": POSITIVE,
    "optimizer.adafactor.eps": NON_NEGATIVE,
    "optimizer.adafactor.momentum": Range(0, 1, hi_open=True, text="in [0, 1) (0 = no first moment)"),
    "optimizer.adafactor.clipping_threshold": OneOf((0,), Range(1), text="0 (off) or >= 1 (block-RMS clipping)"),
    "*.b1": DROP_RATE,
    "*.b2": DROP_RATE,
    "*.eps": POSITIVE,
    "*.weight_decay": NON_NEGATIVE,
    "*.clip_norm": NON_NEGATIVE,  # 0 = no clipping
    "*.decay_fraction": PROBABILITY,
    "*.decay_to": PROBABILITY,
    "objective_options.disc_coeff": NON_NEGATIVE,
    "objective_options.generator_width": Range(0, 1, lo_open=True),
    "objective_options.max_predictions": Range(-1),  # 0 = the pipeline's count, -1 = every position
    # ---- data pipelines (data_pipelines, finetuning, systems) ----
    "data.batch_size": POSITIVE,
    "data.eval_batch_size": POSITIVE,
    "data.*batch_size": NON_NEGATIVE,  # a labeled/unlabeled part may be 0
    "data.tgt_len": POSITIVE,
    "data.eval_tgt_len": POSITIVE,
    "data.max_seq_length": POSITIVE,
    "data.doc_stride": POSITIVE,
    "data.max_query_length": POSITIVE,
    "data.max_qa_length": POSITIVE,
    "data.*_fraction": PROBABILITY,
    "data.*_prob": PROBABILITY,
    "data.labeling_rate": PROBABILITY,
    "data.r1": PROBABILITY,
    "data.r2": PROBABILITY,
    "data.digit": Range(-1, 9),  # -1 = every digit
    "data.mask_alpha": POSITIVE,
    "data.mask_beta": POSITIVE,
    "data.max_gram": POSITIVE,
    "data.perm_size": POSITIVE,
    "data.labels_per_class": POSITIVE,
    "data.q": POSITIVE,
    "data.d": Range(2),  # window 0 < |j - k| < d
    "data.num_points": POSITIVE,
    "data.answers_per_paragraph": POSITIVE,
    "data.max_answer_words": POSITIVE,
    "data.question_len": Range(2),  # question words + <eos>
    "data.paragraph_len": POSITIVE,
    "data.eval_steps": Range(-1, INT32_MAX),
    "data.*": NON_NEGATIVE,  # lengths, counts, vocabulary sizes (0 = from the data), weights
    # ---- models (config.model: the family config's fields) ----
    "model.vocab_size": POSITIVE,
    "model.*drop*": DROP_RATE,
    "model.mem_len": NON_NEGATIVE,
    "model.reuse_len": NON_NEGATIVE,
    "model.clamp_len": Range(-1),  # -1 = no clamp
    "model.block_sizes": Each(Range(1)),
    "model.cutoffs": Each(Range(1), min_len=0),
    "model.gap_bounds": Each(FINITE, min_len=2),
    "model.output.doc_counts": Each(Range(1)),
    "model.*hidden": Each(Range(1)),
    "model.*init_std": POSITIVE,
    "model.initializer_range": POSITIVE,
    "model.layer_norm_eps*": POSITIVE,
    "model.sampling_rate": Range(0, 1, lo_open=True),
    "model.ld_quantile": PROBABILITY,
    "model.ld_start": STEPS,
    "model.knn_alpha": NON_NEGATIVE,
    "model.margin": FINITE,
    "model.output.*": NON_NEGATIVE,
    "model.*_weight": NON_NEGATIVE,
    "model.*noise": NON_NEGATIVE,
    "model.dequantize": NON_NEGATIVE,
    "model.vi_max_std": POSITIVE,
    "model.node_lr_multiplier": POSITIVE,
    "model.*": POSITIVE,  # sizes and counts: d_model, n_layer, n_head, num_labels, width, ...
    # ---- finetuning, systems ----
    "finetune.lora.rank": NON_NEGATIVE,  # 0 = off
    "finetune.lora.alpha": POSITIVE,
    "finetune.mem_len": NON_NEGATIVE,
    "finetune.pack_size": POSITIVE,  # examples in one packed row (finetune.packing)
    "squad.*": POSITIVE,
    "gdan.d_steps": POSITIVE,
    "gdan.g_steps": POSITIVE,
    "gdan.*": NON_NEGATIVE,
}


def declare(pattern: str, domain: Domain, *, before: Optional[str] = None) -> None:
    """Add a key pattern's domain (a module declaring its own keys); `before` an existing pattern it must precede
    (a more specific pattern), else it goes first."""
    global KEYS
    items = [(k, v) for k, v in KEYS.items() if k != pattern]
    at = next((i for i, (k, _) in enumerate(items) if k == before), 0) if before else 0
    items.insert(at, (pattern, domain))
    KEYS = dict(items)


def domain_of(key: str) -> Optional[Domain]:
    """The declared domain of dotted `key` (first matching pattern), or None."""
    for pattern, domain in KEYS.items():
        if fnmatch.fnmatchcase(key, pattern):
            return domain
    return None


def _numeric(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, (tuple, list)) and bool(value) and all(_numeric(v) for v in value)


def problems(items: Dict[str, Any]) -> Dict[str, str]:
    """{key: "must be ..."} of the numeric values (and numeric tuples) of flat `items` outside their domains."""
    out = {}
    for key, value in items.items():
        if value is None or not (_numeric(value) or isinstance(value, (tuple, list))):
            continue
        if isinstance(value, (tuple, list)) and any(isinstance(v, (tuple, list, dict)) for v in value):
            continue  # records, not a numeric key (optimizer.schedule_history's (step, total) pairs, ...)
        domain = domain_of(key)
        if domain is None:
            if not _numeric(value):
                continue
            domain = Each(FINITE) if isinstance(value, (tuple, list)) else FINITE
        elif isinstance(value, (tuple, list)) and not isinstance(domain, Each):
            continue  # a tuple-valued key whose pattern declares a scalar domain (e.g. param_groups)
        elif not _numeric(value) and not isinstance(domain, Each):
            continue
        problem = domain.problem(value)
        if problem is not None:
            out[key] = problem
    return out


def flag(parse: Callable[[str], Any], domain: Domain) -> Callable[[str], Any]:
    """An argparse `type` that parses with `parse` and rejects values outside `domain`: argparse then prints
    `argument --NAME: invalid value ...: must be ...` and exits 2."""

    def typed(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {getattr(parse, '__name__', 'a value')}") from None
        problem = domain.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text}: {problem}")
        return value

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def reject_unknown_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """`parser.error` (one usage line, exit 2) naming the first `--flag` of `argv` that `parser` does not define
    (with the closest defined one), before argparse reports a missing required flag instead (`--work_dir=W`
    would otherwise read as "--workdir is required")."""
    import difflib

    defined = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in defined:
            continue
        if parser.allow_abbrev and sum(d.startswith(name) for d in defined) == 1:
            continue
        close = difflib.get_close_matches(name, defined, n=1)
        parser.error(f"unrecognized argument {name}" + (f" (did you mean {close[0]}?)" if close else ""))
