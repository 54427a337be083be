"""Pod operations (issue 51): goodput accounting, the hang watchdog, supervised restarts.

* The goodput ledger's arithmetic on hand-made ledgers (in-process): a resume moves the productive seconds after the
  restored checkpoint's save to `lost_to_restarts`, the gap to the restart to `idle`; the categories sum to the wall.
* A preemption storm, as an operator would cause it: one `xlgen train --max_restarts` run of a tiny config whose
  training child is SIGKILLed six times at random moments (half of them while a checkpoint is being written) plus
  one injected hang (the data for a step never arrives: the watchdog exits 3). The run reaches total_steps on its
  own, its final parameters equal an uninterrupted run's bit for bit, and the goodput ledger's lost steps are the
  steps recomputed (each failed attempt's last logged step minus the checkpoint the next one resumed from), its time
  categories sum to the measured wall time.
* Two processes, one killed mid-run: the other exits with status 3 within the watchdog bound, its last line the
  reason.
"""

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from kill_helpers import sigkill_after_step
from test_train_utils import REPO, compile_cache, run_train, train_cmd, train_losses, xlgen_env  # noqa: F401

from xlgen.train import goodput

# ------------------------------------------------------------------------------------------------ the ledger


def _previous(**kw):
    base = {
        "time_s": {**goodput.zero(), "productive": 10.0, "compile": 5.0, "checkpoint": 1.0},
        "attempt_time_s": {**goodput.zero(), "productive": 10.0, "compile": 5.0, "checkpoint": 1.0},
        "attempt": 1,
        "attempt_start_step": 0,
        "step": 20,
        "accounted_until": 1000.0,
        "lost_steps": 0,
        "saves": {"10": 4.0, "16": 7.0},
        "end": None,
    }
    base.update(kw)
    return base


def test_ledger_resume_moves_recomputed_time_and_counts_the_gap():
    g = goodput.Ledger(t_begin=1012.5)
    g.resume(_previous(), restored_step=16, logged_step=20)
    t = g.carried
    assert t["lost_to_restarts"] == pytest.approx(3.0)  # productive 10 at step 20, 7 at the save of 16
    assert t["productive"] == pytest.approx(7.0)
    assert t["idle"] == pytest.approx(12.5)  # from the last accounted moment to this start
    assert sum(t.values()) == pytest.approx(16.0 + 12.5)  # nothing created or dropped
    assert (g.attempt, g.lost_steps, g.step) == (2, 4, 16)
    rec = g.previous_record
    assert rec["kind"] == "goodput" and rec["attempt"] == 1 and rec["end"] == "failed" and rec["lost_steps"] == 4
    assert rec["time_s"]["lost_to_restarts"] == pytest.approx(3.0) and rec["step"] == 16

    # the last logged step is one past the ledger's (killed between the two writes): one more step at the mean
    g = goodput.Ledger(t_begin=1012.5)
    g.resume(_previous(), restored_step=16, logged_step=21)
    assert g.lost_steps == 5 and g.carried["lost_to_restarts"] == pytest.approx(3.0 + 10.0 / 20)

    # a checkpoint the ledger does not remember (older): the steps at the attempt's mean step time
    g = goodput.Ledger(t_begin=1012.5)
    g.resume(_previous(), restored_step=4, logged_step=20)
    assert g.lost_steps == 16 and g.carried["lost_to_restarts"] == pytest.approx(16 * 10.0 / 20)

    # a clean end (completed, then extended later): no idle, nothing lost, no record for it
    g = goodput.Ledger(t_begin=5000.0)
    g.resume(_previous(end="completed", step=20), restored_step=20, logged_step=20)
    assert g.carried["idle"] == 0 and g.carried["lost_to_restarts"] == 0 and g.previous_record is None


