"""Test-wide JAX set-up: 8 virtual CPU devices (for sharded == unsharded checks), set before JAX starts."""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep each test process from oversubscribing the 2 cores CI has.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Share compiled programs between the test workers, the notebook kernels and later runs: most of the
# suite's time is XLA compilation of the same tiny models.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
