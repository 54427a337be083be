"""Multi-player training programs: several networks ("players"), each with its own parameters, batch-norm
statistics, optax optimizer and loss, updated in a fixed order inside one jitted, donated step.

    game = Game(players=(Player("disc", make_d, tx_d, sched_d), Player("gen", make_g, tx_g, sched_g)),
                order=(("disc", d_loss), ("gen", g_loss)), batch_shapes={...}, examples_per_step=B)
    objective = game_objective("cegan", lambda config: game, Pipeline, evaluate)   # the system's Objective
    program = build_program(config, mesh)            # -> objective.build_program: build_game_program(...)
    state, _ = program.init_state()
    state, _, metrics = program.train_step(state, batch, None)       # loop.run drives it like any TrainProgram

The state is a plain pytree (what Orbax saves through xlgen/train/checkpointing.py):
    {"params":    {player: {dotted.name: array}},
     "stats":     {player: {dotted.name: array}},   batch-norm running means / variances (nnx.BatchStat)
     "opt_state": {player: optax state},
     "step": int32, "rng": uint32[2]}

One step, for each (player, loss) of `game.order` in turn (a player may appear more than once, e.g. two generator
updates per discriminator update):
    models = every player's module, merged from the *current* params and stats (earlier updates of this step are
             visible to later ones: the alternating updates of the papers, in one step)
    (loss, aux), grads = value_and_grad(loss_fn)(this player's params)    loss_fn(models, batch, key, step, ctx)
    the player's optax update, applied only if aux["gate"] (when the loss returns one) is true -- the papers'
    conditional alternation, e.g. CEGAN's code updating the discriminator only while its cost gap is above a bound;
    every player's batch statistics from the forward passes of loss_fn
`ctx` holds the aux of the updates already made in this step ({player: aux}), so a later loss can read an earlier
one's statistics (e.g. the generator's gate on the discriminator's gap) without recomputing them.
Only the updated player's parameters are differentiated: the other players' outputs enter as constants, and a
loss that feeds one player's output into another's network for a third purpose wraps it in `jax.lax.stop_gradient`
itself. The step key is `fold_in(rng, step)`, then `fold_in(key, update index)` per update, so a resumed run draws
the same noise. A non-finite loss or gradient in any update skips the whole step (nothing changes; the step is
consumed), as the single-player program does.

Metrics: `loss` (the first update's loss), `<player>_loss` (the last update of each player), `<player>/<aux>`,
`learning_rate` (the first player's) and `<player>_learning_rate`, `grad_norm` / `<player>_grad_norm`.

The program is a `xlgen.train.program.TrainProgram` (the loop's contract) built from the same pieces as the
one-model program: parameter shardings from the modules' logical axes (`xlgen.sharding`), batches sharded over the
data axes, state created directly sharded by a jitted init, the step jitted with in/out shardings and the state
donated; no recurrent memory.

A system's registry entry holds a game as an `Objective` (`game_objective(name, make_game, pipeline, evaluate)`,
no loss): `xlgen train` builds this program through `Objective.build_program`, `Objective.evaluate` is its
evaluation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from xlgen import sharding
from xlgen.models.family import Objective
from xlgen.models.params import concrete_rest, path_name
from xlgen.train.program import TrainProgram

# loss_fn(models, batch, key, step, ctx) -> (loss, aux); ctx = {player: aux of its latest update in this step}
LossFn = Callable[..., Tuple[jax.Array, Dict]]


@dataclasses.dataclass(frozen=True)
class Player:
    """One network of a game: `make(rngs) -> nnx.Module`, its optimizer and learning-rate schedule (for logging)."""

    name: str
    make: Callable[[nnx.Rngs], nnx.Module]
    tx: optax.GradientTransformation
    schedule: Callable[[Any], Any] = lambda step: 0.0


@dataclasses.dataclass(frozen=True)
class Game:
    players: Sequence[Player]
    order: Sequence[Tuple[str, LossFn]]
    batch_shapes: Dict[str, Tuple[Tuple[int, ...], Any]]  # train batch {key: (global shape, dtype)}
    examples_per_step: int


class Players(nnx.Module):
    """Every player's module under its name: a game objective's `make_model` (parameter shapes for workdir checks)."""

    def __init__(self, game: Game, rngs: nnx.Rngs):
        for p in game.players:
            setattr(self, p.name, p.make(rngs))


def constant_learning_rates(config, total_steps: int) -> Dict[str, Callable[[Any], float]]:
    """{player: constant schedule} of `config.players.<name>.learning_rate`: `Reporting.learning_rates` of a game
    whose players train at constant rates (GDAN, InitialGAN)."""
    return {name: optax.constant_schedule(float(p.learning_rate)) for name, p in config.players.items()}


# a game's config: the players' own optimizers (config.players) replace config.optimizer; no language-model objective
GAME_UNUSED_KEYS = ("optimizer", "objective_options")


def game_objective(name: str, make_game: Callable[[Any], Game], pipeline, evaluate=None) -> Objective:
    """The `Objective` of a game: `make_game(config) -> Game`, the data `pipeline` (as `Objective.pipeline`) and the
    system's `evaluate(config, program, state, out_dir, full)`."""
    return Objective(
        name=name,
        make_model=lambda config, rngs, train: Players(make_game(config), rngs),
        batch_shapes=lambda config, split: make_game(config).batch_shapes,
        pipeline=pipeline,
        tokens_per_step=lambda config: make_game(config).examples_per_step,
        eval_metrics=lambda loss, config: {},
        build_program=lambda config, mesh, objective: build_game_program(config, mesh, make_game(config), objective),
        evaluate=evaluate,
    )


