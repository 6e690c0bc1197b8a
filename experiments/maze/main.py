"""Command line of the maze experiment (SERA.md §8B); the experiment itself is ``experiment.run``.

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze
"""

from absl import app, flags, logging
from ml_collections import config_flags

from sera_jax.train import config_utils

from experiments.maze.experiment import run
from sera_jax.train.distributed import maybe_initialize_distributed

_CONFIG = config_utils.define_flag_once(config_flags.DEFINE_config_file, "config", None, "experiments/maze/config.py:VARIANT", lock_config=True)
_WORKDIR = config_utils.define_flag_once(flags.DEFINE_string, "workdir", None, "Where checkpoints, metrics, results.json and figures go.")
_MULTIHOST = config_utils.define_flag_once(flags.DEFINE_bool, "multihost", False, "Join a multi-host job (jax.distributed.initialize).")


def main(argv):
    del argv
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    maybe_initialize_distributed(_MULTIHOST.value)
    run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
