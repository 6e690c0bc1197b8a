#!/usr/bin/env bash
# Redraws every figure and OUT/REPORT.md from the saved OUT/*/results.json files, running nothing else.
#
#   bash scripts/make_figures.sh results
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash scripts/make_figures.sh OUT (a folder written by scripts/reproduce.sh)}"
bash scripts/setup_venv.sh dev,math
exec .venv/bin/python scripts/reproduce.py --report-only --out="$out"
