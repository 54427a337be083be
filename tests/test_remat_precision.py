"""Run controls of issue 37: rematerialisation policies by name and the precision policy.

* Remat: for each family, every policy of `xlgen.models.layers.REMAT_POLICIES` gives the gradients of `none`
  (no rematerialisation) to <= 1e-6 in float32, with dropout on (the recomputed forward draws the same masks); the
  policies differ in what the compiled step keeps (fewer saved residuals = a smaller temporary buffer).
* Precision: each key (`model.param_dtype`, `model.dtype`, `model.softmax_dtype`, `model.logits_dtype`,
  `optimizer.state_dtype`) shows up as the dtype of what it names in the compiled train step; a bfloat16 run's loss
  falls.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_utils import REPO, random_train_batch

from xlgen.models.layers import REMAT_POLICIES, remat_policy

ONE = {"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, "mesh.num_devices": 1}
SMALL = {
    "txl_tiny.py": {
        "model.d_model": 32,
        "model.d_embed": 32,
        "model.d_inner": 64,
        "data.tgt_len": 8,
        "model.mem_len": 8,
        "data.batch_size": 4,
    },
    "xlnet_tiny.py": {
        "model.d_model": 32,
        "model.d_inner": 64,
        "model.mem_len": 8,
        "model.reuse_len": 4,
        "data.batch_size": 4,
        "data.seq_len": 8,
        "data.reuse_len": 4,
        "data.perm_size": 4,
        "data.num_predict": 3,
    },
    # one layer per block (block 2's is the pooling layer) and one decoder layer: every kind of Funnel layer once
    "funnel_tiny.py": {
        "model.block_sizes": "1,1",
        "model.num_decoder_layers": 1,
        "model.d_model": 32,
        "model.n_head": 2,
        "model.d_head": 16,
        "model.d_inner": 64,
        "data.batch_size": 4,
        "data.seq_len": 16,
    },
}
# the remat programs (one compile per policy) at d_model 16 and one layer: the gradients' equality and the
# recomputed FLOPs' order depend on the layer's structure (each layer is wrapped alike), not the width or depth
REMAT_SMALLER = {
    "txl_tiny.py": {
        "model.n_layer": 1,
        "model.d_model": 16,
        "model.d_embed": 16,
        "model.n_head": 2,
        "model.d_head": 8,
        "model.d_inner": 32,
    },
    "xlnet_tiny.py": {
        "model.n_layer": 1,
        "model.d_model": 16,
        "model.n_head": 2,
        "model.d_head": 8,
        "model.d_inner": 32,
    },
    "funnel_tiny.py": {"model.d_model": 16, "model.d_head": 8, "model.d_inner": 32},
}
_CPU_FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _program(config_file, over):
    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.train import build_program

    over = {**SMALL[config_file], **ONE, **over}  # `over` may replace the one-device mesh
    config = load_config(f"{REPO}/configs/pretrain/{config_file}", {k: str(v) for k, v in over.items()})
    mesh = sharding.make_mesh(config.mesh)
    return build_program(config, mesh), mesh


def _batch_and_mems(program):
    """A valid random training batch for the program's objective (fixed seed) and random memory."""
    rng = np.random.default_rng(0)
    batch = random_train_batch(program, rng, random_masks=True)
    if program.mems_shape is None:
        return batch, None
    mems = rng.normal(size=program.mems_shape).astype(program.mems_dtype)
    return batch, jax.device_put(mems, program.mems_sharding)


def _grad_fn(program):
    """Jitted params -> (loss, gradients) of the program's training loss (train mode: dropout on, fixed key)."""
    from xlgen import sharding
    from xlgen.models.params import materialize
    from xlgen.train.program import seeded_rest

    spec, config, key = program.train_spec, program.config, jax.random.key(7)

    def loss(params, batch, mems):
        model = materialize(spec.abstract, params, rest=seeded_rest(spec.rest, key))
        with sharding.activation_rules(config.mesh.rules):
            return program.objective.loss(model, batch, mems, key, config)[0]

    return jax.jit(jax.value_and_grad(loss))


def test_remat_names_and_booleans():
    assert remat_policy(True) == "full" and remat_policy(False) == "none"
    assert remat_policy("True") == "full" and remat_policy("false") == "none"
    assert all(remat_policy(p) == p for p in REMAT_POLICIES)
    with pytest.raises(ValueError, match="model.remat='dot'.*dots_no_batch"):
        remat_policy("dot")


