"""Test-wide settings: 8 simulated CPU devices (for real sharded meshes), float32 matmuls at full precision, XLA:CPU
thread pools sized for blocking collectives (`test_train_utils.CPU_THREADS_PER_DEVICE` says why); and the suite's
time guard (tests/suite_guard.py: wall time, tests over the per-test budget)."""

import os

from suite_guard import pytest_runtest_logreport, pytest_sessionstart, pytest_terminal_summary  # noqa: F401
from test_train_utils import CPU_COLLECTIVE_TIMEOUTS, cpu_thread_pool_env

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] += " " + CPU_COLLECTIVE_TIMEOUTS
os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _name, _value in cpu_thread_pool_env(8).items():
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
