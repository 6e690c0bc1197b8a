#!/usr/bin/env bash
# A multi-host Cloud TPU pod slice (e.g. v5p-64): run the same command on every host, e.g.
#
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all --command \
#     "cd sera_jax && bash scripts/launch_tpu_pod.sh maze full /mnt/shared/runs/maze"
#
# Each host installs JAX for TPU, then joins the job through jax.distributed.initialize() (--multihost):
# the coordinator is discovered from the TPU metadata. The workdir must be one shared filesystem mounted
# at the same path on every host (Filestore/NFS, or a bucket through gcsfuse): orbax writes checkpoints
# from all hosts there, and only process 0 writes metrics and results. URLs (gs://) are not accepted.
set -euo pipefail
cd "$(dirname "$0")/.."
experiment="$1"; variant="$2"; workdir="$3"; shift 3
bash scripts/setup_venv.sh math
.venv/bin/python -m pip install --quiet "jax[tpu]"
exec .venv/bin/python -m "experiments.${experiment}.main" \
  --config="experiments/${experiment}/config.py:${variant}" --workdir="$workdir" --multihost "$@"
