#!/usr/bin/env bash
# Installs into .venv/ (if needed) and runs the whole test suite on 2 worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev,math,tfds,parity,tunix,wandb,targets
# The targets extra installs the CUDA plugin and libtpu, which the planner's tests compile with (without a GPU or a
# TPU): JAX must still start on CPU (tests/conftest.py sets JAX_PLATFORMS=cpu too), and libtpu must not look for a
# TPU VM's metadata server.
export JAX_PLATFORMS=cpu TPU_WORKER_HOSTNAMES=localhost
# The venv is installed without byte-compiling (setup_venv.sh: --no-compile), so let imports write the bytecode of
# what they use: with PYTHONDONTWRITEBYTECODE set, every Python process the suite starts (workers, multi-host
# processes, notebook kernels, command-line runs) recompiles JAX, Flax and TensorFlow from source (a fresh
# clone's suite with an empty compilation cache, 2 cores: 837 s with it set, 724 s unset).
unset PYTHONDONTWRITEBYTECODE
# --durations: every run prints its 25 slowest tests, to see where CI time goes.
exec .venv/bin/python -m pytest -n 2 --dist loadfile -q --durations=25 tests "$@"
