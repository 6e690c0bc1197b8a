"""Test-wide JAX set-up: 8 virtual CPU devices (for sharded == unsharded checks), set before JAX starts."""

import os

# LLVM at -O0: the suite's time is mostly XLA compiling tiny programs that then run for milliseconds, and -O0
# compiles them ~1.8x faster (tests/rl/test_step.py cold: 86 vs 158 s). Subprocesses (multi-host, notebooks,
# reproduce) inherit XLA_FLAGS. No fast-math at either level, and the suite's tolerances hold at both; only run
# time is slower (the whole suite cold on 2 cores: 11m19s with this and the file order
# below, 17m42s before both).
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep each test process from oversubscribing the 2 cores CI has.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Share compiled programs between the test workers, the notebook kernels and later runs: most of the
# suite's time is XLA compilation of the same tiny models.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# The longest files first (longest-processing-time scheduling): with pytest-xdist's --dist loadfile each file runs
# whole on one worker, so a long file handed out last leaves the other worker idle. Ordered by their cold-cache
# times on 2 cores (``--durations=0`` summed per file: 212, 164, 118, 112, 91, 91, 67, 57, 50, 49 s; the suite
# 11m19s); every other file follows in collection order.
_LONG_FIRST = (
    "tests/rl/test_trainer.py",
    "tests/train/test_multihost.py",
    "tests/test_reproduce.py",
    "tests/experiments/test_imagenet_alignment.py",
    "tests/rl/test_step.py",
    "tests/test_notebooks.py",
    "tests/models/test_sampler.py",
    "tests/models/test_decoder.py",
    "tests/models/test_attention.py",
    "tests/experiments/test_maze_experiment.py",
)


def pytest_configure(config):
    # xdist hands files out by their number of tests unless told not to, which would undo the order above.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order
