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

# The longest files first: with pytest-xdist's --dist loadfile each file runs whole on one worker, so a long file
# handed out last leaves the other worker idle (cold CI: these three take ~2 min each, the suite ~17).
_LONG_FIRST = ("tests/train/test_multihost.py", "tests/test_reproduce.py", "tests/experiments/test_maze_experiment.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order
