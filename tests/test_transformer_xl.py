"""Transformer-XL LM: parity with Hugging Face `TransfoXLLMHeadModel` (transformers 4.34.1) and model properties."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import xlgen
from xlgen.models.params import FrozenCall
from xlgen.models.relative_attention import advance_memory_validity
from xlgen.models.transformer_xl.model import (
    TransformerXLConfig,
    TransformerXLLM,
    attention_mask,
    count_params,
    from_params,
)

SMALL = dict(
    vocab_size=50,
    cutoffs=(10, 30),
    d_model=16,
    d_embed=16,
    n_head=2,
    d_head=8,
    d_inner=32,
    div_val=2,
    n_layer=2,
    mem_len=4,
    clamp_len=-1,
    same_length=False,
    untie_r=True,
    dropout=0.0,
    init_std=0.3,
    proj_init_std=0.3,
    scan_layers=True,
)  # scanned: CPU compile time dominates these tests


def random_params(abstract, seed: int = 0, std: float = 0.3) -> dict:
    """{path: N(0, std) array} for every nnx.Param of an abstract module (LayerNorm scales around 1).

    Tests build models from NumPy draws through `from_params` / `nnx.update` rather than by running the
    initialisers: a jitted random init compiles one threefry kernel per parameter, the slowest part on CPU."""
    rng = np.random.default_rng(seed)
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))[0]:
        name = "/".join(str(k.key) for k in path)
        out[name] = (rng.normal(size=leaf.shape) * std + name.endswith("scale")).astype(np.float32)
    return out


def make_model(seed: int = 0, std: float = 0.3, **overrides) -> TransformerXLLM:
    """A small model with random N(0, std) parameters, in eval mode."""
    cfg = TransformerXLConfig(**{**SMALL, **overrides})
    unscanned = dataclasses.replace(cfg, scan_layers=False, remat=False)
    abstract = nnx.eval_shape(lambda: TransformerXLLM(unscanned, rngs=nnx.Rngs(0)))
    model = from_params(cfg, random_params(abstract, seed, std))
    model.eval()
    return model


def fill_random(abstract, seed: int = 0, std: float = 0.5):
    """Materialise an abstract parameter-only module with random N(0, std) parameters."""
    graphdef, state = nnx.split(abstract)
    values = random_params(abstract, seed, std)
    pure = jax.tree_util.tree_map_with_path(
        lambda path, leaf: jax.device_put(values["/".join(str(k.key) for k in path)]), nnx.to_pure_dict(state)
    )
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def unscanned_params_of(state) -> dict:
    """{"a/b/0/c": array} of an nnx.State (parameters or gradients)."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]:
        flat["/".join(str(k.key) for k in path)] = np.asarray(leaf)
    return flat


def unscanned_params(model: TransformerXLLM) -> dict:
    """Parameters of an unscanned model in the `from_params` input format."""
    assert not model.config.scan_layers
    return unscanned_params_of(nnx.state(model, nnx.Param))


@nnx.jit(static_argnames=("mem_len",))
def forward(model, ids, mems, mem_len):
    return model(ids, mems, mem_len=mem_len)


# ----------------------------------------------------------------------------------------------------------------
# Parity with transformers 4.34.1
# ----------------------------------------------------------------------------------------------------------------

