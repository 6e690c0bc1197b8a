#!/usr/bin/env bash
# Creates .venv/ at the repository root and installs sera_jax with the given extras (default: dev,math).
# Re-running is cheap: the install is skipped while setup.py is unchanged and the extras installed so far
# include the ones asked for (the demo's dev,math after the tests' dev,math,tfds,parity installs nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev,math}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.sera_jax_installed"
setup_hash="$(sha256sum setup.py | cut -c1-16)"
installed=""
if [ -f "$stamp" ] && [ "$(cut -d' ' -f1 "$stamp")" = "$setup_hash" ]; then
  installed="$(cut -s -d' ' -f2 "$stamp")"
fi
missing="$(comm -23 <(tr ',' '\n' <<< "$extras" | sort -u) <(tr ',' '\n' <<< "$installed" | sort -u))"
if [ -n "$missing" ]; then
  all="$(printf '%s\n%s\n' "$(tr ',' '\n' <<< "$extras")" "$(tr ',' '\n' <<< "$installed")" | sed '/^$/d' | sort -u | paste -sd,)"
  # --no-compile: byte-compiling every file of TensorFlow and PyTorch costs minutes; imports compile what they use.
  .venv/bin/python -m pip install --quiet --no-compile -e ".[$all]"
  echo "$setup_hash $all" > "$stamp"
fi
