#!/usr/bin/env bash
# The README's main command: installs into .venv/ (if needed) and runs the demo-scale reproduction of all three
# experiments (about 4 minutes on 2 CPU cores); writes results/REPORT.md and the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/reproduce.sh demo results "$@"