HF_BASE = dict(
    vocab_size=60,
    d_model=16,
    n_head=2,
    d_head=8,
    d_inner=32,
    n_layer=2,
    dropout=0.0,
    dropatt=0.0,
    init_std=0.3,
    proj_init_std=0.3,
)
HF_CASES = {
    # plain softmax, per-layer u/v, safetensors
    "plain_untied_r": (
        dict(cutoffs=[], div_val=1, d_embed=16, mem_len=5, same_length=False, clamp_len=-1, untie_r=True),
        "safetensors",
        dict(scan_layers=False),
    ),
    # adaptive input + softmax, div_val > 1 (projections shared but the first), shared u/v, .bin
    "adaptive_div2_tied_r": (
        dict(cutoffs=[20, 40], div_val=2, d_embed=16, mem_len=6, same_length=False, clamp_len=-1, untie_r=False),
        "bin",
        dict(scan_layers=True),
    ),
    # div_val=1 with d_embed != d_model (one tied projection), same_length + clamp_len, loaded with scan_layers
    "samelen_clamp_proj_scan": (
        dict(cutoffs=[20, 45], div_val=1, d_embed=12, mem_len=7, same_length=True, clamp_len=3, untie_r=True),
        "safetensors",
        dict(scan_layers=True),
    ),
    # untied output embedding and projections, div_val=3, same_length + clamp, shared u/v
    "untied_out_div3": (
        dict(
            cutoffs=[15, 30],
            div_val=3,
            d_embed=18,
            mem_len=4,
            same_length=True,
            clamp_len=2,
            untie_r=False,
            proj_share_all_but_first=False,
            tie_word_embeddings=False,
        ),
        "safetensors",
        dict(scan_layers=True),
    ),
}
LABEL_CASES = ("plain_untied_r", "adaptive_div2_tied_r")  # label-loss parity (one more compile each)


@pytest.fixture(scope="module")
def torch_and_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_parity_two_segments(case, tmp_path, torch_and_transformers):
    """Random TransfoXLLMHeadModel -> save_pretrained -> xlgen.from_pretrained; two consecutive segments (each
    side feeding its own memory) give the same log-probs (1e-4 abs), memories and label losses."""
    torch, transformers = torch_and_transformers
    kw, fmt, load_kwargs = HF_CASES[case]
    torch.manual_seed(0)
    hf = transformers.TransfoXLLMHeadModel(transformers.TransfoXLConfig(**HF_BASE, **kw)).eval()
    with torch.no_grad():  # HF inits biases to 0 and LayerNorm near 1: make every parameter matter
        for name, p in hf.named_parameters():
            if "bias" in name or "layer_norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path, safe_serialization=(fmt == "safetensors"))
    assert (tmp_path / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")).exists()
    model = xlgen.from_pretrained(str(tmp_path), **load_kwargs)

    rng = np.random.default_rng(0)
    b, l = 2, 6
    segs = [rng.integers(0, HF_BASE["vocab_size"], (b, l)) for _ in range(2)]
    hf_mems, ours_mems, max_diff = None, None, 0.0
    for ids in segs:
        prev_hf_mems = hf_mems
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor(ids), mems=hf_mems)
            ref_loss = hf(input_ids=torch.tensor(ids), mems=hf_mems, labels=torch.tensor(ids))
        out = model(input_ids=ids, mems=ours_mems)
        ref_lp = ref.prediction_scores.numpy()
        assert ref_lp.std() > 0.5  # log-probs far from uniform: the comparison is not vacuous
        diff = np.abs(np.asarray(out.log_probs) - ref_lp).max()
        max_diff = max(max_diff, diff)
        assert diff < 1e-4, (case, diff)
        assert len(out.mems) == len(ref.mems)
        for ours_m, ref_m in zip(out.mems, ref.mems):
            np.testing.assert_allclose(np.asarray(ours_m), ref_m.numpy(), atol=1e-4)
        if case in LABEL_CASES:  # HF orders `losses` by cluster when cutoffs exist; ours are in token order
            lab = model(input_ids=ids, mems=ours_mems, labels=ids)
            np.testing.assert_allclose(
                np.sort(np.asarray(lab.losses).ravel()), np.sort(ref_loss.losses.numpy().ravel()), atol=1e-4
            )
            np.testing.assert_allclose(float(lab.loss), float(ref_loss.loss), atol=1e-5)
        hf_mems, ours_mems = ref.mems, out.mems
    print(f"{case}: max |log_probs - HF| = {max_diff:.2e}")
    # HF-layout memories (torch tensors) are accepted as input too
    again = model(input_ids=segs[1], mems=list(prev_hf_mems))
    np.testing.assert_allclose(np.asarray(again.log_probs), ref.prediction_scores.numpy(), atol=1e-4)


