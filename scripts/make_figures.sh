#!/usr/bin/env bash
# Regenerates the result tables of the README and docs/results.md from the results.json files committed under results/ and, given OUT,
# redraws every figure and OUT/REPORT.md from the saved OUT/*/results.json files, running nothing else.
#
#   bash scripts/make_figures.sh            # the tables (scripts/readme_results.py)
#   bash scripts/make_figures.sh results    # and the report of a folder written by scripts/reproduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev,math
.venv/bin/python scripts/readme_results.py
if [ $# -ge 1 ]; then
  exec .venv/bin/python scripts/reproduce.py --report-only --out="$1"
fi
