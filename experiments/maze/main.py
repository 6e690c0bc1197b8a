"""Command line of the maze experiment (docs/method.md §8B); the experiment itself is ``experiment.run``.

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze
"""

from absl import flags

from experiments.maze.experiment import run
from sera_jax.train import cli

flags.adopt_module_key_flags(cli)  # --config, --workdir, --multihost, --stop_after show in --helpshort
main = cli.make_main(run)

if __name__ == "__main__":
    cli.run_main(main)
