"""Command line of the alignment experiment (docs/method.md §8A); the experiment itself is ``experiment.run``.

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=/tmp/imagenet_alignment
"""

from experiments import platforms

if __name__ == "__main__":
    platforms.quiet_absent_accelerators()  # before JAX is imported (by the imports below)

from absl import flags  # noqa: E402

from experiments.imagenet_alignment.experiment import run  # noqa: E402
from sera_jax.train import cli  # noqa: E402

flags.adopt_module_key_flags(cli)  # --config, --workdir, --multihost, --stop_after show in --helpshort
main = cli.make_main(run, multihost=False)

if __name__ == "__main__":
    cli.run_main(main)