@pytest.mark.parametrize(
    "config_file",
    [
        "txl_tiny.py",
        pytest.param("xlnet_tiny.py", marks=pytest.mark.slow),
        pytest.param("funnel_tiny.py", marks=pytest.mark.slow),
    ],
)
def test_every_remat_policy_gives_the_gradients_of_none(config_file):
    """Same loss and gradients (<= 1e-6, float32, dropout on) under every policy; what differs is the recomputed
    work, counted as the matmul FLOPs of the traced step: `dots` saves every product (nothing recomputed),
    `dots_no_batch` recomputes the attention's batched products only, `attention_out` / `mlp` the layer's other
    products, `full` the whole forward."""
    from xlgen.plan import jaxpr_matmul_flops

    flops = {}
    # the policies live in the shared attention / FFN layers: Transformer-XL checks all of them, XLNet and Funnel
    # (their own layer stacks) the ones that name activations, against `none` and `full`
    policies = REMAT_POLICIES if config_file == "txl_tiny.py" else ("none", "attention_out", "mlp", "full")
    params = None  # the policies change no parameter: initialised once (by the first program), shared
    grad_fns = {}
    for policy in policies:
        program, mesh = _program(config_file, {**REMAT_SMALLER[config_file], "model.remat": policy})
        assert program.config.model.remat == policy
        with jax.set_mesh(mesh):
            if params is None:
                params = program.init_state()[0]["params"]
                batch, mems = _batch_and_mems(program)  # fixed seed: the same for every policy
            assert jax.tree.structure(params) == jax.tree.structure(program.abstract_state()["params"]), policy
            grad_fns[policy] = _grad_fn(program)
            flops[policy] = jaxpr_matmul_flops(grad_fns[policy].trace(params, batch, mems).jaxpr.jaxpr)[0]
    # one executable holds every policy's gradient program (one compile per family, not per policy); each output is
    # still computed by its own policy's backward pass
    with jax.set_mesh(mesh):
        every = jax.jit(lambda p, b, m: {policy: fn(p, b, m) for policy, fn in grad_fns.items()})
        compiled = every.trace(params, batch, mems).lower().compile(compiler_options=_CPU_FAST)
        results = jax.tree.map(np.asarray, compiled(params, batch, mems))
    loss0, g0 = results["none"]
    assert np.isfinite(loss0)
    for policy, (loss, g) in results.items():
        np.testing.assert_allclose(loss, loss0, atol=1e-6, err_msg=policy)
        for name in g0:
            np.testing.assert_allclose(g[name], g0[name], atol=1e-6, rtol=0, err_msg=f"{policy}: {name}")
    if "dots" in flops:
        assert flops["dots"] == flops["none"] < flops["dots_no_batch"] < flops["full"], flops
        assert flops["offload_dots"] == flops["dots_no_batch"], flops
    for named in ("attention_out", "mlp"):  # their products are kept, the rest of the layer runs again
        assert flops["none"] < flops[named] < flops["full"], (named, flops)


# ------------------------------------------------------------------------------------------------ precision policy


def _eqns(jaxpr):
    """Every equation of a jaxpr, recursing into scan / remat / jit / custom-vjp bodies."""
    from xlgen.plan import _subjaxprs

    for eqn in jaxpr.eqns:
        yield eqn
        for _, sub in _subjaxprs(eqn.params):
            yield from _eqns(sub)


def _lowered_step(over):
    """(program, the train step's jaxpr, its lowering) for tiny XLNet (attention softmax, LM logits). The lowering's
    `out_info` is the compiled executable's: `Compiled.out_info` reads the same global output avals (XLA does not
    change a program's output dtypes), so the dtypes are read without compiling; the all-bfloat16 step is compiled
    and run by `test_bfloat16_run_trains`."""
    program, mesh = _program("xlnet_tiny.py", over)
    with jax.set_mesh(mesh):
        traced = program.train_step.trace(*program.abstract_args())
        lowered = traced.lower()
    return program, traced.jaxpr.jaxpr, lowered


def _dtypes(jaxpr, primitive, where=lambda aval: True):
    """The dtypes of the outputs of `primitive` equations whose output aval satisfies `where`."""
    out = set()
    for eqn in _eqns(jaxpr):
        if eqn.primitive.name == primitive:
            out |= {str(v.aval.dtype) for v in eqn.outvars if where(v.aval)}
    return out


_DEFAULT = {}


def _default():
    if not _DEFAULT:
        _DEFAULT["step"] = _lowered_step({})
    return _DEFAULT["step"]


