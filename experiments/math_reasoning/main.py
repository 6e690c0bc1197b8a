"""Command line of the math reasoning experiment (docs/method.md §8C); the experiment itself is ``experiment.run``.

    python -m experiments.math_reasoning.main --config=experiments/math_reasoning/config.py:cpu --workdir=/tmp/math
"""

from experiments import platforms

if __name__ == "__main__":
    platforms.quiet_absent_accelerators()  # before JAX is imported (by the imports below)

from absl import flags  # noqa: E402

from experiments.math_reasoning.experiment import run  # noqa: E402
from sera_jax.train import cli  # noqa: E402

flags.adopt_module_key_flags(cli)  # --config, --workdir, --multihost, --stop_after show in --helpshort
main = cli.make_main(run)

if __name__ == "__main__":
    cli.run_main(main)