def test_hf_base_model_hidden_states(tmp_path, torch_and_transformers):
    """A TransfoXLModel directory (no LM head) loads and returns HF's last_hidden_state and mems."""
    torch, transformers = torch_and_transformers
    torch.manual_seed(1)
    kw = HF_CASES["adaptive_div2_tied_r"][0]
    hf = transformers.TransfoXLModel(transformers.TransfoXLConfig(**HF_BASE, **kw)).eval()
    hf.save_pretrained(tmp_path)
    model = xlgen.from_pretrained(str(tmp_path), scan_layers=True)
    ids = np.random.default_rng(1).integers(0, HF_BASE["vocab_size"], (2, 6))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids))
    out = model(input_ids=ids)
    assert out.log_probs is None
    np.testing.assert_allclose(np.asarray(out.last_hidden_state), ref.last_hidden_state.numpy(), atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Recurrence
# ----------------------------------------------------------------------------------------------------------------


def test_recurrence_equals_full_context_and_longer_eval_memory():
    """Segment-by-segment evaluation equals one causal pass over the concatenation whenever the memory holds
    every earlier token: with the training memory (config mem_len = L = segment length) for the 2nd segment,
    and with a longer evaluation memory (mem_len=2L) for the 3rd; a memory of only L tokens differs there."""
    L = SMALL["mem_len"]
    model = make_model(cutoffs=(), div_val=1)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, 3 * L)))
    full, _ = forward(model, ids, None, mem_len=2 * L)  # (one static mem_len: fewer compilations)

    lp1, m1 = forward(model, ids[:, :L], None, mem_len=2 * L)
    assert m1.shape == (SMALL["n_layer"], 2, L, SMALL["d_model"])  # = the training memory after one segment
    lp2, m2 = forward(model, ids[:, L : 2 * L], m1, mem_len=2 * L)
    assert m2.shape == (SMALL["n_layer"], 2, 2 * L, SMALL["d_model"])
    np.testing.assert_allclose(lp1, full[:, :L], atol=1e-5)
    np.testing.assert_allclose(lp2, full[:, L : 2 * L], atol=1e-5)
    lp3_long, _ = forward(model, ids[:, 2 * L :], m2, mem_len=2 * L)
    np.testing.assert_allclose(lp3_long, full[:, 2 * L :], atol=1e-5)
    lp3_short, _ = forward(model, ids[:, 2 * L :], m2[:, :, L:], mem_len=2 * L)  # training-length memory
    assert np.abs(lp3_short - full[:, 2 * L :]).max() > 1e-3


@pytest.mark.parametrize("same_length", [False, True])
def test_fixed_length_memory_buffer_equals_growing_memory(same_length):
    """A zero buffer of mem_len rows with a validity count (`mem_valid`, the unfilled rows masked) gives exactly
    the growing memory's results for every segment while the memory fills (and so, without same_length, the
    full causal pass), with one compiled shape: the buffer and its count come back in the same shapes."""
    L = SMALL["mem_len"]
    model = make_model(cutoffs=(), div_val=1, same_length=same_length)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, SMALL["vocab_size"], (2, 3 * L)))

    traces = []

    @nnx.jit(static_argnames=("mem_len",))
    def step(model, ids, mems, valid, mem_len):
        traces.append(mems.shape)
        lp, new = model(ids, mems, mem_len=mem_len, mem_valid=valid)
        return lp, new, advance_memory_validity(valid, ids.shape[1], mem_len)

    full, _ = forward(model, ids, None, mem_len=2 * L)
    buf, valid = model.init_mems(2, 2 * L), jnp.zeros((2,), jnp.int32)
    grow = None
    for k in range(3):
        seg = ids[:, k * L : (k + 1) * L]
        lp, buf, valid = step(model, seg, buf, valid, mem_len=2 * L)
        ref, grow = forward(model, seg, grow, mem_len=2 * L)  # memory of 0, L, 2L rows
        assert buf.shape == (SMALL["n_layer"], 2, 2 * L, SMALL["d_model"])
        assert valid.tolist() == [min((k + 1) * L, 2 * L)] * 2
        np.testing.assert_allclose(lp, ref, atol=1e-5)
        np.testing.assert_allclose(buf[:, :, 2 * L - grow.shape[2] :], grow, atol=1e-5)
        if not same_length:
            np.testing.assert_allclose(lp, full[:, k * L : (k + 1) * L], atol=1e-5)
    assert len(traces) == 1  # traced (compiled) once: nothing recompiled while the memory filled


