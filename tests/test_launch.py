"""Launchers: valid bash, shellcheck-clean, and `--dry-run` prints exactly the commands a real launch runs."""

import os
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_VM = os.path.join(ROOT, "launch", "tpu_vm.sh")
SLURM = os.path.join(ROOT, "launch", "slurm.sbatch")
CONFIG = "configs/pretrain/xlnet_large.py"


def run(*args, env=None):
    return subprocess.run(
        ["bash", *args], capture_output=True, text=True, cwd=ROOT, timeout=60, env={**os.environ, **(env or {})}
    )


def commands(stdout: str):
    """The `+ cmd args` lines (shell-quoted like `set -x`) as argument lists."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("script", [TPU_VM, SLURM])
def test_bash_syntax(script):
    r = run("-n", script)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("script", [TPU_VM, SLURM])
def test_shellcheck(script):
    r = subprocess.run(["shellcheck", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_tpu_vm_dry_run_plans_the_pod():
    r = run(
        TPU_VM,
        "--name=xl",
        "--zone=europe-west4-a",
        "--project=proj",
        "--accelerator-type=v3-1024",
        f"--config={CONFIG}",
        "--workdir=gs://bucket/xlnet_large",
        "--spot",
        "--dry-run",
        "--config.optimizer.learning_rate=1e-4",
    )
    assert r.returncode == 0, r.stderr
    cmds = commands(r.stdout)
    plan, create, scp, install, train = cmds
    # the plan compiles for the pod's topology: v3-1024 = 1024 TensorCores = 512 chips = 16x32
    assert plan[1:] == ["plan", f"--config={CONFIG}", "--topology=v3:16x32", "--config.optimizer.learning_rate=1e-4"]
    assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    assert {"--node-id=xl", "--zone=europe-west4-a", "--project=proj", "--accelerator-type=v3-1024", "--spot"} <= set(
        create
    )
    assert scp[3:5] == ["tpu-vm", "scp"] and "--worker=all" in scp
    assert install[3:5] == ["tpu-vm", "ssh"] and "--worker=all" in install
    assert any("pip install" in a and "constraints.txt" in a and "[tpu,gcs]" in a for a in install)
    command = next(a for a in train if a.startswith("--command="))
    assert "--worker=all" in train
    assert (
        f"xlgen train --config={CONFIG} --workdir=gs://bucket/xlnet_large --distributed=on "
        "--config.optimizer.learning_rate=1e-4"
    ) in command


def test_tpu_vm_watch_dry_run_shows_the_recovery():
    """--watch: one round of the watch is printed with the recovery from a preemption (delete, request, wait, copy,
    install, relaunch: the same commands as the first launch); --max-restarts supervises training on the workers."""
    args = ["--name=xl", "--zone=z", "--accelerator-type=v3-8", f"--config={CONFIG}", "--workdir=gs://b/w"]
    r = run(TPU_VM, *args, "--dry-run", "--watch=60", "--max-restarts=5")
    assert r.returncode == 0, r.stderr
    plan, create, scp, install, train, delete, *again = commands(r.stdout)
    assert again == [create, scp, install, train]
    assert delete[3:6] == ["queued-resources", "delete", "xl"] and "--force" in delete
    command = next(a for a in train if a.startswith("--command="))
    assert "xlgen train --config=" in command and "--distributed=on --max_restarts=5 " in command
    done, state = commands(r.stderr)  # the watch's queries (their output is their result)
    assert done == ["gcloud", "storage", "cat", "gs://b/w/summary.json"]
    assert state[3:6] == ["queued-resources", "describe", "xl"] and "--format=value(state.state)" in state
    assert "# xl is PREEMPTED (preempted): requesting it again and relaunching" in r.stdout
    for bad, message in (("--watch=soon", "--watch takes a number"), ("--max-restarts=-1", "--max-restarts must")):
        r = run(TPU_VM, *args, "--dry-run", bad)
        assert r.returncode == 2 and message in r.stderr


@pytest.mark.parametrize(
    "accel,topology",
    [
        ("v3-8", "v3:2x2"),
        ("v3-32", "v3:4x4"),
        ("v3-64", "v3:4x8"),
        ("v3-512", "v3:16x16"),
        ("v4-8", "v4:2x2x1"),
        ("v4-64", "v4:2x4x4"),
        ("v5litepod-16", "v5e:4x4"),
        ("v5p-128", "v5p:4x4x4"),
    ],
)
def test_tpu_vm_accelerator_to_topology(accel, topology):
    r = run(
        TPU_VM,
        "--name=n",
        "--zone=z",
        f"--accelerator-type={accel}",
        f"--config={CONFIG}",
        "--workdir=gs://b/w",
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    assert f"--topology={topology}" in commands(r.stdout)[0]


@pytest.mark.parametrize(
    "bad,message",
    [("--workdir=/local/dir", "gs://"), ("--config=/nonexistent.py", "not found"), ("--bogus", "unknown argument")],
)
def test_tpu_vm_rejects_bad_input(bad, message):
    args = {"--workdir": "--workdir=gs://b/w", "--config": f"--config={CONFIG}"}
    key = bad.split("=")[0]
    args[key] = bad
    r = run(TPU_VM, "--name=n", "--zone=z", "--accelerator-type=v3-8", *args.values(), "--dry-run")
    assert r.returncode == 2 and message in r.stderr


def test_slurm_dry_run_one_process_per_gpu():
    r = run(
        SLURM,
        "--dry-run",
        "--config=configs/pretrain/txl_wt103_large.py",
        "--workdir=/shared/wt103",
        "--config.total_steps=100",
        env={"SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": ROOT},
    )
    assert r.returncode == 0, r.stderr
    (srun,) = commands(r.stdout)
    assert srun[0] == "srun" and "--gpu-bind=none" in srun
    i = srun.index("-c")
    task, argv0, rest = srun[i + 1], srun[i + 2], srun[i + 3 :]
    # each task pins its own GPU from SLURM_LOCALID; jax.distributed.initialize() reads the rest of Slurm's env
    assert 'JAX_LOCAL_DEVICE_IDS="$SLURM_LOCALID"' in task and 'train --distributed=on "$@"' in task
    assert argv0.endswith("xlgen")
    assert rest == [
        "--config=configs/pretrain/txl_wt103_large.py",
        "--workdir=/shared/wt103",
        "--config.total_steps=100",
    ]
    # the #SBATCH header asks for one task per GPU
    header = open(SLURM).read()
    assert "#SBATCH --gpus-per-node=8" in header and "#SBATCH --ntasks-per-node=8" in header


def test_slurm_requires_config_and_workdir():
    r = run(SLURM, "--dry-run", "--config=configs/pretrain/txl_tiny.py")
    assert r.returncode == 2 and "--workdir" in r.stderr


def test_local_multiprocess_reports_a_failing_process(tmp_path):
    """The exit status is the first non-zero status of any process (it was 0: `if ! wait` resets `$?`)."""
    script = os.path.join(ROOT, "launch", "local_multiprocess.sh")
    env = {"XLGEN_PYTHON": "/bin/false", "XLGEN_PORT": "1", "XLGEN_LOG_DIR": str(tmp_path)}
    r = run(script, "2", "train", env=env)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "process 0 exited with status 1" in r.stderr
