"""A trained Transformer-XL called like Hugging Face's `TransfoXLLMHeadModel` (`xlgen.from_pretrained`, loading HF
checkpoints through `xlgen.models.transformer_xl.hf`), with its evaluation cache: per-length position keys formed
once, and the memory's key/value heads kept in the layout of the attention products (`xlgen.models.operands`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from xlgen import platforms
from xlgen.models.operands import PositionKeyOperand, position_key_operand
from xlgen.models.params import FrozenCall
from xlgen.models.relative_attention import advance_memory_validity
from xlgen.models.transformer_xl.model import TransformerXLLM


@dataclasses.dataclass
class TransfoXLOutput:
    """Output of `TransfoXLPretrained.__call__` (HF names).

    log_probs `[b, l, V]` float32 (None with labels or for a headless model); mems: list of n_layer arrays
    `[mem_len, b, d_model]` (HF layout); losses `[b, l-1]` (HF shift: position t predicts labels[:, t+1]; 0 where
    the label is -100; in token order, whereas HF orders them by cluster); loss: mean over the non-ignored
    labels; last_hidden_state `[b, l, d_model]`.
    """

    log_probs: Optional[jax.Array] = None
    mems: Optional[list] = None
    losses: Optional[jax.Array] = None
    loss: Optional[jax.Array] = None
    last_hidden_state: Optional[jax.Array] = None
    mem_valid: Optional[jax.Array] = None

    @property
    def prediction_scores(self):  # HF's name for the log-probabilities
        return self.log_probs

    @property
    def logits(self):
        return self.log_probs


class TransfoXLPretrained:
    """A loaded Transformer-XL, called like HF's `TransfoXLLMHeadModel`: `model(input_ids=..., mems=...)`.

    * `input_ids` `[batch, len]` (NumPy, jax or torch integer array).
    * `mems`: None -> zero memory of `config.mem_len` (what HF does), or a previous output's `.mems`
      (list of per-layer `[mem, batch, d_model]`, HF layout), or one xlgen array `[n_layer, batch, mem, d_model]`.
    * `labels` `[batch, len]` -> `.losses` `[batch, len-1]` and `.loss` (HF shift, -100 ignored) without
      building `[b, l, V]`.
    * `mem_len=` overrides how many states the returned memory keeps (default `config.mem_len`; also used by
      `same_length`), e.g. to evaluate with a longer memory than training.
    * `mem_valid=` int `[batch]` (or 0): the memory is a fixed-length buffer of which only the last `mem_valid`
      rows are real, the rest masked. `model(ids, mem_valid=0)` starts from an empty memory (the original PyTorch
      implementation's evaluation) in a zero buffer of `mem_len` rows; pass `out.mems, out.mem_valid` back in.
      Every segment then has the same shapes (one compilation), and the results equal a growing memory. Without
      `mem_valid`, `mems=None` is HF's zero memory, attended to like real states.
    The forward pass is jitted once per input shape. `.module` is the `TransformerXLLM` (NNX), `.config` its
    `TransformerXLConfig`.

    Cached evaluation (`cache=True`, the default): the position keys W_r R of every layer are formed once per
    (segment, memory length, batch), already in the layout of the position product, and the keys/values of the
    returned memory rows ride along with `out.mems`; when those very arrays are passed back as `mems=`, the next
    segment reuses them instead of projecting the whole memory again (memory rows never change, so these are the
    heads they had as the segment). Anything else passed as `mems` is projected as usual. Results agree with
    `cache=False` to float rounding. Keys/values stay in the products' `[b, n, d, k]` layout, one array per layer,
    and an HF-layout memory is returned layer by layer from its input, so a segment copies only its own rows:
    with batch 1, 64-token segments and 4 layers, 162 XLA:CPU thunks at l = 512 against 189 for a copy of the whole
    memory, and 0.88x / 0.97x / 0.96x its time at l = 512 / 256 / 128 (docs/performance.md).
    """

    def __init__(self, module: TransformerXLLM, *, has_head: bool = True, cache: bool = True):
        module.eval()
        self.module, self.config, self.has_head, self.cache = module, module.config, has_head, cache
        self._forward = FrozenCall(
            module,
            self._pure_forward,
            static_argnames=("mode", "mem_len", "layout"),
            compiler_options=platforms.small_op_compiler_options(),
        )
        self._position_keys_fn = FrozenCall(
            module,
            lambda m, qlen, klen, batch: (
                PositionKeyOperand(jax.vmap(lambda k: position_key_operand(k, batch).keys)(m.position_keys(qlen, klen)))
                if m.config.scan_layers
                else [position_key_operand(k, batch) for k in m.position_keys(qlen, klen)]
            ),
            static_argnums=(1, 2, 3),
        )
        self._position_keys: Dict[Tuple[int, int, int], Any] = {}  # (qlen, klen, batch) -> position key operands
        self._last_mems: Optional[Tuple[list, tuple]] = None  # (mems list returned, their (keys, values))

    @staticmethod
    def _pure_forward(model, input_ids, mems, labels, mem_valid, cache, *, mode: str, mem_len: int, layout: str):
        """One jitted program: mems conversion, forward, HF-layout memory (and the HF-shifted label NLL)."""
        in_mems = mems
        c = model.config
        if layout == "init" and mem_valid is not None:  # an empty fixed-length buffer of the returned length
            mems = model.init_mems(input_ids.shape[0], mem_len)
        elif layout == "init":
            mems = model.init_mems(input_ids.shape[0]) if c.mem_len > 0 else None
        elif layout == "hf":  # n_layer x [M, b, d]
            mems = jnp.swapaxes(jnp.stack(mems), 1, 2)
        out = {}
        kw = dict(mem_len=mem_len, mem_valid=mem_valid)
        if cache is not None and mems is not None:
            kw["cache"] = cache
        if mode == "hidden":
            res = model.hidden_states(input_ids, mems, **kw)
            out["last_hidden_state"] = res[0]
        elif mode == "labels":
            shifted = jnp.concatenate([labels[:, 1:], jnp.full_like(labels[:, :1], -100)], axis=1)
            res = model(input_ids, mems, labels=shifted, **kw)
            out["losses"] = res[0][:, :-1]
            out["loss"] = out["losses"].sum() / jnp.maximum((labels[:, 1:] != -100).sum(), 1)
        else:
            res = model(input_ids, mems, **kw)
            out["log_probs"] = res[0]
        new_mems = res[1]
        if "cache" in kw:
            out["kv_mems"] = res[2]  # the returned memory rows' keys and values, for the next segment
        qlen, mlen = input_ids.shape[1], mems.shape[2] if mems is not None else 0
        if layout == "hf" and new_mems.shape[2] == mlen >= qlen:
            # HF layout in and out, same length: layer n's new memory is its input from row qlen on, then the
            # segment's states (the last qlen rows of new_mems). Formed per layer from the inputs, each returned
            # array is one fusion; slicing the stacked new_mems costs XLA:CPU a copy of every array.
            out["mems"] = [
                jnp.concatenate([in_mems[n][qlen:].astype(new_mems.dtype), jnp.swapaxes(new_mems[n, :, -qlen:], 0, 1)])
                for n in range(new_mems.shape[0])
            ]
        else:
            out["mems"] = list(jnp.swapaxes(new_mems, 1, 2))
        if mem_valid is not None:
            out["mem_valid"] = advance_memory_validity(
                jnp.broadcast_to(mem_valid, (input_ids.shape[0],)), input_ids.shape[1], new_mems.shape[2]
            )
        return out

    def init_mems(self, batch_size: int) -> list:
        """Zero memory in HF layout: n_layer arrays `[mem_len, batch, d_model]`."""
        c = self.config
        zero = np.zeros((c.mem_len, batch_size, c.d_model), jnp.dtype(c.dtype))
        return [jax.device_put(zero) for _ in range(c.n_layer)]

    def _mems_arg(self, mems, batch: int):
        c = self.config
        if mems is None:
            return None, "init"
        if isinstance(mems, (list, tuple)):
            if len(mems) != c.n_layer:
                raise ValueError(f"mems: got {len(mems)} layers, model has n_layer={c.n_layer}")
            mems = [m if isinstance(m, jax.Array) else np.asarray(m) for m in mems]
            for m in mems:
                if m.ndim != 3 or m.shape[1] != batch or m.shape[2] != c.d_model:
                    raise ValueError(
                        f"mems: each layer must be [mem, batch={batch}, d_model={c.d_model}] (HF layout), got {m.shape}"
                    )
            return tuple(mems), "hf"
        arr = mems if isinstance(mems, jax.Array) else np.asarray(mems)
        if arr.ndim != 4 or arr.shape[0] != c.n_layer or arr.shape[1] != batch or arr.shape[3] != c.d_model:
            raise ValueError(
                f"mems: expected a list of [mem, batch, d] (HF) or one [n_layer={c.n_layer}, "
                f"batch={batch}, mem, d={c.d_model}] array, got shape {arr.shape}"
            )
        return arr, "xlgen"

    def __call__(
        self,
        input_ids=None,
        mems=None,
        labels=None,
        *,
        mem_len: Optional[int] = None,
        head_mask=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        mem_valid=None,
    ) -> TransfoXLOutput:
        for name, v in (
            ("head_mask", head_mask),
            ("inputs_embeds", inputs_embeds),
            ("output_attentions", output_attentions),
            ("output_hidden_states", output_hidden_states),
        ):
            if v is not None and v is not False:
                raise NotImplementedError(f"{name} is not supported by xlgen's Transformer-XL")
        if input_ids is None:
            raise ValueError("input_ids is required ([batch, len] integer token ids)")
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"input_ids must be an integer array [batch, len], got {ids.dtype} {ids.shape}")
        c = self.config
        if ids.size and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids outside [0, vocab_size={c.vocab_size}): min {ids.min()}, max {ids.max()}")
        mem_arg, layout = self._mems_arg(mems, ids.shape[0])
        mem_len = c.mem_len if mem_len is None else int(mem_len)
        ids = ids.astype(np.int32)
        lab, mode = None, "log_probs"
        if not self.has_head:
            mode = "hidden"
        elif labels is not None:
            lab = np.asarray(labels).astype(np.int32)
            if lab.shape != ids.shape:
                raise ValueError(f"labels shape {lab.shape} != input_ids shape {ids.shape}")
            mode = "labels"
        if mem_valid is not None:
            mv = mem_valid if isinstance(mem_valid, jax.Array) else np.asarray(mem_valid, np.int32)
            mem_valid = jnp.broadcast_to(jnp.asarray(mv, jnp.int32), (ids.shape[0],))
        cache = self._cache_arg(mems, mem_arg, layout, ids.shape[1], mem_len, mem_valid is not None, ids.shape[0])
        out = self._forward(ids, mem_arg, lab, mem_valid, cache, mode=mode, mem_len=mem_len, layout=layout)
        kv = out.pop("kv_mems", None)
        self._last_mems = None if kv is None else (out["mems"], kv)
        return TransfoXLOutput(**out)

    def _cache_arg(
        self, mems, mem_arg, layout: str, qlen: int, mem_len: int, fixed: bool, batch: int = 1
    ) -> Optional[dict]:
        """{"position_keys", "kv_mem"} for a cached pass (see the class doc), or None."""
        c = self.config
        if not self.cache:
            return None
        if layout == "init":
            mlen = mem_len if fixed else c.mem_len
        else:
            mlen = mem_arg[0].shape[0] if layout == "hf" else mem_arg.shape[2]
        if layout == "init" and mlen <= 0:
            return None
        key = (qlen, mlen + qlen, batch)
        if key not in self._position_keys:
            self._position_keys[key] = self._position_keys_fn(*key)
        kv = None
        last = self._last_mems
        if (
            layout == "hf"
            and last is not None
            and len(last[0]) == len(mems)
            and all(a is b for a, b in zip(last[0], mems))
        ):
            kv = last[1]
        return {"position_keys": self._position_keys[key], "kv_mem": kv}
