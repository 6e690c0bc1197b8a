#!/usr/bin/env bash
# Installs into .venv/ (if needed) and runs the demo-scale reproduction; writes results/ (REPORT.md, figures).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev,math
exec .venv/bin/python scripts/reproduce.py --scale=demo --out=results "$@"