def test_ledger_attempt_categories_sum_to_the_wall():
    t0 = time.time()
    g = goodput.Ledger(t_begin=t0 - 0.2)  # 0.2 s of start-up before the ledger existed: compilation
    with g.timed("checkpoint"):
        time.sleep(0.05)
    g.step_done(1)  # the first step: compile
    for s in range(2, 5):
        for _ in g.iterate([None], "data"):
            pass
        time.sleep(0.02)
        g.step_done(s)
    with g.timed("eval"):
        time.sleep(0.03)
    g.saved(4)
    own = g.attempt_time()
    wall = time.time() - (t0 - 0.2)
    assert sum(own.values()) == pytest.approx(wall, abs=0.01)
    assert own["compile"] >= 0.2 and own["checkpoint"] >= 0.05 and own["eval"] >= 0.03
    assert 0.06 <= own["productive"] < 0.2
    assert len(g.gaps) == 3 and g.started
    snap = g.snapshot()
    assert snap["step"] == 4 and snap["saves"] == {"4": pytest.approx(own["productive"])}


def test_plot_draws_where_the_wall_time_went(tmp_path):
    """`xlgen plot`'s goodput panel: one stacked bar per attempt (its seconds per category), the run's goodput over
    all attempts in the title; the goodput records are not drawn as evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xlgen.analyze import plot

    first = {**goodput.zero(), "productive": 2.0, "compile": 1.0, "lost_to_restarts": 1.0}
    second = {**goodput.zero(), "productive": 4.0, "compile": 1.0, "idle": 1.0}
    recs = [
        {"step": 1, "loss": 4.0, "learning_rate": 1e-3, "tokens_per_sec": 10.0},
        goodput.record(2, 1, "failed", first, 3),
        {"step": 2, "split": "valid", "loss": 3.5},
        goodput.record(4, 2, "completed", second, None),
    ]
    fig, ax = plt.subplots()
    plot._goodput_panel(ax, {"w": recs}, {"w": "run"})
    assert ax.get_title() == "goodput: run 60.0%"  # (2 + 4) / (4 + 6)
    per_attempt = {}
    for bar in ax.patches:
        per_attempt[round(bar.get_x() + bar.get_width() / 2)] = (
            per_attempt.get(round(bar.get_x() + bar.get_width() / 2), 0) + bar.get_height()
        )
    assert per_attempt == {1: 4.0, 2: 6.0}
    plt.close(fig)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = plot.plot([str(tmp_path)])
    assert os.path.getsize(out) > 1000


# ------------------------------------------------------------------------------------------------ the storm

# The uninterrupted run the storm and the local-tier test compare with, bit for bit. The checkpoint settings (how
# often, which tier) change what is saved, not the training: one run serves both.
TOTAL = 48
REFERENCE = {"total_steps": TOTAL, "checkpoint.every_steps": TOTAL, "mesh.data": 1}

STORM = {
    "total_steps": TOTAL,  # a killed attempt gets 1-4 steps (+ 2 waiting for a save) past its checkpoint: 6 x 7 + 3
    "checkpoint.every_steps": 2,
    "checkpoint.keep": 3,
    "mesh.data": 1,
    "watchdog.min_timeout_s": 4,
    "watchdog.factor": 10,
}
KILLS = 6  # every other one while a checkpoint is being written
HANG_ATTEMPT = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compile_cache):  # noqa: F811
    ref = str(tmp_path_factory.mktemp("reference") / "ref")
    run_train(ref, compile_cache, overrides=REFERENCE, devices=1)
    return ref


SITECUSTOMIZE = """
import os
if os.environ.get("XLGEN_ATTEMPT") == os.environ.get("XLGEN_TEST_HANG_ATTEMPT"):
    import threading
    import xlgen.train.loop as loop

    _batches = loop._train_batches

    def _hanging(pipeline, start, end, depth):  # the 4th batch of this attempt never arrives
        for i, item in enumerate(_batches(pipeline, start, end, depth)):
            if i == 3:
                threading.Event().wait()
            yield item

    loop._train_batches = _hanging
