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
# suite's time is XLA compilation of the same tiny models. Every program is cached, however quick to compile: at -O0
# most take under 0.2 s, and a tiny maze run's second start, cold cache before the first, took 19 s caching all
# (279 entries, 2.4 MB) against 26 s caching those over 0.2 s (8 entries).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# The longest files first (longest-processing-time scheduling): with pytest-xdist's --dist loadfile each file runs
# whole on one worker, so a long file handed out last leaves the other worker idle. Every file of more than ~15 s,
# ordered by its time in a cold-cache ``-n 2`` run on 2 cores (test times summed per file: 250, 197, 189, 149, 106, 86,
# 78, 78, 69, 68, 55, 41, 40, 35, 29, 22, 22, 16 s; the suite 14m50s, the machine shared): what is left to hand out
# at the end are files of seconds (a 40 s file handed out last ended one worker 36 s after the other). Every
# other file follows in collection order.
_LONG_FIRST = (
    "tests/rl/test_trainer.py",
    "tests/train/test_run_messages.py",
    "tests/train/test_multihost.py",
    "tests/test_reproduce.py",
    "tests/experiments/test_imagenet_alignment.py",
    "tests/models/test_sampler.py",
    "tests/test_notebooks.py",
    "tests/integrations/test_tunix_learner.py",
    "tests/rl/test_step.py",
    "tests/models/test_attention.py",
    "tests/models/test_decoder.py",
    "tests/experiments/test_maze_experiment.py",
    "tests/train/test_targets.py",
    "tests/train/test_device_check.py",
    "tests/experiments/test_maze_paper.py",
    "tests/experiments/test_math_paper.py",
    "tests/core/test_released_rule.py",
    "tests/experiments/test_comparison_rules.py",
    "tests/core/test_allocation.py",
    "tests/experiments/test_plan.py",
    "tests/experiments/test_method_wiring.py",
    "tests/test_user_errors.py",
    "tests/experiments/test_math_reasoning.py",
    "tests/core/test_scale_factors.py",
    "tests/core/test_allocators.py",
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
