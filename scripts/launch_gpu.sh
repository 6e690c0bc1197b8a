#!/usr/bin/env bash
# One GPU machine (e.g. 1-8 NVIDIA H100/H200, CUDA 12 drivers): installs JAX with CUDA into .venv/ and runs
# one experiment on all local GPUs (the rollout batch is sharded over them; see config.mesh).
#
#   bash scripts/launch_gpu.sh maze gpu /data/runs/maze      # experiment, config variant, workdir
#   bash scripts/launch_gpu.sh math_reasoning gpu /data/runs/math --config.data.dir=/data/gsm8k \
#        --config.model.dir=/models/SmolLM2-360M-Instruct
set -euo pipefail
cd "$(dirname "$0")/.."
experiment="$1"; variant="$2"; workdir="$3"; shift 3
bash scripts/setup_venv.sh dev,math
.venv/bin/python -m pip install --quiet "jax[cuda12]"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
exec .venv/bin/python -m "experiments.${experiment}.main" \
  --config="experiments/${experiment}/config.py:${variant}" --workdir="$workdir" "$@"
