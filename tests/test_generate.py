"""`xlgen generate`: Transformer-XL incremental decoding with a fixed-shape memory buffer, and the samplers.

* Incremental decoding is the model, not an approximation: the log-probs of every generated position equal one
  full-sequence pass over prompt + generated tokens in which each query sees its mem_len + 1 latest keys at every
  layer (`same_length` with a window of mem_len + 1) — also after the memory has filled and started dropping
  states; and the per-token step compiles once for any number of tokens (no re-encoding, no recompilation).
* Sampling: top-k / top-p keep exactly the right tokens with renormalised probabilities; the same seed gives the
  same tokens, other seeds other tokens.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from xlgen.generate import TXLDecoder, sample_logits
from xlgen.models.transformer_xl import TransformerXLConfig, TransformerXLLM


def tiny_txl(seed=0, **kw):
    from xlgen.models.xlnet import materialize

    cfg = TransformerXLConfig(
        **{
            **dict(vocab_size=23, cutoffs=(), div_val=1, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32),
            **dict(n_layer=2, mem_len=4, clamp_len=-1, same_length=False, dropout=0.0, tie_word_embeddings=True),
            **kw,
        }
    )
    rng = np.random.default_rng(seed)
    abstract = nnx.eval_shape(lambda: TransformerXLLM(cfg, rngs=nnx.Rngs(0)))
    model = materialize(abstract, lambda name, shape: rng.normal(size=shape) * 0.5 + name.endswith("scale"))
    model.eval()
    return model


def test_incremental_decoding_equals_full_pass_and_compiles_once():
    mem_len, prompt, n_new = 4, [3, 7, 1], 9  # 12 tokens: the memory fills, then drops states every step
    model = tiny_txl()
    dec = TXLDecoder(model, mem_len)
    res = dec.generate(prompt, max_new_tokens=n_new, num_samples=2, seed=3, top_k=5, return_log_probs=True)
    assert res["tokens"].shape == (2, n_new)
    assert dec.step_compilations() == 1  # one program for all 8 per-token steps
    # full pass: every query sees its mem_len + 1 latest keys (itself + the mem_len states the buffer holds)
    full_cfg = dataclasses.replace(model.config, same_length=True)
    ids = np.concatenate([np.tile(prompt, (2, 1)), res["tokens"][:, :-1]], axis=1)

    @jax.jit
    def full(ids):
        m = nnx.merge(nnx.graphdef(model), nnx.state(model))
        m.config = full_cfg  # the attention mask is built from the model's config in hidden_states
        return m(ids, None, mem_len=mem_len + 1)[0]

    ref = np.asarray(full(jnp.asarray(ids)))[:, len(prompt) - 1 :]
    err = float(np.abs(res["log_probs"] - ref).max())
    print(f"incremental vs full-sequence log-probs over {n_new} tokens: max|diff| = {err:.2e}")
    assert err < 1e-5
    # the sampled token is always among the top-5 of its log-probs
    top5 = np.argsort(-res["log_probs"], axis=-1)[..., :5]
    assert all(res["tokens"][b, t] in top5[b, t] for b in range(2) for t in range(n_new))


def test_same_seed_same_text_other_seed_other_text():
    dec = TXLDecoder(tiny_txl(seed=1), 6)
    a = dec.generate([1, 2], max_new_tokens=12, num_samples=3, seed=0, top_k=0)["tokens"]
    b = dec.generate([1, 2], max_new_tokens=12, num_samples=3, seed=0, top_k=0)["tokens"]
    c = dec.generate([1, 2], max_new_tokens=12, num_samples=3, seed=1, top_k=0)["tokens"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(r) for r in a}) > 1  # the samples of one batch differ from each other
    # greedy: every sample the same (3 samples: the prompt's program is the one compiled above)
    greedy = dec.generate([1, 2], max_new_tokens=12, num_samples=3, seed=5, temperature=0.0)["tokens"]
    assert (greedy == greedy[0]).all()


@pytest.mark.parametrize(
    "kw,kept",
    [
        (dict(top_k=2, top_p=1.0), [0, 1]),
        (dict(top_k=0, top_p=0.7), [0, 1]),  # 0.5 + 0.3 reaches 0.7: token 2 (mass before it 0.8) is dropped
        (dict(top_k=3, top_p=0.9), [0, 1, 2]),
        (dict(top_k=0, top_p=1.0), [0, 1, 2, 3]),
    ],
)
def test_top_k_top_p_keep_the_right_tokens_renormalised(kw, kept):
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    n = 20000
    logp = jnp.asarray(np.tile(np.log(probs)[[2, 0, 3, 1]], (n, 1)), jnp.float32)  # shuffled vocabulary order
    draws = np.asarray(sample_logits(logp, jax.random.key(0), temperature=1.0, **kw))
    ids = np.array([2, 0, 3, 1])[draws]  # back to the probs order
    freq = np.bincount(ids, minlength=4) / n
    expect = np.zeros(4)
    expect[kept] = probs[kept] / probs[kept].sum()
    assert np.abs(freq - expect).max() < 0.015, (freq, expect)


def test_xlnet_incremental_decoding_equals_full_pass_with_causal_perm_mask():
    """XLNet through the permutation mask: the log-probs of every sampled position equal one full pass over prompt +
    generated tokens with a causal perm_mask (query stream at t sees tokens < t, content stream tokens <= t); the
    step compiles once."""
    from xlgen.generate import XLNetDecoder
    from xlgen.models.params import materialize
    from xlgen.models.xlnet import model as X

    cfg = X.XLNetConfig(vocab_size=29, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24, dropout=0.0)
    rng = np.random.default_rng(7)
    abstract = nnx.eval_shape(lambda: X.XLNetLMHeadModel(cfg, rngs=nnx.Rngs(0)))
    model = materialize(abstract, lambda name, shape: rng.normal(size=shape) * 0.5 + name.endswith("scale"))
    model.eval()
    prompt, n_new = [4, 9, 2], 7
    dec = XLNetDecoder(model, 16)
    res = dec.generate(prompt, max_new_tokens=n_new, num_samples=2, seed=1, top_k=6, return_log_probs=True)
    assert dec.step_compilations() == 1
    seq = np.concatenate([np.tile(prompt, (2, 1)), res["tokens"]], axis=1)  # [2, 10]
    n = seq.shape[1]
    perm = np.triu(np.ones((n, n), np.float32))  # j >= i hidden from the query stream at i
    targets = np.arange(len(prompt), n)
    tm = np.zeros((2, len(targets), n), np.float32)
    tm[:, np.arange(len(targets)), targets] = 1

    @jax.jit
    def full(seq, perm, tm):
        m = nnx.merge(*nnx.split(model))
        return jax.nn.log_softmax(m(seq, None, perm_mask=perm, target_mapping=tm, mem_len=0)[0], axis=-1)

    ref = np.asarray(full(jnp.asarray(seq), jnp.asarray(np.broadcast_to(perm, (2, n, n))), jnp.asarray(tm)))
    err = float(np.abs(res["log_probs"] - ref).max())
    print(f"XLNet incremental vs full-pass log-probs over {n_new} tokens: max|diff| = {err:.2e}")
    assert err < 1e-5
