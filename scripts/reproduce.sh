#!/usr/bin/env bash
# The reproduction at one scale: installs what the scale needs into .venv/, runs the three experiments into OUT
# (default results_SCALE) and writes OUT/REPORT.md with the figures. A killed run resumes when started again.
#
#   bash scripts/reproduce.sh demo results      # any 2-core CPU: about 4 minutes (the README's main command)
#   bash scripts/reproduce.sh cpu               # a 2-core CPU: under 2 hours an experiment, 16 paired seeds
#   bash scripts/reproduce.sh gpu /data/sera \  # one H100/H200-class GPU machine, local datasets and models
#       --extra=imagenet_alignment:--config.data.data_dir=/data/tfds \
#       --extra=math_reasoning:--config.data.dir=/data/gsm8k \
#       --extra=math_reasoning:--config.data.eval_dir=/data/gsm8k-platinum \
#       --extra=math_reasoning:--config.model.dir=/models/SmolLM2-360M-Instruct
#   bash scripts/reproduce.sh full /data/sera ...   # as gpu, with Qwen3 on POLARIS for the math experiment
#
# scripts/reproduce.py documents each scale's hardware and run time; a multi-host TPU pod runs each experiment
# with scripts/launch_tpu_pod.sh instead. Redraw the figures and report from saved results: make_figures.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scale="${1:?usage: bash scripts/reproduce.sh SCALE [OUT] [reproduce.py flags]}"
out="${2:-results_$scale}"
shift $(( $# >= 2 ? 2 : 1 ))
case "$scale" in
  demo|cpu) bash scripts/setup_venv.sh dev,math ;;
  gpu|full)
    bash scripts/setup_venv.sh dev,math,tfds
    .venv/bin/python -m pip install --quiet "jax[cuda12]"
    export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}" ;;
  *) echo "unknown scale '$scale': choose demo, cpu, gpu or full" >&2; exit 2 ;;
esac
unset PYTHONDONTWRITEBYTECODE  # the venv is installed --no-compile: let imports keep the bytecode they compile
exec .venv/bin/python scripts/reproduce.py --scale="$scale" --out="$out" "$@"