@pytest.mark.parametrize(
    "overrides",
    [dict(scan_layers=True), dict(scan_layers=False, same_length=True, clamp_len=3, untie_r=False)],
    ids=["scanned", "listed_same_length_clamp_shared_biases"],
)
def test_cached_evaluation_equals_projecting_the_memory(overrides):
    """`TransfoXLPretrained` with its evaluation cache (position keys formed once per length; the returned memory
    rows' keys/values reused when those very `mems` come back) gives the uncached results, segment after segment,
    for HF-style zero memory and for the fixed-length buffer (`mem_valid`); other mems are projected as usual."""
    from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained

    L, M = 3, 5
    ids = np.random.default_rng(2).integers(0, SMALL["vocab_size"], (2, 4 * L))
    for valid in (None, 0):
        runs = {}
        for cache in (False, True):
            wrapper = TransfoXLPretrained(make_model(mem_len=M, **overrides), cache=cache)
            mems, mv, outs, used = None, valid, [], []
            for k in range(4):
                seg = ids[:, k * L : (k + 1) * L]
                if cache and mems is not None:  # the previous output's own arrays: their heads are reused
                    used.append(wrapper._cache_arg(mems, list(mems), "hf", L, M, mv is not None)["kv_mem"] is not None)
                out = wrapper(input_ids=seg, mems=mems, mem_valid=mv)
                outs.append((np.asarray(out.log_probs), np.stack([np.asarray(m) for m in out.mems])))
                mems, mv = out.mems, out.mem_valid
            runs[cache] = outs
            if cache:
                assert used == [True] * 3
                fresh = [jnp.array(m) for m in mems]  # equal values, other arrays: projected, same result
                assert wrapper._cache_arg(fresh, fresh, "hf", L, M, mv is not None)["kv_mem"] is None
                a = wrapper(input_ids=ids[:, :L], mems=fresh, mem_valid=mv)
                b = TransfoXLPretrained(wrapper.module, cache=False)(input_ids=ids[:, :L], mems=mems, mem_valid=mv)
                np.testing.assert_allclose(np.asarray(a.log_probs), np.asarray(b.log_probs), atol=1e-5)
        for (lp0, m0), (lp1, m1) in zip(runs[False], runs[True]):
            np.testing.assert_allclose(lp1, lp0, atol=1e-5)
            np.testing.assert_allclose(m1, m0, atol=1e-5)


