"""The plug-in promise, executed: a system defined entirely inside this test needs no edit anywhere in xlgen.

The test writes a package of its own (`toy_regression`: a linear model fit by least squares to y = x A + noise) into
a temporary directory, with the metadata an installed package has (`*.dist-info/entry_points.txt` declaring it
under the `xlgen.systems` entry-point group, as `pip install` of a package with
`entry_points={"xlgen.systems": [...]}` writes it), and a config file beside it. Then, through the real `xlgen`
commands in subprocesses whose only addition is that directory on PYTHONPATH:

* `xlgen train` runs it to the end (reference run);
* a second run killed by SIGKILL mid-run and started again resumes from its newest complete checkpoint and logs
  the reference losses bit for bit, and ends with the same final parameters and evaluation;
* `xlgen eval --workdir` (no --config: the workdir's config.json) evaluates it; `xlgen plot` draws its curves.

docs/architecture.md "Adding a system" is this recipe."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from kill_helpers import sigkill_after_step
from test_train_utils import REPO, train_losses, xlgen_env

SYSTEM = '''
"""toy_regression: y = x A + 0.1 eps, A and x drawn from data.seed; the model a linear map, the loss the MSE."""

import dataclasses

import flax.nnx as nnx
import jax.numpy as jnp
import numpy as np

from xlgen.models.family import Family, Objective


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    dim_in: int = 8
    dim_out: int = 4


class Linear(nnx.Module):
    def __init__(self, cfg: ToyConfig, *, rngs):
        w = nnx.initializers.normal(0.1)(rngs.params(), (cfg.dim_in, cfg.dim_out))
        self.w = nnx.Param(w, out_sharding=("embed", "mlp"), eager_sharding=False)  # logical axes, never mesh axes

    def __call__(self, x):
        return x @ self.w[...]


class Pipeline:
    """batch(step): a pure function of (data.seed, step, this process's rows)."""

    def __init__(self, data_config, split="train", process_index=0, process_count=1):
        self.seed, self.split = int(data_config.seed), split
        self.dim_in, self.dim_out = int(data_config.dim_in), int(data_config.dim_out)
        self.global_batch_size = int(data_config.batch_size if split == "train" else data_config.eval_batch_size)
        self.local_batch_size = self.global_batch_size // process_count
        self.rows = slice(process_index * self.local_batch_size, (process_index + 1) * self.local_batch_size)
        self.num_steps = None if split == "train" else 2
        self.a = np.random.default_rng(self.seed).normal(size=(self.dim_in, self.dim_out)).astype(np.float32)

    def batch(self, step):
        stream = 0 if self.split == "train" else 1
        rng = np.random.default_rng([self.seed, stream, step])
        x = rng.normal(size=(self.global_batch_size, self.dim_in)).astype(np.float32)
        y = x @ self.a + 0.1 * rng.normal(size=(self.global_batch_size, self.dim_out)).astype(np.float32)
        return {"x": x[self.rows], "y": y[self.rows]}


def make_model(config, rngs, train=True):
    return Linear(FAMILY.model_config(config.model), rngs=rngs)


def batch_shapes(config, split):
    b = int(config.data.batch_size if split == "train" else config.data.eval_batch_size)
    return {"x": ((b, int(config.data.dim_in)), np.float32), "y": ((b, int(config.data.dim_out)), np.float32)}


def loss(model, batch, mems, rng, config):
    err = jnp.mean((model(batch["x"]) - batch["y"]) ** 2)
    return err, {"mse": err}, None


def eval_loss(model, batch, mems, config):
    se = jnp.sum(jnp.mean((model(batch["x"]) - batch["y"]) ** 2, axis=-1))
    return se, jnp.asarray(batch["x"].shape[0], jnp.float32), None


FAMILY = Family(
    name="toy_regression",
    config_class=ToyConfig,
    default_objective="mse",
    models={"linear": Linear},
    objectives={
        "mse": Objective(
            name="mse",
            make_model=make_model,
            batch_shapes=batch_shapes,
            loss=loss,
            eval_loss=eval_loss,
            pipeline=Pipeline,
            eval_metrics=lambda mean, config: {"mse": mean},
        )
    },
)
'''

CONFIG = """
from xlgen.config import base_config


def get_config():
    c = base_config()
    c.model.update(dict(family="toy_regression", dim_in=8, dim_out=4))
    c.data.update(dict(seed=3, dim_in=8, dim_out=4, batch_size=16, eval_batch_size=32))
    c.optimizer.update(dict(name="adamw", learning_rate=3e-2, schedule="constant", clip_norm=0.0))
    c.checkpoint.update(dict(every_steps=10, keep=3))
    c.eval.update(dict(split="valid", steps=-1, metric="mse"))
    c.mesh.num_devices = 1
    c.total_steps = 60
    c.log_every_steps = 1
    c.eval_every_steps = -1
    c.tensorboard = False
    return c
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """(a directory holding the toy package and its installed metadata, the config file, an environment)."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "toy_regression"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "system.py").write_text(textwrap.dedent(SYSTEM))
    info = root / "toy_regression-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-regression\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[xlgen.systems]\ntoy_regression = toy_regression.system:FAMILY\n")
    config = root / "toy.py"
    config.write_text(textwrap.dedent(CONFIG))
    env = xlgen_env(str(tmp_path_factory.mktemp("cache")), devices=1)
    env["PYTHONPATH"] = str(root) + os.pathsep + env["PYTHONPATH"]
    return root, str(config), env


def _xlgen(env, *args, expect=0):
    p = subprocess.run(
        [sys.executable, "-m", "xlgen.cli", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == expect, (
        f"xlgen {' '.join(args)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    )
    return p


def _final_eval(workdir):
    """The last evaluation record of a run's metrics.jsonl."""
    recs = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
    evals = [r for r in recs if "split" in r and "kind" not in r]  # not the per-attempt goodput records
    return evals[-1]


def test_a_system_defined_outside_xlgen_trains_resumes_bitwise_evaluates_and_plots(plugin, tmp_path):
    root, config, env = plugin
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    _xlgen(env, "train", f"--config={config}", f"--workdir={full}")
    a = train_losses(full)
    assert sorted(a) == list(range(1, 61)) and a[60] < 0.5 * a[1]  # it learns: the MSE falls

    cmd = [sys.executable, "-m", "xlgen.cli", "train", f"--config={config}", f"--workdir={killed}"]
    sigkill_after_step(cmd, killed, 25, env=env, cwd=REPO, poll=0.02)
    out = _xlgen(env, "train", f"--workdir={killed}").stdout  # resumed from the workdir alone
    resumed = int(out.split(f"{killed}/checkpoints/")[1].split()[0])
    assert resumed % 10 == 0 and 10 <= resumed < 60
    b = train_losses(killed)
    assert sorted(b) == list(range(1, 61))
    assert [b[s] for s in range(resumed + 1, 61)] == [a[s] for s in range(resumed + 1, 61)]  # bitwise
    fa, fb = _final_eval(full), _final_eval(killed)
    assert fa["step"] == fb["step"] == 60 and fa["mse"] == fb["mse"]  # the final parameters evaluate identically

    p = _xlgen(env, "eval", f"--workdir={killed}")
    assert p.stdout.startswith("eval: step 60 "), p.stdout
    rec = [json.loads(line) for line in open(os.path.join(killed, "metrics.jsonl"))][-1]
    assert rec["source"] == "xlgen eval" and rec["mse"] == fa["mse"]
    png = os.path.join(killed, "plots", "training.png")
    assert png in _xlgen(env, "plot", f"--workdir={killed}").stdout
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
