#!/usr/bin/env bash
# Creates .venv/ at the repository root and installs sera_jax with the given extras (default: dev,math).
# Re-running is cheap: the install is skipped while setup.py and the extras are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev,math}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.sera_jax_installed"
want="$(sha256sum setup.py | cut -c1-16) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  echo "$want" > "$stamp"
fi