def test_cached_segment_writes_memory_sized_arrays_once():
    """A cached segment (HF-layout memory and its keys/values passed back, as in an evaluation loop) writes each
    layer's appended keys and values and each returned memory array once: the heads stay in the products'
    `[b, n, d, k]` layout (no transposes or re-slicing of the memory rows, no stacking across layers) and the
    memory is returned per layer from its input. Before, the same program also transposed, sliced and stacked
    them (12 and 4 such ops here instead of 4 and 2)."""
    import re

    from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained

    L, M, n_layer = 5, 13, SMALL["n_layer"]
    wrapper = TransfoXLPretrained(make_model(mem_len=M, scan_layers=False))
    ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (1, 2 * L)).astype(np.int32)
    mems = wrapper(input_ids=ids[:, :L]).mems
    mem_arg, layout = wrapper._mems_arg(mems, 1)
    cache = wrapper._cache_arg(mems, mem_arg, layout, L, M, False, 1)
    assert cache["kv_mem"] is not None
    static = dict(mode="log_probs", mem_len=M, layout=layout)
    hlo = wrapper._forward.lower(ids[:, L:], mem_arg, None, None, cache, **static).compile().as_text()
    heads = memories = 0
    for line in hlo[hlo.index("\nENTRY") :].splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%[\w.\-]+ = f32\[([\d,]*)\]\S* ([\w-]+)\(", line)
        if not m or m.group(2) in ("parameter", "bitcast", "get-tuple-element", "tuple", "constant"):
            continue
        dims = [int(x) for x in m.group(1).split(",") if x]
        heads += bool({M, M + L} & set(dims)) and SMALL["d_head"] in dims  # keys / values / position keys
        memories += M in dims and SMALL["d_model"] in dims
    assert heads <= 2 * n_layer and memories <= n_layer, (heads, memories)


def test_evaluation_program_is_compiled_for_small_ops():
    """On XLA:CPU the wrapper compiles its segment program with `platforms.small_op_compiler_options()`: no YNNPACK
    fusions, which the same program compiled with XLA's defaults does use (for its products and reductions)."""
    from xlgen.models.transformer_xl.pretrained import TransfoXLPretrained

    wrapper = TransfoXLPretrained(make_model(mem_len=5))
    ids = np.zeros((1, 3), np.int32)
    args = (ids, None, None, None, wrapper._cache_arg(None, None, "init", 3, 5, False))
    static = dict(mode="log_probs", mem_len=5, layout="init")
    ours = wrapper._forward.lower(*args, **static).compile().as_text()
    default = FrozenCall(wrapper.module, wrapper._pure_forward, static_argnames=tuple(static))
    assert "__ynn_fusion" in default.lower(*args, **static).compile().as_text()
    assert "__ynn_fusion" not in ours


def test_no_gradient_flows_into_memory():
    """d loss / d mems is exactly zero, the new memory carries no gradient, parameters do get gradients."""
    model = make_model(n_layer=1, cutoffs=(), div_val=1)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, SMALL["vocab_size"], (2, 5)))
    mems = jnp.asarray(rng.normal(size=(1, 2, SMALL["mem_len"], SMALL["d_model"])), jnp.float32)

    @nnx.jit
    def grads(model, mems):
        def loss(model, mems):
            nll, new_mems = model(ids, mems, labels=ids)
            return nll.mean(), new_mems

        def mem_only(model, mems):
            return model(ids, mems, labels=ids)[1].sum()

        return (
            nnx.grad(loss, argnums=(0, 1), has_aux=True)(model, mems),
            nnx.grad(mem_only, argnums=(0, 1))(model, mems),
        )

    ((g_model, g_mems), _), g_new_mems = grads(model, mems)
    assert np.all(np.asarray(g_mems) == 0.0)
    assert np.abs(np.asarray(g_model["layers"]["attn"]["q"]["kernel"][...])).max() > 0
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(g_new_mems))


def test_attention_mask_conventions():
    """Causal mask with memory, and HF/PyTorch same_length (each query sees exactly mem_len keys when full)."""
    m = attention_mask(3, 2)
    assert m.tolist() == [[False] * 3 + [True] * 2, [False] * 4 + [True], [False] * 5]
    s = attention_mask(3, 4, same_length=True, mem_len=4)
    assert (~s).sum(1).tolist() == [4, 4, 4]
    assert s[1].tolist() == [True, True, False, False, False, False, True]