"""


def _final_state(workdir, step):
    """The saved train state of `step` as NumPy arrays (whatever devices or processes wrote it)."""
    import jax
    import orbax.checkpoint as ocp

    path = os.path.join(workdir, "checkpoints", str(step), "state")
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(path)
    tree = getattr(meta, "item_metadata", None) or getattr(meta, "tree", None) or meta
    state = ckptr.restore(path, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree))
    return {k: np.asarray(v) for k, v in state["params"].items()}, state


def _pump(stream, q):
    for line in iter(stream.readline, ""):
        q.put((time.monotonic(), line))
    q.put((time.monotonic(), None))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_preemption_storm_reaches_the_end_bitwise(tmp_path, compile_cache, reference):  # noqa: F811
    ref = reference

    wd = str(tmp_path / "storm")
    ck = os.path.join(wd, "checkpoints")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = xlgen_env(compile_cache, devices=1)
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    env["XLGEN_TEST_HANG_ATTEMPT"] = str(HANG_ATTEMPT)
    cmd = train_cmd(wd, "txl_tiny.py", STORM, extra=["--max_restarts=20", "--restart_backoff=0"])
    rng = random.Random(51)
    t_start = time.monotonic()
    sup = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue" = queue.Queue()
    threading.Thread(target=_pump, args=(sup.stdout, lines), daemon=True).start()

    out = []  # every line, in order
    attempts = []  # {"pid", "start" (restored step), "last_printed", "killed", "during_save", "logged"}
    kills = 0
    deadline = time.monotonic() + 900
    plan = None
    while time.monotonic() < deadline:
        try:
            _, line = lines.get(timeout=0.01)
        except queue.Empty:
            line = ""
        if line is None:
            break
        if line:
            out.append(line)
            m = re.match(r"supervisor: attempt (\d+) \(pid (\d+)\)", line)
            if m:
                attempts.append({"pid": int(m[2]), "start": 0, "last_printed": 0, "killed": False})
                n = int(m[1])
                assert n == len(attempts)
                kill_now = n != HANG_ATTEMPT and kills < KILLS
                plan = (rng.randint(1, 4), kills % 2 == 0, rng.uniform(0, 0.05)) if kill_now else None
            m = re.match(rf"resumed from {re.escape(ck)}/(\d+)", line)
            if m:
                attempts[-1]["start"] = int(m[1])
            m = re.match(r"step (\d+)/\d+ ", line)
            if m:
                attempts[-1]["last_printed"] = int(m[1])
        a = attempts[-1] if attempts else None
        if plan is None or a is None or a["killed"]:
            continue
        after, in_save, delay = plan
        if a["last_printed"] < a["start"] + after:
            continue
        if in_save and not any(".orbax-checkpoint-tmp" in d for d in os.listdir(ck)):
            continue
        time.sleep(delay)
        a["during_save"] = any(".orbax-checkpoint-tmp" in d for d in os.listdir(ck))
        if in_save and not a["during_save"]:
            continue  # the save ended during the delay: the next one
        os.kill(a["pid"], signal.SIGKILL)
        a["killed"] = True
        kills += 1
        while _alive(a["pid"]):
            time.sleep(0.005)
        a["logged"] = goodput.last_train_step(os.path.join(wd, "metrics.jsonl"))  # before the next attempt's resume
        plan = None
    sup.wait(timeout=60)
    wall = time.monotonic() - t_start
    text = "".join(out)
    assert sup.returncode == 0, text[-6000:]

    # six kills, three while a checkpoint was being written, one hang, then the end
    assert kills == KILLS and len(attempts) >= KILLS + 2, text[-4000:]
    assert sum(a.get("during_save", False) for a in attempts if a["killed"]) >= KILLS // 2
    assert f"supervisor: attempt {HANG_ATTEMPT} hung (watchdog, status 3)" in text, text[-6000:]
    assert "xlgen train: hung: no training step completed within" in text
    marker = json.load(open(os.path.join(wd, "hang-process0.json")))
    assert marker["phase"] == "training step" and marker["bound_s"] >= 4
    hang = attempts[HANG_ATTEMPT - 1]
    hang["logged"] = None  # the ledger's own step (written by the watchdog at the hang)

    # the final parameters are the uninterrupted run's, bit for bit
    a_params, _ = _final_state(ref, STORM["total_steps"])
    b_params, b_state = _final_state(wd, STORM["total_steps"])
    assert sorted(a_params) == sorted(b_params)
    for k in a_params:
        assert a_params[k].tobytes() == b_params[k].tobytes(), k
    assert int(b_state["step"]) == STORM["total_steps"]
    losses = train_losses(wd)
    assert sorted(losses) == list(range(1, STORM["total_steps"] + 1))
    assert losses == train_losses(ref)

    # goodput: recomputed steps = sum over failures of (last logged step - the next attempt's checkpoint)
    summary = json.load(open(os.path.join(wd, "summary.json")))
    recs = [r for r in map(json.loads, open(os.path.join(wd, "metrics.jsonl"))) if r.get("kind") == "goodput"]
    failed = {r["attempt"]: r for r in recs if r["end"] == "failed"}
    assert summary["attempts"] == len(attempts) and sorted(failed) == list(range(1, len(attempts)))
    expected = 0
    for k, a in enumerate(attempts[:-1], 1):
        nxt = attempts[k]["start"]
        if a.get("logged") is not None:
            assert failed[k]["lost_steps"] == max(a["logged"] - nxt, 0), (k, a, nxt, failed[k])
        assert failed[k]["lost_steps"] >= max(a["last_printed"] - nxt, 0)
        assert (failed[k]["time_s"]["lost_to_restarts"] > 0) == (failed[k]["lost_steps"] > 0)
        expected += failed[k]["lost_steps"]
    assert summary["lost_steps"] == expected > 0
    t = summary["time_s"]
    assert set(t) == set(goodput.CATEGORIES)
    assert t["lost_to_restarts"] > 0 and t["idle"] > 0 and t["compile"] > 0 and t["productive"] > 0
    assert wall - 30 < sum(t.values()) <= wall + 0.5  # less the first attempt's imports
    assert summary["goodput"] == pytest.approx(t["productive"] / sum(t.values()), abs=1e-3)
    # the recomputed steps cost about what kept steps cost (the same program): within a factor 4 per step
    per_kept = t["productive"] / STORM["total_steps"]
    per_lost = t["lost_to_restarts"] / summary["lost_steps"]
    assert per_kept / 4 < per_lost < per_kept * 4, (per_kept, per_lost)
    assert re.search(r"^goodput \d+\.\d%: productive ", text, re.M)
    print("storm:", json.dumps({k: summary[k] for k in ("goodput", "time_s", "attempts", "lost_steps")}))


# ------------------------------------------------------------------------------------------------ peers


def test_a_process_whose_peer_died_exits_within_the_bound(tmp_path, compile_cache):  # noqa: F811
    """Two processes (jax.distributed over localhost); process 1 is SIGKILLed after a few steps. Process 0 waits in
    the next collective (its watchdog ends it) or sees the collective fail: either way it exits with status 3 within
    the bound, every thread's stack printed, the last line of stderr the reason."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    wd = str(tmp_path / "wd")
    bound = 8
    over = {"total_steps": 100000, "checkpoint.every_steps": 0, "mesh.data": 2, "watchdog.timeout_s": bound}
    procs = []
    for i in range(2):
        env = xlgen_env(compile_cache, devices=1)
        env.update(XLGEN_COORDINATOR=f"127.0.0.1:{port}", XLGEN_NUM_PROCESSES="2", XLGEN_PROCESS_ID=str(i))
        procs.append(
            subprocess.Popen(
                train_cmd(wd, "txl_tiny.py", over, extra=["--distributed=on"]),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    lines: "queue.Queue" = queue.Queue()
    threading.Thread(target=_pump, args=(procs[0].stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        _, line = lines.get(timeout=600)
        assert line is not None, procs[0].communicate()[1][-4000:]
        if re.match(r"step 5/", line):
            break
    procs[1].kill()
    t_kill = time.monotonic()
    err = procs[0].stderr.read()
    procs[0].wait(timeout=120)
    took = time.monotonic() - t_kill
    procs[1].wait(timeout=60)
    assert procs[0].returncode == 3, err[-4000:]
    assert took < bound + 10, took  # the bound, plus the watchdog's poll and the stack dump
    last = err.strip().splitlines()[-1]
    # waiting in a collective (the watchdog), or the collective failing (gloo saw the peer's socket close)
    hung = rf"xlgen train: hung: no training step completed within {bound}s \(waited \d+s; process 0, last completed "
    hung += r"step \d+\); exiting with status 3"
    orphaned = (
        r"xlgen train: orphaned: a collective failed in process 0 \(a peer process died\?\): .+; exiting with status 3"
    )
    assert re.fullmatch(hung, last) or re.fullmatch(orphaned, last), last
    assert "(most recent call first)" in err  # every thread's stack (faulthandler)
    marker = json.load(open(os.path.join(wd, "hang-process0.json")))
    assert marker["process"] == 0 and marker["reason"] in last


# ------------------------------------------------------------------------------------------------ the local tier

TIERS = {"total_steps": TOTAL, "checkpoint.every_steps": 20, "checkpoint.local_every_steps": 1, "checkpoint.keep": 3}


def _run_until(wd, cache, over, step):
    """Start `xlgen train` and SIGKILL it once metrics.jsonl holds step >= `step`; returns (stdout, stderr)."""
    env = xlgen_env(cache, devices=1)
    return sigkill_after_step(
        train_cmd(wd, "txl_tiny.py", over), wd, step, env=env, cwd=REPO, timeout=600, poll=0.005, capture=True
    )


def _steps(d):
    return sorted(int(x) for x in os.listdir(d) if x.isdigit()) if os.path.isdir(d) else []


def test_local_tier_restores_newest_verified_and_falls_back_to_the_workdir(tmp_path, compile_cache, reference):  # noqa: F811
    """Killed before the first workdir save: the next run resumes from the local tier, skipping (and moving aside)
    its newest checkpoint, corrupted by a flipped byte; killed again after the workdir's save of step 20 with the
    local tier then deleted (a new machine): the run resumes from the workdir. The end equals an uninterrupted run
    bit for bit."""
    from test_fault_injection import flip_byte, largest_data_file

    ref = reference
    wd, local = str(tmp_path / "wd"), str(tmp_path / "local")
    over = {**TIERS, "mesh.data": 1, "checkpoint.local_dir": local}

    _run_until(wd, compile_cache, over, 8)
    assert _steps(os.path.join(wd, "checkpoints")) == []  # nothing in the workdir yet
    newest = _steps(local)
    assert len(newest) == 3, newest
    flip_byte(largest_data_file(os.path.join(local, str(newest[-1]), "state")))

    out, err = _run_until(wd, compile_cache, over, 26)
    assert f"checkpoint {local}/{newest[-1]} failed verification" in err and f"{local}/corrupt-{newest[-1]}" in err
    assert f"resumed from {local}/{newest[-2]}\n" in out or f"resumed from {local}/{newest[-2]} " in out, out[-2000:]
    assert 20 in _steps(os.path.join(wd, "checkpoints")) and max(_steps(local)) > 20

    import shutil

    shutil.rmtree(local)
    p = run_train(wd, compile_cache, overrides=over, devices=1)
    assert f"resumed from {wd}/checkpoints/20" in p.stdout, p.stdout[-2000:]
    a, _ = _final_state(ref, TOTAL)
    b, _ = _final_state(wd, TOTAL)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a) and sorted(a) == sorted(b)
    assert train_losses(wd) == train_losses(ref)


# ------------------------------------------------------------------------------------------------ multislice


def test_one_mesh_builder_for_train_and_plan_cpu_slices():
    """8 CPU devices as 2 slices: `data` = 2 (DCN) x 4 (ICI), each slice's devices one contiguous block of the data
    axis; the plan's builder is the trainer's; a data axis that does not split over the slices is a one-line error."""
    import jax

    from xlgen import sharding
    from xlgen.config import load_config
    from xlgen.plan import build_mesh

    config = load_config(f"{REPO}/configs/pretrain/txl_tiny.py", {"mesh.num_slices": "2"})
    devices = jax.devices()
    run_mesh = sharding.make_mesh(config.mesh, devices)
    plan_mesh = build_mesh(config, devices, 2)
    assert dict(run_mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert (run_mesh.devices == plan_mesh.devices).all() and run_mesh.axis_types == plan_mesh.axis_types
    assert [d.id for d in run_mesh.devices.flat] == sorted(d.id for d in devices)
    config = load_config(f"{REPO}/configs/pretrain/txl_tiny.py", {"mesh.num_slices": "2", "mesh.fsdp": "2"})
    mesh = sharding.make_mesh(config.mesh, devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
    assert [sorted(d.id for d in mesh.devices[i].flat) for i in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match=r"mesh.data=4 must be a multiple of num_slices=3"):
        sharding.make_mesh({**config.mesh.to_dict(), "num_slices": 3, "num_devices": 0}, devices[:8])


MESH_RUNNER = """
import sys
from xlgen import sharding
from xlgen.plan import topology as topo
from xlgen.config import load_config
from xlgen.plan import build_mesh

config = load_config(sys.argv[1], {"mesh.fsdp": "2", "mesh.num_slices": "2"})
devices = topo.topology_devices("v3:2x2", 2)
plan_mesh, run_mesh = build_mesh(config, devices, 2), sharding.make_mesh(config.mesh, devices)
assert (plan_mesh.devices == run_mesh.devices).all() and plan_mesh.axis_names == run_mesh.axis_names
data = run_mesh.shape["data"]
rows = [sorted({d.slice_index for d in run_mesh.devices[i].flat}) for i in range(data)]
assert rows == [[0]] * (data // 2) + [[1]] * (data // 2), rows
print(dict(run_mesh.shape))
"""


def test_plan_and_train_build_the_same_multislice_mesh_on_tpu_devices():
    """Compile-only TPU devices of 2 v3:2x2 slices: the plan's mesh is the run's, `data` spans the slices (the
    first half of the data axis on slice 0)."""
    from test_train_utils import run_plans_subprocess

    run_plans_subprocess(MESH_RUNNER, f"{REPO}/configs/pretrain/txl_tiny.py", timeout=600)


def test_two_slices_on_two_processes_equal_one_process(tmp_path, compile_cache):  # noqa: F811
    """`mesh.num_slices=2` on two CPU processes (one per slice, 2 devices each, data = 2 x 2) trains like one
    process with 4 devices: the same losses and final parameters."""
    over = {"total_steps": 4, "checkpoint.every_steps": 4, "mesh.data": 4}
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    run_train(single, compile_cache, overrides=over, devices=4)
    env = xlgen_env(compile_cache, devices=2)
    env.update(
        {
            "DEVICES_PER_PROCESS": "2",
            "XLGEN_XLA_FLAGS": "--xla_backend_optimization_level=0",
            "XLGEN_LOG_DIR": str(tmp_path / "logs"),
            "XLGEN_PYTHON": sys.executable,
        }
    )
    cmd = ["bash", os.path.join(REPO, "launch/local_multiprocess.sh"), "2"]
    cmd += train_cmd(multi, "txl_tiny.py", {**over, "mesh.num_slices": 2})[3:]
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    logs = "".join(
        open(os.path.join(tmp_path, "logs", f)).read()[-2000:] for f in sorted(os.listdir(tmp_path / "logs"))
    )
    assert p.returncode == 0, logs
    assert "mesh data=4 fsdp=1 tensor=1" in p.stdout and "data over 2 slices" in p.stdout, p.stdout[-2000:]
    a, b = train_losses(single), train_losses(multi)
    assert sorted(b) == [1, 2, 3, 4]
    np.testing.assert_allclose([b[s] for s in range(1, 5)], [a[s] for s in range(1, 5)], rtol=1e-6, atol=0)
    pa, _ = _final_state(single, 4)
    pb, _ = _final_state(multi, 4)
    for k in pa:
        np.testing.assert_allclose(pb[k], pa[k], rtol=1e-5, atol=1e-7, err_msg=k)
