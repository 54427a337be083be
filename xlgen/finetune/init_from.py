"""Initialisation from a pretrained model: its parameters (HF directory or xlgen workdir) restored by name where the
shapes agree (partial restore); task heads that do not exist in the pretrained model start fresh."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from xlgen.train.workdir import Workdir, hf_config


def pretrained_params(init_from: str) -> Dict[str, np.ndarray]:
    """Flat {name: array} of the pretrained model (HF directory via `xlgen.from_pretrained`, or the best/latest
    checkpoint of an xlgen workdir)."""
    if hf_config(init_from) is not None:
        from xlgen.models.params import flat_params
        from xlgen.pretrained import from_pretrained

        loaded = from_pretrained(init_from)
        module = getattr(loaded, "module", None) or getattr(loaded, "model", None) or loaded  # Funnel / XLNet
        return flat_params(module, dtype=None)
    import jax

    workdir, step, sub = Workdir.parse(init_from)
    if sub is None and step is not None:
        sub = "checkpoints"
    config, program, restored = workdir.open(step=step, sub=sub)
    params = {k: np.asarray(jax.device_get(v)) for k, v in program.params_of(restored.state).items()}
    from xlgen.finetune.peft import merged_params

    return merged_params(config, params)  # a LoRA run: its adapters folded into the weights


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
    shardings = program.param_shardings
    params = dict(program.params_of(state))
    for t, s in mapping.items():
        params[t] = jax.device_put(source[s].astype(np.dtype(program.train_spec.dtypes[t])), shardings[t])
    state = program.with_params(state, params)
    report = {"loaded": len(mapping), "fresh": fresh, "unused": unused}
    return state, report
