#!/usr/bin/env bash
# Installs into .venv/ (if needed) and runs the whole test suite on 2 worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev,math,tfds,parity
exec .venv/bin/python -m pytest -n 2 --dist loadfile -q tests "$@"