class _Layout:
    """Between one player's module and flat {name: array} dicts of its parameters and batch statistics."""

    def __init__(self, make: Callable[[nnx.Rngs], nnx.Module]):
        abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        self.graphdefs = {}
        for mode in ("train", "eval"):
            getattr(abstract, mode)()
            gd, params, stats, rest = nnx.split(abstract, nnx.Param, nnx.BatchStat, ...)
            self.graphdefs[mode] = gd
        self.params = [(p, v) for p, v in nnx.to_flat_state(params)]
        self.stats = [(p, v) for p, v in nnx.to_flat_state(stats)]
        self.rest = rest
        self.logical = {
            path_name(p): tuple(v.get_metadata().get("out_sharding") or (None,) * len(v.shape)) for p, v in self.params
        }
        self.shapes = {path_name(p): tuple(v.shape) for p, v in self.params}
        self.abstract_params = {path_name(p): jax.ShapeDtypeStruct(v.shape, v.dtype) for p, v in self.params}
        self.abstract_stats = {path_name(p): jax.ShapeDtypeStruct(v.shape, v.dtype) for p, v in self.stats}

    @staticmethod
    def flat(module: nnx.Module, kind) -> Dict[str, jax.Array]:
        return {path_name(p): v.get_value() for p, v in nnx.to_flat_state(nnx.state(module, kind))}

    def merge(self, params: Dict[str, jax.Array], stats: Dict[str, jax.Array], train: bool = True) -> nnx.Module:
        ps = nnx.from_flat_state([(p, v.replace(params[path_name(p)])) for p, v in self.params])
        ss = nnx.from_flat_state([(p, v.replace(stats[path_name(p)])) for p, v in self.stats])
        return nnx.merge(self.graphdefs["train" if train else "eval"], ps, ss, concrete_rest(self.rest))


@dataclasses.dataclass(kw_only=True)
class GameProgram(TrainProgram):
    """A game's program: `params_of(state)` is {player: {name: array}}; `modules(state)` every player's module."""

    layouts: Dict[str, _Layout]

    def modules(self, state, train: bool = False) -> Dict[str, nnx.Module]:
        """Every player's module from a state (eval mode: batch norm uses the running statistics)."""
        return {n: lay.merge(state["params"][n], state["stats"][n], train) for n, lay in self.layouts.items()}


