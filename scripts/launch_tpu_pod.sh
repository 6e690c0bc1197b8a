#!/usr/bin/env bash
# A multi-host Cloud TPU pod slice (e.g. v5p-64): run the same command on every host, e.g.
#
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all --command \
#     "cd sera_jax && bash scripts/launch_tpu_pod.sh maze full /mnt/shared/runs/maze"
#
# Each host installs JAX for TPU, then joins the job through jax.distributed.initialize() (--multihost):
# the coordinator is discovered from the TPU metadata. The workdir must be one shared filesystem mounted
# at the same path on every host (Filestore/NFS, or a bucket through gcsfuse): orbax writes checkpoints
# from all hosts there, and only process 0 writes metrics, results and the config fingerprint (the others
# wait for it). URLs (gs://) are not accepted. Off a TPU pod (no metadata to discover), set
# SERA_COORDINATOR=host:port, SERA_NUM_PROCESSES and SERA_PROCESS_ID on every host. The command this script
# ends with is tested as two CPU processes on one machine (tests/train/test_multihost.py).
set -euo pipefail
cd "$(dirname "$0")/.."
experiment="$1"; variant="$2"; workdir="$3"; shift 3
bash scripts/setup_venv.sh math
.venv/bin/python -m pip install --quiet "jax[tpu]"
exec .venv/bin/python -m "experiments.${experiment}.main" \
  --config="experiments/${experiment}/config.py:${variant}" --workdir="$workdir" --multihost "$@"