def _floating_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim]


@pytest.mark.parametrize(
    "key,value",
    [
        ("model.param_dtype", "bfloat16"),
        ("optimizer.state_dtype", "bfloat16"),
        ("model.dtype", "bfloat16"),
        ("model.softmax_dtype", "bfloat16"),
        ("model.logits_dtype", "bfloat16"),
    ],
)
def test_precision_option_sets_the_compiled_steps_dtypes(key, value):
    """Each key changes exactly what it names, in the compiled train step (its state in / out and the traced
    program): parameters, Adam moments, the layers' matmuls, the attention softmax `[b, n, q, k]`, the LM logits
    `[b, m, V]`; the default step has float32 everywhere."""
    _, jaxpr0, lowered0 = _default()
    program, jaxpr, lowered = _lowered_step({key: value})
    vocab, d_inner = int(program.config.model.vocab_size), int(program.config.model.d_inner)
    state_out = lowered.out_info[0]
    params, moments = _floating_leaves(state_out["params"]), _floating_leaves(state_out["opt_state"])
    params0, moments0 = (
        _floating_leaves(lowered0.out_info[0]["params"]),
        _floating_leaves(lowered0.out_info[0]["opt_state"]),
    )
    attention_softmax = lambda a: a.ndim == 4  # exp of the scores [b, n, q, k]
    logits = lambda a: a.ndim == 3 and a.shape[-1] == vocab  # exp inside the logsumexp over [b, m, V]
    ffn = lambda a: a.ndim == 3 and a.shape[-1] == d_inner  # x W_1 [b, l, d_inner]
    # defaults: float32 throughout
    assert {str(x.dtype) for x in params0 + moments0} == {"float32"}
    assert _dtypes(jaxpr0, "exp", attention_softmax) == {"float32"}
    assert _dtypes(jaxpr0, "exp", logits) == {"float32"}
    assert _dtypes(jaxpr0, "dot_general", ffn) == {"float32"}

    want = {
        "model.param_dtype": ({"bfloat16"}, {"bfloat16"}, {"float32"}, {"float32"}, {"float32"}),
        "optimizer.state_dtype": ({"float32"}, {"bfloat16"}, {"float32"}, {"float32"}, {"float32"}),
        "model.dtype": ({"float32"}, {"float32"}, {"float32"}, {"float32"}, {"bfloat16"}),
        "model.softmax_dtype": ({"float32"}, {"float32"}, {"bfloat16"}, {"float32"}, {"float32"}),
        "model.logits_dtype": ({"float32"}, {"float32"}, {"float32"}, {"bfloat16"}, {"float32"}),
    }[key]
    got = (
        {str(x.dtype) for x in params},
        {str(x.dtype) for x in moments},
        _dtypes(jaxpr, "exp", attention_softmax),
        _dtypes(jaxpr, "exp", logits),
        _dtypes(jaxpr, "dot_general", ffn),
    )
    assert got == want, (key, got)
    # param_dtype's moments follow the parameters (optax keeps them in the parameters' dtype) unless state_dtype
    # says otherwise; the abstract state (Orbax restore target) agrees with the compiled step's
    assert {str(x.dtype) for x in _floating_leaves(program.abstract_state())} == got[0] | got[1]


def test_bfloat16_run_trains():
    """Everything bfloat16 (parameters, Adam moments, compute, attention softmax, logits): the training loss of
    tiny XLNet on its real pipeline falls over 30 steps."""
    from xlgen.train.loop import global_batch, make_pipeline

    over = {
        "model.param_dtype": "bfloat16",
        "optimizer.state_dtype": "bfloat16",
        "model.dtype": "bfloat16",
        "model.softmax_dtype": "bfloat16",
        "model.logits_dtype": "bfloat16",
        "optimizer.learning_rate": 3e-3,
        "optimizer.warmup_steps": 5,
    }
    program, mesh = _program("xlnet_tiny.py", over)
    pipe = make_pipeline(program.config, "train")
    spec = program.objective.batch_shapes(program.config, "train")
    losses = []
    with jax.set_mesh(mesh):
        state, mems = program.init_state()
        step = program.train_step.lower(*program.abstract_args()).compile(compiler_options=_CPU_FAST)
        for s in range(30):
            state, mems, metrics = step(state, global_batch(pipe.batch(s), program.batch_shardings, spec), mems)
            losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and float(metrics["nonfinite"]) == 0
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
