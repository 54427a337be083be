"""Test-wide settings: 8 simulated CPU devices (for real sharded meshes), float32 matmuls at full precision."""

import os

from test_train_utils import CPU_COLLECTIVE_TIMEOUTS

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] += " " + CPU_COLLECTIVE_TIMEOUTS
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