# ----------------------------------------------------------------------------------------------------------------
# Scan over layers, adaptive-softmax NLL, dtypes
# ----------------------------------------------------------------------------------------------------------------


def test_scanned_equals_unscanned():
    """scan_layers=True (stacked "layers" params, here with remat) gives the same NLL, memory and gradients as
    the unscanned layer loop."""
    plain = make_model(untie_r=False, same_length=True, clamp_len=3, scan_layers=False, cutoffs=(), div_val=1)
    scanned = from_params(dataclasses.replace(plain.config, scan_layers=True, remat=True), unscanned_params(plain))
    scanned.eval()
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, SMALL["vocab_size"], (2, 5)))
    mems = jnp.asarray(rng.normal(size=(SMALL["n_layer"], 2, SMALL["mem_len"], SMALL["d_model"])), jnp.float32)

    @nnx.jit
    def loss_and_grad(model):
        def loss(model):
            nll, new_mems = model(ids, mems, labels=ids)
            return nll.mean(), new_mems

        return nnx.value_and_grad(loss, has_aux=True)(model)

    (l0, m0), g0 = loss_and_grad(plain)
    (l1, m1), g1 = loss_and_grad(scanned)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    np.testing.assert_allclose(m1, m0, atol=1e-6)
    flat0 = {k: v for k, v in unscanned_params_of(g0).items()}
    for name, g in unscanned_params_of(g1).items():
        if name.startswith("layers/"):
            rest = name[len("layers/") :]
            ref = np.stack([flat0[f"layers/{n}/{rest}"] for n in range(SMALL["n_layer"])])
        else:
            ref = flat0[name]
        np.testing.assert_allclose(g, ref, atol=1e-6, err_msg=name)
    meta = nnx.state(scanned, nnx.Param)["layers"]["attn"]["q"]["kernel"].get_metadata()["out_sharding"]
    assert meta == ("layers", "embed", "heads", "kv")