def build_game_program(config, mesh: Mesh, game: Game, objective: Objective) -> GameProgram:
    players = {p.name: p for p in game.players}
    for pname, _ in game.order:
        if pname not in players:
            raise ValueError(f"game order names player {pname!r}; players are {sorted(players)}")
    layouts = {n: _Layout(p.make) for n, p in players.items()}
    rules = sharding.rules_for(config.mesh.rules)
    rep = sharding.replicated(mesh)
    p_sh, s_sh, o_sh, abstract_opt = {}, {}, {}, {}
    for n, lay in layouts.items():
        p_sh[n] = {
            k: NamedSharding(mesh, sharding.logical_to_spec(lay.logical[k], lay.shapes[k], rules, mesh))
            for k in lay.shapes
        }
        s_sh[n] = {k: rep for k in lay.abstract_stats}
        abstract_opt[n] = jax.eval_shape(players[n].tx.init, lay.abstract_params)
        o_sh[n] = sharding.opt_state_shardings(abstract_opt[n], p_sh[n], lay.shapes, mesh)
    state_shardings = {"params": p_sh, "stats": s_sh, "opt_state": o_sh, "step": rep, "rng": rep}
    batch_shardings = {k: sharding.batch_sharding(mesh, len(s)) for k, (s, _) in game.batch_shapes.items()}
    dp = sharding.data_parallel_size(mesh)
    for k, (s, _) in game.batch_shapes.items():
        if s[0] % dp:
            raise ValueError(f"batch {k!r} has {s[0]} rows, not divisible by the data-parallel mesh size {dp}")
    seed = int(config.seed)

    def init_fn():
        params, stats, opt = {}, {}, {}
        for i, (n, p) in enumerate(players.items()):
            m = p.make(nnx.Rngs(params=seed * 1000 + i))
            params[n] = _Layout.flat(m, nnx.Param)
            stats[n] = _Layout.flat(m, nnx.BatchStat)
            opt[n] = p.tx.init(params[n])
        state = {
            "params": params,
            "stats": stats,
            "opt_state": opt,
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(jax.random.key(seed + 3)),
        }
        return state, None

    init_jit = jax.jit(init_fn, out_shardings=(state_shardings, None))

    def train_step(state, batch, mems):
        step = state["step"]
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), step)
        params, stats, opt = dict(state["params"]), dict(state["stats"]), dict(state["opt_state"])
        metrics, finite, ctx = {}, jnp.array(True), {}
        for i, (pname, loss_fn) in enumerate(game.order):
            k = jax.random.fold_in(key, i)

            def f(own, pname=pname, loss_fn=loss_fn, k=k, params=params, stats=stats, ctx=dict(ctx)):
                ps = {**params, pname: own}
                models = {n: lay.merge(ps[n], stats[n], True) for n, lay in layouts.items()}
                loss, aux = loss_fn(models, batch, k, step, ctx)
                new_stats = {n: _Layout.flat(m, nnx.BatchStat) for n, m in models.items()}
                return loss, (aux, new_stats)

            (loss, (aux, new_stats)), grads = jax.value_and_grad(f, has_aux=True)(params[pname])
            updates, new_opt = players[pname].tx.update(grads, opt[pname], params[pname])
            new_params = optax.apply_updates(params[pname], updates)
            aux = dict(aux)
            gate = aux.pop("gate", None)
            if gate is not None:  # a gated-off update leaves the player's parameters and optimizer state as they were
                keep = lambda new, old, gate=gate: jnp.where(gate, new, old)  # noqa: E731
                new_params = jax.tree.map(keep, new_params, params[pname])
                new_opt = jax.tree.map(keep, new_opt, opt[pname])
                aux["updated"] = jnp.asarray(gate, jnp.float32)
            params[pname], opt[pname], stats = new_params, new_opt, new_stats
            ctx[pname] = aux
            gn = optax.global_norm(grads)
            finite = finite & jnp.isfinite(loss) & jnp.isfinite(gn)
            if i == 0:
                metrics["loss"], metrics["grad_norm"] = loss, gn
            metrics[f"{pname}_loss"], metrics[f"{pname}_grad_norm"] = loss, gn
            metrics.update({f"{pname}/{a}": v for a, v in aux.items()})
        new = {"params": params, "stats": stats, "opt_state": opt}
        old = {k: state[k] for k in new}
        new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        new_state = {**new, "step": step + 1, "rng": state["rng"]}
        first = game.order[0][0]
        metrics["learning_rate"] = jnp.asarray(players[first].schedule(step), jnp.float32)
        for n, p in players.items():
            metrics[f"{n}_learning_rate"] = jnp.asarray(p.schedule(step), jnp.float32)
        metrics["nonfinite"] = jnp.logical_not(finite).astype(jnp.float32)
        return new_state, None, metrics

    step_jit = jax.jit(
        train_step,
        in_shardings=(state_shardings, batch_shardings, None),
        out_shardings=(state_shardings, None, rep),
        donate_argnums=(0,),
    )
    abstract = {
        "params": {n: lay.abstract_params for n, lay in layouts.items()},
        "stats": {n: lay.abstract_stats for n, lay in layouts.items()},
        "opt_state": abstract_opt,
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "rng": jax.ShapeDtypeStruct((2,), jnp.uint32),
    }
    abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, state_shardings
    )
    shapes = {f"{n}.{k}": s for n, lay in layouts.items() for k, s in lay.shapes.items()}
    return GameProgram(
        config=config,
        mesh=mesh,
        objective=objective,
        layouts=layouts,
        param_shapes=shapes,
        state_shardings=state_shardings,
        batch_shardings=batch_shardings,
        train_step=step_jit,
        init_state=lambda: init_jit(),
        tokens_per_step=int(game.examples_per_step),
        _abstract_state=abstract_state,
    )
