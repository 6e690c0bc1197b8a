"""Test-wide JAX set-up: 8 virtual CPU devices (for sharded == unsharded checks), set before JAX starts."""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep each test process from oversubscribing the 2 cores CI has.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