@pytest.mark.parametrize(
    "kw", [dict(cutoffs=(10, 30), div_val=2), dict(cutoffs=(10, 30), div_val=1, d_embed=12, tie_weights=False)]
)
def test_label_nll_equals_gathered_log_probs(kw):
    """AdaptiveLogSoftmax.nll(labels) == -log_probs[label] in value and gradient (w.r.t. hidden states and all
    input/output parameters), with the blocked logsumexp (block 7 < every cluster) and the sorted tail chunks
    (4 tokens, several per cluster) exercised, and ignored labels (< 0) giving 0."""
    from xlgen.models.adaptive_softmax import AdaptiveEmbedding, AdaptiveLogSoftmax

    kw = dict(kw)
    d_embed, tie = kw.pop("d_embed", 16), kw.pop("tie_weights", True)
    emb, sm = fill_random(
        nnx.eval_shape(
            lambda: (
                AdaptiveEmbedding(50, d_embed, 16, rngs=nnx.Rngs(0), **kw),
                AdaptiveLogSoftmax(
                    50,
                    d_embed,
                    16,
                    tie_weights=tie,
                    tie_projs=(False,) + (True,) * len(kw["cutoffs"]),
                    block_size=7,
                    chunk_size=4,
                    rngs=nnx.Rngs(1),
                    **kw,
                ),
            )
        )
    )
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(3, 8, 16)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 50, (3, 8))).at[0, 2].set(-100)

    @nnx.jit
    def both(sm, emb, h):
        def via_nll(sm, emb, h):
            return sm.nll(h, labels, emb)

        def via_log_probs(sm, emb, h):
            picked = jnp.take_along_axis(sm.log_probs(h, emb), jnp.maximum(labels, 0)[..., None], -1)[..., 0]
            return jnp.where(labels >= 0, -picked, 0.0)

        a, ga = nnx.value_and_grad(lambda *x: via_nll(*x).sum(), argnums=(0, 1, 2), has_aux=False)(sm, emb, h)
        b, gb = nnx.value_and_grad(lambda *x: via_log_probs(*x).sum(), argnums=(0, 1, 2))(sm, emb, h)
        return a, b, via_nll(sm, emb, h), via_log_probs(sm, emb, h), ga, gb

    _, _, nll, ref, ga, gb = both(sm, emb, h)
    assert nll.shape == (3, 8) and nll.dtype == jnp.float32 and float(nll[0, 2]) == 0.0
    assert float(ref.std()) > 0.5
    np.testing.assert_allclose(nll, ref, atol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


@pytest.mark.parametrize("work", [{}, dict(softmax_block_size=7, softmax_chunk_size=4)])
def test_padded_table_rows_equal_the_unpadded_model(work):
    """`table_rows_multiple` stores every adaptive table and output bias with its rows rounded up (10 / 20 / 20 ->
    16 / 24 / 24 here): loaded from the same real-sized weights, the padded model gives the unpadded one's label NLL
    and full log-probs, the same gradients on the real rows and zero on the padding, and exports the same HF state
    dict (the padding sliced off). Whole clusters at once, and blocked log-normalisers with sorted tail chunks."""
    from xlgen.models.transformer_xl.hf_export import to_hf

    base = make_model(std=0.1, scan_layers=False, **work)
    padded = from_params(dataclasses.replace(base.config, table_rows_multiple=8), unscanned_params(base))
    padded.eval()
    stored = unscanned_params(padded)
    for k, rows in enumerate((16, 24, 24)):
        assert stored[f"embedding/tables/{k}"].shape[0] == rows and stored[f"softmax/biases/{k}"].shape == (rows,)
    assert not stored["embedding/tables/2"][20:].any()

    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(3, 8, 16)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 50, (3, 8))).at[0, :3].set(jnp.asarray([9, 29, 49]))

    @nnx.jit
    def nll_and_grads(model, h):
        def loss(model, h):
            return (model.softmax.nll(h, labels, model.embedding) * jnp.arange(1, 25).reshape(3, 8)).sum()

        value, grads = nnx.value_and_grad(loss)(model, h)
        return value, grads, model.softmax.log_probs(h, model.embedding)

    v0, g0, lp0 = nll_and_grads(base, h)
    v1, g1, lp1 = nll_and_grads(padded, h)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    assert lp1.shape == lp0.shape == (3, 8, 50)
    np.testing.assert_allclose(lp1, lp0, atol=1e-5)
    grads0, grads1 = unscanned_params_of(g0), unscanned_params_of(g1)
    for name, g in grads1.items():
        real = grads0[name].shape[0] if g.ndim else 0
        np.testing.assert_allclose(g[:real] if g.ndim else g, grads0[name], atol=1e-5, err_msg=name)
        assert not np.any(g[real:]), name
    cfg0, sd0 = to_hf(base)
    cfg1, sd1 = to_hf(padded)
    assert cfg1 == cfg0 and sorted(sd1) == sorted(sd0)
    for name in sd0:
        np.testing.assert_array_equal(np.asarray(sd1[name]), np.asarray(sd0[name]), err_msg=name)


def test_log_probs_normalised_and_bfloat16_compute():
    """Full log-probs sum to 1 over V; bfloat16 compute keeps float32 params and float32 log-probs close to the
    float32 model's."""
    model = make_model(std=0.1)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, 5)))
    lp32, _ = forward(model, ids, model.init_mems(2), mem_len=SMALL["mem_len"])
    np.testing.assert_allclose(jnp.exp(lp32).sum(-1), 1.0, atol=1e-5)
    bf = make_model(std=0.1, dtype="bfloat16")  # same seed: same float32 params
    np.testing.assert_array_equal(bf.embedding.tables[0][...], model.embedding.tables[0][...])
    lp16, mems16 = forward(bf, ids, bf.init_mems(2), mem_len=SMALL["mem_len"])
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(bf, nnx.Param)))
    assert lp16.dtype == jnp.float32 and mems16.dtype == jnp.bfloat16
    assert np.abs(np.asarray(lp16) - np.asarray(lp32)).max() < 0.1


