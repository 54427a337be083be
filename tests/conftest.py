"""Test-wide settings: 8 simulated CPU devices (for real sharded meshes), float32 matmuls at full precision, XLA:CPU
thread pools sized for blocking collectives (`test_train_utils.CPU_THREADS_PER_DEVICE` says why), programs compiled
for compile time (`test_train_utils.CPU_FAST_COMPILE`: the test models are tiny, compilation is most of a test's
time), one persistent compilation cache for the session (its workers, their `xlgen` subprocesses: a program
compiled by one test is loaded by the next test that builds it); the heaviest files scheduled first (pytest-xdist
hands files out in collection order: longest first, the two workers end together); and the suite's time guard
(tests/suite_guard.py: wall time, tests over the per-test budget)."""

import os
import shutil
import tempfile

from suite_guard import pytest_runtest_logreport, pytest_sessionstart, pytest_terminal_summary  # noqa: F401
from test_train_utils import CPU_COLLECTIVE_TIMEOUTS, CPU_FAST_COMPILE, cpu_thread_pool_env

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] += " " + CPU_COLLECTIVE_TIMEOUTS + " " + CPU_FAST_COMPILE
os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _name, _value in cpu_thread_pool_env(8).items():
    os.environ.setdefault(_name, _value)

# Set by the first process (the xdist controller, or a plain run) and inherited by its workers and subprocesses.
_OWN_CACHE = "XLGEN_TEST_COMPILATION_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["XLGEN_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="xlgen-test-jax-cache-")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_compilation_cache_dir", os.environ["XLGEN_TEST_COMPILATION_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
# In-process `cli.main` runs (`platforms.setup_runtime`) point JAX at XLGEN_COMPILATION_CACHE: the session's, never
# the user's ~/.cache/xlgen.
os.environ["XLGEN_COMPILATION_CACHE"] = os.environ["XLGEN_TEST_COMPILATION_CACHE"]
os.environ.setdefault("XLGEN_COMPILATION_CACHE_MIN_SECS", "0.1")

# Files by their measured cost (XLGEN_FILE_TIMES=1 prints it), most expensive first; the rest keep their order.
HEAVIEST_FILES = (
    "test_pod_comm.py",
    "test_pod_operations.py",
    "test_tpu_attention.py",
    "test_doc_commands_xlnet_start.py",
    "test_plan.py",
    "test_doc_commands.py",
    "test_gan.py",
    "test_remat_precision.py",
    "test_user_edges.py",
    "test_train_resume.py",
    "test_small_recipes.py",
    "test_tpu_shift.py",
    "test_funnel.py",
    "test_transformer_xl.py",
    "test_train_funnel.py",
    "test_segment_recurrence.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FILES)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))


def pytest_unconfigure(config):
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["XLGEN_TEST_COMPILATION_CACHE"], ignore_errors=True)
