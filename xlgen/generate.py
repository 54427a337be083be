"""`xlgen generate`: sample text from a Transformer-XL or XLNet language model with its memory (incremental decoding).

    xlgen generate (--workdir=DIR | --model=HF_DIR) --prompt=TEXT [--max_new_tokens=200 --top_k=40 --top_p=1.0
                   --temperature=1.0 --seed=0 --num_samples=1 --mem_len=M --prefix=TEXT]
    xlgen generate --workdir=DIR [--num_samples=N --seed=S]     a system that samples unconditionally (a text GAN,
                   a `Sampling` record): N sentences, one per line, the same for the same seed

Decoding follows Transformer-XL's recurrence (Dai thesis §3.2, the original PyTorch repository's evaluation with
memory): the prompt runs as one segment against an empty memory, then every new token is one segment of length 1.
Each layer's memory keeps the last `mem_len` hidden states of the layer below (prompt and generated tokens alike),
so a token attends to its `mem_len` predecessors at every layer — information from further back reaches it through
the layers (the "extended context" of the thesis, up to n_layer x mem_len tokens).

Implementation: the memory is a fixed-shape buffer `[n_layer, num_samples, mem_len, d_model]` with a validity count
(`relative_attention.memory_validity_mask`; the not-yet-written rows are masked, so a zero buffer behaves like the
original empty, growing memory). `prefill` (the prompt) and `step` (one token) are two jitted programs; `step` has
the same shapes for every token, so it compiles once (checked in tests/test_generate.py), and nothing re-encodes
the prompt. Sampling runs inside the step: log-probabilities / temperature, top-k (the k best, renormalised), top-p
(the smallest set with probability >= p, renormalised), then a categorical draw keyed by (seed, position); the same
seed gives the same text. `temperature=0` is greedy decoding.

XLNet (`XLNetLMHeadModel` workdirs / HF directories): the same loop through the permutation mask (`XLNetDecoder`):
a dummy position after the real tokens is hidden from everyone by `perm_mask` and read by the query stream
(`target_mapping`); the real tokens are causal, so a token's content state is final when it enters the memory and
incremental decoding is exact (equal to one full pass with a causal perm_mask). `--prefix` feeds text before the
prompt (the XLNet repository's padding text for short prompts) without printing it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------


def sample_logits(log_probs: jax.Array, key: jax.Array, *, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Draw one token per row from `log_probs` `[b, V]`: scale by 1/temperature, keep the top-k, then the top-p
    nucleus, renormalise (categorical over the kept logits), sample. temperature <= 0: argmax. -> int32 `[b]`."""
    if temperature <= 0:
        return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    logits = log_probs.astype(jnp.float32) / temperature
    neg = jnp.finfo(jnp.float32).min
    if 0 < top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if 0.0 < top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of the strictly better tokens
        drop_sorted = before >= top_p  # keeps the best token always
        drop = jnp.zeros_like(drop_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(drop_sorted)
        logits = jnp.where(drop, neg, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


# ----------------------------------------------------------------------------------------------------------------
# Incremental decoding for Transformer-XL
# ----------------------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p"))
def _first_sample(log_probs, key, pos, *, temperature, top_k, top_p):
    return sample_logits(log_probs, jax.random.fold_in(key, pos), temperature=temperature, top_k=top_k, top_p=top_p)


def _pure_sample_step(forward, params, token, mems, mem_valid, key, pos, *, temperature, top_k, top_p):
    """One token in, the next one sampled: (next token `[b]`, log-probs `[b, V]`, mems, mem_valid). `key` is
    folded with the absolute position `pos`, so a seed fixes the whole sample."""
    log_probs, mems, mem_valid = forward(params, token[:, None], mems, mem_valid)
    nxt = sample_logits(log_probs, jax.random.fold_in(key, pos), temperature=temperature, top_k=top_k, top_p=top_p)
    return nxt, log_probs, mems, mem_valid


class TXLDecoder:
    """Incremental decoding of a `TransformerXLLM` with a fixed-shape memory buffer.

    `prefill(prompt_ids [b, P]) -> (log_probs [b, V] of the next token, state)`;
    `step(token [b], state) -> (log_probs [b, V], state)`; `generate(...)` samples. `state` is
    (memory, mem_valid `[b]`); the memory is (mems `[n_layer, b, mem_len, d]`, their keys/values, the one-token
    position keys) for Transformer-XL (see `_pure_forward`), the mems array for XLNet. Each token attends to all
    `mem_len` memory rows and itself (`same_length` does not apply: every query of a one-token segment has the same
    context length).
    """

    _config_overrides: Dict[str, Any] = {}
    default_mem_len = None

    def __init__(self, module, mem_len: Optional[int] = None):
        module.eval()
        cfg = module.config
        self.mem_len = int(mem_len if mem_len is not None else (cfg.mem_len or self.default_mem_len or 0))
        if self.mem_len < 1:
            raise ValueError(f"mem_len={self.mem_len}: generation needs a memory (mem_len >= 1)")
        module.config = dataclasses.replace(cfg, same_length=False, **self._config_overrides)
        if hasattr(module, "transformer"):  # XLNet: the core reads its own config
            module.transformer.config = module.config
        self.module, self.config = module, module.config
        self._graphdef, self._params = nnx.split(module)
        forward = functools.partial(type(self)._pure_forward, self._graphdef, self.mem_len)
        self._forward = jax.jit(forward)
        self._sample_step = jax.jit(
            functools.partial(_pure_sample_step, forward),
            static_argnames=("temperature", "top_k", "top_p"),
            donate_argnums=(2,),
        )

    @staticmethod
    def _pure_forward(graphdef, mem_len, params, ids, state, mem_valid):
        """ids `[b, l]` -> (log-probs of the token after the last one `[b, V]`, new state, new mem_valid).

        `state` = (mems, memory keys/values or None, one-token position keys or None): a token's step reuses the
        memory rows' keys/values (formed when each row was the segment) and the position keys of a one-token
        segment (a function of the parameters only) instead of projecting mem_len rows per layer again
        (`TransformerXLLM.hidden_states(cache=...)`); same results."""
        from xlgen.models.relative_attention import advance_memory_validity

        model = nnx.merge(graphdef, params)
        mems, kv, step_keys = state
        cache = {"kv_mem": kv, "position_keys": step_keys if ids.shape[1] == 1 else None}
        layers = getattr(model.softmax, "needs_layers", False)  # DOC reads every layer's state
        h, new_mems, new_kv, *rest = model.hidden_states(
            ids, mems, mem_len=mem_len, mem_valid=mem_valid, cache=cache, with_layers=layers
        )
        new_kv = jax.tree.map(lambda x: x[..., x.shape[-1] - mem_len :], new_kv)  # the memory's rows: fixed shapes
        if step_keys is None:
            step_keys = model.position_keys(1, mem_len + 1)
        extra = {"layers": rest[0][:, :, -1:]} if layers else {}
        log_probs = model.softmax.log_probs(h[:, -1:], model.embedding, **extra)[:, 0]
        return log_probs, (new_mems, new_kv, step_keys), advance_memory_validity(mem_valid, ids.shape[1], mem_len)

    def empty_state(self, batch: int):
        return (self.module.init_mems(batch, self.mem_len), None, None), jnp.zeros((batch,), jnp.int32)

    def prefill(self, prompt_ids):
        ids = jnp.asarray(np.asarray(prompt_ids, np.int32))
        mems, valid = self.empty_state(ids.shape[0])
        log_probs, mems, valid = self._forward(self._params, ids, mems, valid)
        return log_probs, (mems, valid)

    def step(self, token, state):
        mems, valid = state
        log_probs, mems, valid = self._forward(self._params, jnp.asarray(token, jnp.int32)[:, None], mems, valid)
        return log_probs, (mems, valid)

    def step_compilations(self) -> int:
        """How many programs the per-token step has compiled (1 after any number of tokens)."""
        return self._sample_step._cache_size()

    def generate(
        self,
        prompt_ids: List[int],
        *,
        max_new_tokens: int,
        num_samples: int = 1,
        seed: int = 0,
        temperature: float = 1.0,
        top_k: int = 40,
        top_p: float = 1.0,
        return_log_probs: bool = False,
    ) -> Dict[str, Any]:
        """Sample `num_samples` continuations of `prompt_ids` (one batch). Returns {"tokens": int `[num_samples,
        max_new_tokens]`, "prefill_s", "compile_s", "decode_s", "tokens_per_sec"} (+ "log_probs" `[n, T, V]`).
        Timing: the first step (which compiles) is excluded from decode_s / tokens_per_sec."""
        if not prompt_ids:
            raise ValueError("the prompt encodes to no tokens; give a non-empty --prompt")
        if max_new_tokens < 1:
            return {"tokens": np.zeros((num_samples, 0), np.int32), "tokens_per_sec": 0.0}
        ids = np.tile(np.asarray(prompt_ids, np.int32)[None], (num_samples, 1))
        key = jax.random.key(seed)
        kw = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        t0 = time.perf_counter()
        log_probs, (mems, valid) = self.prefill(ids)
        pos = len(prompt_ids)
        token = _first_sample(log_probs, key, jnp.int32(pos), **kw)
        token.block_until_ready()
        prefill_s = time.perf_counter() - t0
        out = [token]
        lps = [log_probs] if return_log_probs else None
        t1 = time.perf_counter()
        compile_s = 0.0
        for i in range(1, max_new_tokens):
            nxt, log_probs, mems, valid = self._sample_step(
                self._params, token, mems, valid, key, jnp.int32(pos + i), **kw
            )
            if i == 1:
                nxt.block_until_ready()
                compile_s = time.perf_counter() - t1
                t1 = time.perf_counter()
            token = nxt
            out.append(token)
            if lps is not None:
                lps.append(log_probs)
        tokens = np.stack([np.asarray(t) for t in out], axis=1)  # waits for the last step
        decode_s = time.perf_counter() - t1
        steady = max(max_new_tokens - 2, 0) * num_samples
        result = {
            "tokens": tokens,
            "prefill_s": prefill_s,
            "compile_s": compile_s,
            "decode_s": decode_s,
            "tokens_per_sec": steady / decode_s if steady and decode_s > 0 else float("nan"),
        }
        if lps is not None:
            result["log_probs"] = np.stack([np.asarray(x) for x in lps], axis=1)
        return result


class XLNetDecoder(TXLDecoder):
    """Left-to-right sampling from an `XLNetLMHeadModel` through the permutation mask, with memory.

    Each call appends a dummy position after the real tokens: `perm_mask` hides it from every position and makes the
    real tokens causal (token i's content stream sees the memory and tokens <= i), `target_mapping` reads the query
    stream at the dummy, whose prediction is the next token; only the real tokens are cached (`reuse_len`). This is
    XLNet's natural factorisation order, so a token's content state never changes after it is written to the
    memory: incremental decoding equals one full pass with a causal `perm_mask` (tests/test_generate.py). A padding
    prefix (the XLNet repository's advice for short prompts) is just text in front of the prompt (`--prefix`).
    """

    _config_overrides = {"bi_data": False}
    default_mem_len = 512

    def empty_state(self, batch: int):
        return self.module.transformer.init_mems(batch, self.mem_len), jnp.zeros((batch,), jnp.int32)

    @staticmethod
    def _pure_forward(graphdef, mem_len, params, ids, mems, mem_valid):
        from xlgen.models.relative_attention import advance_memory_validity

        model = nnx.merge(graphdef, params)
        b, n = ids.shape
        q = n + 1
        x = jnp.concatenate([ids, jnp.zeros((b, 1), ids.dtype)], axis=1)  # the dummy's id is never seen
        i, j = jnp.arange(q)[:, None], jnp.arange(q)[None, :]
        perm = jnp.broadcast_to((j > i) | (j == n), (b, q, q)).astype(jnp.float32)
        target = jax.nn.one_hot(jnp.full((b, 1), n), q, dtype=jnp.float32)
        logits, new_mems = model(
            x, None, mems=mems, perm_mask=perm, target_mapping=target, mem_len=mem_len, reuse_len=n, mem_valid=mem_valid
        )
        log_probs = jax.nn.log_softmax(logits[:, 0].astype(jnp.float32), axis=-1)
        return log_probs, new_mems, advance_memory_validity(mem_valid, n, mem_len)


DECODERS = {"TransformerXLLM": TXLDecoder, "XLNetLMHeadModel": XLNetDecoder}


def decoder_for(module, mem_len: Optional[int] = None) -> TXLDecoder:
    """The incremental decoder of a language model module (Transformer-XL or the XLNet LM head)."""
    name = type(module).__name__
    if name not in DECODERS:
        raise ValueError(
            f"a {name}: `xlgen generate` samples from Transformer-XL and XLNet language models (not finetuned heads "
            "or Funnel)"
        )
    return DECODERS[name](module, mem_len)


# ----------------------------------------------------------------------------------------------------------------
# Loading: workdir or HF directory, with the tokenizer
# ----------------------------------------------------------------------------------------------------------------


class _HFTokenizer:
    """`encode`/`decode` over a HF tokenizer directory (tokenizer.json, or any class AutoTokenizer knows)."""

    def __init__(self, path: str):
        if os.path.exists(os.path.join(path, "tokenizer.json")):
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
            self.encode = lambda text: self.tok.encode(text, add_special_tokens=False).ids
            self.decode = lambda ids: self.tok.decode([int(i) for i in ids], skip_special_tokens=False)
        else:
            try:
                from transformers import AutoTokenizer
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise ImportError(f"{path}: reading this tokenizer needs transformers (xlgen[parity])") from e
            self.tok = AutoTokenizer.from_pretrained(path)
            self.encode = lambda text: self.tok.encode(text, add_special_tokens=False)
            self.decode = lambda ids: self.tok.decode([int(i) for i in ids])


def load_for_generation(workdir: Optional[str] = None, model: Optional[str] = None):
    """(TransformerXLLM module, tokenizer with encode/decode, default mem_len) from a workdir or a HF directory."""
    from xlgen.pretrained import from_pretrained

    if (workdir is None) == (model is None):
        raise ValueError("give exactly one of --workdir (an xlgen workdir) or --model (a Hugging Face directory)")
    loaded = from_pretrained(workdir or model)
    from xlgen.interop.export import unwrap

    module = unwrap(loaded)
    if type(module).__name__ not in DECODERS:
        raise ValueError(
            f"{workdir or model}: a {type(module).__name__}; `xlgen generate` samples from Transformer-XL and XLNet "
            "language models (see docs/generation.md)"
        )
    if workdir is not None:
        from xlgen import config as config_lib
        from xlgen.interop.export import workdir_tokenizer

        config = config_lib.read_workdir_config(workdir)
        tok = workdir_tokenizer(config, workdir)
        encode = (lambda t: tok.encode(t, add_eos=False)) if hasattr(tok, "encode_array") else tok.encode
        tokenizer = argparse.Namespace(encode=encode, decode=tok.decode)
    else:
        tokenizer = _HFTokenizer(model)
    return module, tokenizer


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The record of a system that generates text unconditionally (a text GAN), in `Family.records`
    (`xlgen.registry`): `xlgen generate --workdir=W` calls `sample` instead of the language-model decoders.

    sample  (config, program, state, workdir, num_samples, seed) -> [sentence]: from the workdir's restored state,
            the same sentences for the same seed
    """

    sample: Callable[..., List[str]]


def _system_sampler(workdir: Optional[str]):
    """(num_samples, seed) -> sentences when `workdir` is a run of a system with a `Sampling` record (e.g.
    InitialGAN), else None (the language-model path)."""
    if workdir is None:
        return None
    from xlgen import config as config_lib
    from xlgen import registry

    config = config_lib.read_workdir_config(workdir)
    family = config.model.get("family") if config is not None else None
    if family not in registry.names() or registry.get(family).record(Sampling) is None:
        return None
    from xlgen.train.workdir import Workdir

    config, program, restored = Workdir(workdir).open()
    sample = registry.get(family).record(Sampling).sample
    return lambda num, seed: sample(config, program, restored.state, workdir, num, seed)


def main(argv: Optional[List[str]] = None) -> int:
    from xlgen.domains import SEED, Range
    from xlgen.domains import flag as in_domain

    p = argparse.ArgumentParser(prog="xlgen generate", description="Sample text from a Transformer-XL LM")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workdir", help="xlgen pretraining workdir (latest checkpoint)")
    src.add_argument("--model", help="Hugging Face TransfoXL directory (e.g. one written by xlgen export)")
    p.add_argument("--prompt", default=None, help="text to continue (language models; required there)")
    p.add_argument("--prefix", default="", help="text fed before the prompt and not printed (XLNet: padding text)")
    p.add_argument("--max_new_tokens", type=in_domain(int, Range(1)), default=200)
    p.add_argument(
        "--top_k", type=in_domain(int, Range(0)), default=40, help="sample among the k most likely tokens (0: all)"
    )
    p.add_argument(
        "--top_p",
        type=in_domain(float, Range(0, 1, lo_open=True)),
        default=1.0,
        help="nucleus: the smallest set with probability >= p",
    )
    p.add_argument("--temperature", type=in_domain(float, Range(0)), default=1.0, help="0 = greedy")
    p.add_argument("--seed", type=in_domain(int, SEED), default=0)
    p.add_argument("--num_samples", type=in_domain(int, Range(1)), default=1)
    p.add_argument(
        "--mem_len", type=in_domain(int, Range(0)), default=None, help="memory length (default: the model's mem_len)"
    )
    p.add_argument("--platform", default=None, help="cpu | tpu | gpu (default: autodetect)")
    args = p.parse_args(argv)
    for flag in ("workdir", "model"):
        if getattr(args, flag) is not None and not getattr(args, flag).strip():
            print(f"xlgen generate: error: --{flag} is empty: give a directory path", file=sys.stderr)
            return 2
    from xlgen import platforms

    platforms.setup_runtime(args.platform or platforms.default_platform(), "off")
    try:
        hook = _system_sampler(args.workdir)
        if hook is not None:
            if args.prompt:
                raise ValueError(f"{args.workdir}: this system samples unconditionally; it takes no --prompt")
            for line in hook(args.num_samples, args.seed):
                print(line, flush=True)
            return 0
        if args.prompt is None:
            raise ValueError("--prompt is required to sample from a language model")
        module, tokenizer = load_for_generation(args.workdir, args.model)
        prompt_ids = list(tokenizer.encode(args.prefix + args.prompt))
        decoder = decoder_for(module, args.mem_len)
        res = decoder.generate(
            prompt_ids,
            max_new_tokens=args.max_new_tokens,
            num_samples=args.num_samples,
            seed=args.seed,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
        )
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"xlgen generate: error: {e}", file=sys.stderr)
        return 2
    for i, row in enumerate(res["tokens"]):
        if args.num_samples > 1:
            print(f"=== sample {i} ===")
        print(args.prompt + tokenizer.decode(row.tolist()), flush=True)
    print(
        f"[generate] {args.num_samples} x {args.max_new_tokens} tokens, mem_len {decoder.mem_len}: "
        f"{res['tokens_per_sec']:.1f} tokens/s (steady state), prefill {res['prefill_s']:.2f} s "
        f"(prompt {len(prompt_ids)} tokens, incl. compile), step compile {res['compile_s']:.2f} s",
        file=sys.stderr,
        flush=True,
    )
    return 0