# ----------------------------------------------------------------------------------------------------------------
# Paper parameter counts (abstract shapes only)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kw,paper",
    [
        (
            "enwik8 12L",
            dict(
                vocab_size=204,
                cutoffs=(),
                d_model=512,
                d_embed=512,
                n_head=8,
                d_head=64,
                d_inner=2048,
                div_val=1,
                n_layer=12,
                untie_r=False,
            ),
            41.06e6,
        ),
        (
            "enwik8/text8 24L",
            dict(
                vocab_size=204,
                cutoffs=(),
                d_model=1024,
                d_embed=1024,
                n_head=8,
                d_head=128,
                d_inner=3072,
                div_val=1,
                n_layer=24,
                untie_r=True,
            ),
            277.2e6,
        ),
        (
            "WT103 base",
            dict(
                vocab_size=267735,
                cutoffs=(20000, 40000, 200000),
                d_model=410,
                d_embed=410,
                n_head=10,
                d_head=41,
                d_inner=2100,
                div_val=1,
                n_layer=16,
                untie_r=False,
            ),
            151.1e6,
        ),
    ],
)
def test_paper_parameter_counts(name, kw, paper):
    """Parameter counts of the paper configs from `nnx.eval_shape` (nothing allocated), within 0.1%.

    Convention: every nnx.Param counted once. Per layer: q, k, v, r, o projections (no biases), FFN weights and
    biases, two LayerNorms (scale + bias); r_w_bias / r_r_bias per layer (`untie_r`, the TF large scripts) or
    once per model (PyTorch base scripts); the input embedding (tied to the output softmax, counted once), the
    output softmax biases, and the adaptive-softmax cluster weights/biases. No projections when d_embed ==
    d_model with div_val=1 (the WT103 base setting). Exact counts: 41,055,436 / 277,278,924 / 151,107,538.
    """
    cfg = TransformerXLConfig(scan_layers=True, **kw)
    abstract = nnx.eval_shape(lambda: TransformerXLLM(cfg, rngs=nnx.Rngs(0)))
    n = count_params(abstract)
    assert abs(n - paper) / paper < 1e-3, (name, n)


def test_every_parameter_has_logical_axes():
    abstract = nnx.eval_shape(lambda: TransformerXLLM(TransformerXLConfig(**SMALL), rngs=nnx.Rngs(0)))
    for path, var in jax.tree_util.tree_flatten_with_path(
        nnx.state(abstract, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]:
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == len(var.shape), (jax.tree_util.keystr(path), axes)


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------


def test_config_from_hf_and_round_trip():
    hf = {
        "model_type": "transfo-xl",
        "vocab_size": 100,
        "cutoffs": [10, 50],
        "d_model": 32,
        "d_embed": 32,
        "n_head": 2,
        "d_head": 16,
        "d_inner": 64,
        "div_val": 2,
        "n_layer": 2,
        "mem_len": 8,
        "clamp_len": 5,
        "same_length": False,
        "untie_r": False,
        "tie_projs": [False, True, True],
        "architectures": ["x"],
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
    }
    cfg = TransformerXLConfig.from_hf(hf, mem_len=16)
    assert cfg.cutoffs == (10, 50) and cfg.resolved_tie_projs == (False, True, True) and cfg.mem_len == 16
    assert TransformerXLConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="pre_lnorm"):
        TransformerXLConfig.from_hf({**hf, "pre_lnorm": True})
    with pytest.raises(ValueError, match="cutoffs"):
        TransformerXLConfig(**{**SMALL, "cutoffs": (30, 10)})
    with pytest.raises(ValueError, match="unknown TransformerXLConfig overrides"):
        TransformerXLConfig.from_hf(hf, mem_length=3)
