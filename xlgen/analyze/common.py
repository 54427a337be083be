"""Shared pieces of the analysis tools: the command line every tool shares, loading a workdir's eval model, its
output embedding, the runtime."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Tuple

import numpy as np

from data_pipelines import paths

EFFECTIVE_EPS = (1e-3, 1e-4, 1e-5)


class _ToolParser(argparse.ArgumentParser):
    """Checks the output files (`--json`, `--png`) before the tool runs: a path that cannot be written, or an
    existing file that is not an earlier report or figure, is a one-line error (exit 2)."""

    def parse_args(self, args=None, namespace=None):
        from data_pipelines import output_paths

        ns = super().parse_args(args, namespace)
        workdirs = getattr(ns, "workdir", None)
        for w in workdirs if isinstance(workdirs, list) else [workdirs]:
            if w is not None and not str(w).strip():
                self.exit(2, f"{self.prog}: error: --workdir is empty: give a directory path\n")
        for flag in ("json", "png"):
            if getattr(ns, flag, ""):
                try:
                    output_paths.check_output_file(getattr(ns, flag), f"--{flag}")
                except output_paths.OutputPathError as e:
                    self.exit(2, f"{self.prog}: error: {e}\n")
        return ns


def tool_parser(
    tool: str, doc: str, *, json: str = "", png: Optional[str] = "", platform: bool = True
) -> argparse.ArgumentParser:
    """The parser of `xlgen analyze <tool>` (description: the first paragraph of the tool's docstring `doc`) with
    the options the tools share: `--json` (the report; help `json`), `--png` (its figure; help `png`, None = the tool
    draws none) and, for tools that run a model, `--platform`."""
    p = _ToolParser(prog=f"xlgen analyze {tool}", description=doc.split("\n\n")[0])
    p.add_argument("--json", default="", help=json or "write the report here (JSON)")
    if png is not None:
        p.add_argument("--png", default="", help=png or "draw the report's figure here")
    if platform:
        p.add_argument("--platform", default="", help="JAX platform (default: as `xlgen train` chooses)")
    return p


def fail(tool: str, error: BaseException) -> int:
    """A tool's one-line error on stderr; the exit status 2."""
    print(f"xlgen analyze {tool}: error: {error}", file=sys.stderr)
    return 2


def effective_rank(s: np.ndarray, eps: float) -> int:
    """Smallest k with Σ_{i<=k} s_i² >= (1 - eps) Σ_i s_i² (s sorted descending; seed 001 L1883-1889)."""
    e = np.cumsum(np.asarray(s, np.float64) ** 2)
    return int(np.searchsorted(e, (1.0 - eps) * e[-1]) + 1)


def save_figure(fig, path: str) -> None:
    """Write a matplotlib figure to `path` atomically (temp file + rename)."""
    paths.atomic_write_figure(path, fig, dpi=120)


def write_json(path: str, obj, prefix: str = "") -> None:
    """Write a tool's JSON report atomically (data_pipelines.paths) and say where."""
    paths.write_json_atomic(path, obj)
    print(f"{prefix}json: {path}")


def setup(platform: str = "") -> None:
    """JAX platform and compilation cache as `xlgen train` sets them (delegated commands start bare)."""
    from xlgen import platforms

    platforms.setup_runtime(platform or platforms.default_platform(), "off")


def load_model(workdir: str, step=None) -> Tuple[Any, Any, int]:
    """(config, eval-mode model on one device, checkpoint step) of an xlgen pretraining workdir."""
    from xlgen.train.workdir_model import restore_params

    config, program, params, step = restore_params(workdir, step)
    return config, program.make_model(params, train=False), step


def output_embedding(model) -> Tuple[np.ndarray, bool]:
    """(output embedding W `[V, d_e]` float32 as a NumPy array, has an output bias) of a language model.

    Spectrum-control models give U diag(σ) Vᵀ; adaptive softmaxes with div_val 1 give their one table; adaptive
    softmaxes with several tables (div_val > 1) give the head cluster's table only."""
    from xlgen.models.adaptive_softmax import AdaptiveLogSoftmax

    head = getattr(model, "softmax", None)
    emb = getattr(model, "embedding", None)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no language-model output layer (.softmax)")
    if isinstance(head, AdaptiveLogSoftmax):
        if head.div_val == 1:
            table = emb.output_table(0) if head.tie_weights else head.tables[0][...]
        else:
            table = head.cluster_weights(0, emb)[0][: head.bounds[0][1]]  # the real rows (not stored padding)
        return np.asarray(table, np.float32), True
    table, _, _ = head.weights(emb)
    return np.asarray(table, np.float32), True
