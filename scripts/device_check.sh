#!/usr/bin/env bash
# The device check of one GPU (results/gpu/README.md): finds or installs a Python whose JAX sees the GPU, then runs
# scripts/device_check.py under one time limit for the whole script (DEVICE_CHECK_SECONDS, default 480: 8 minutes),
# writing one JSON. Exit status: device_check.py's (0 every part ok, 1 a part failed, 2 no GPU, 3 a part cut short),
# 124 when the time limit killed it (the JSON then holds the parts that finished), 4 when no usable Python was found.
#
#   bash scripts/device_check.sh                         # -> $OUT/device_check.json, else results/gpu/device_check.json
#   bash scripts/device_check.sh /tmp/dc.json --steps=3  # the JSON's path, then flags of scripts/device_check.py
#   bash scripts/device_check.sh /tmp/dc.json --dry_run  # any machine: every part on CPU, maze tiny (tests the script)
#
# The Python, the first of these that works:
#   1. $DEVICE_CHECK_PYTHON, as it is;
#   2. .venv/bin/python, when its JAX sees a GPU (with --dry_run: when it imports JAX at all);
#   3. when pip can reach its index: .venv from scripts/setup_venv.sh (the dev extra), then the CUDA plugin with cuDNN
#      at the project's JAX, "jax[cuda12]==V" (V: the targets extra's jax-cuda12-plugin pin in setup.py), ~3 GB of
#      wheels (CUDA runtime, cuBLAS, cuDNN...);
#   4. offline (the lent H200: nothing outside it can be reached): the machine's python3, when its JAX sees the GPU
#      (that image's JAX, CUDA plugin, flax, optax, orbax and chex, whatever their versions: the JSON records them),
#      with the pure-Python packages it lacks installed from wheels carried in .whl/ (ml_collections there;
#      results/gpu/README.md says how to fetch them) and this checkout on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
limit="${DEVICE_CHECK_SECONDS:-480}"
out=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out="$1"; shift; fi
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out="$OUT/device_check.json"; else out="results/gpu/device_check.json"; fi
fi
dry=0
for arg in "$@"; do [ "$arg" = "--dry_run" ] && dry=1; done

export PYTHONUNBUFFERED=1 TPU_WORKER_HOSTNAMES=localhost
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
if [ "$dry" = 1 ]; then
  export JAX_PLATFORMS=cpu
else
  # JAX must start its GPU backend, and its CPU backend beside it: XLA:GPU gives no cost analysis, so the planner
  # (targets.compiled_cost) runs XLA's cost model through the CPU client.
  unset JAX_PLATFORMS
fi

sees_device() {  # $1: a Python; true when its JAX starts on a GPU (on anything, for the dry run)
  [ -x "$(command -v "$1" 2>/dev/null)" ] || return 1
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 180 "$1" - "$dry" <<'EOF' >/dev/null 2>&1
import sys
import jax
sys.exit(0 if sys.argv[1] == "1" or jax.default_backend() == "gpu" else 1)
EOF
}

py="" setup=""
if [ -n "${DEVICE_CHECK_PYTHON:-}" ]; then
  py="$DEVICE_CHECK_PYTHON" setup="given (DEVICE_CHECK_PYTHON)"
elif sees_device .venv/bin/python; then
  py=.venv/bin/python setup="venv"
elif PIP_DEFAULT_TIMEOUT=5 PIP_RETRIES=0 timeout 30 python3 -m pip index versions jax >/dev/null 2>&1; then
  jax_version="$(sed -n 's/.*jax-cuda12-plugin==\([0-9][0-9.]*\).*/\1/p' setup.py | head -1)"
  echo "device_check.sh: installing .venv (scripts/setup_venv.sh dev) and jax[cuda12]==${jax_version}" >&2
  if bash scripts/setup_venv.sh dev && { [ "$dry" = 1 ] || .venv/bin/python -m pip install --quiet --no-compile \
      "jax[cuda12]==${jax_version}"; } && sees_device .venv/bin/python; then
    py=.venv/bin/python setup="venv+pip (jax[cuda12]==${jax_version})"
  fi
fi
if [ -z "$py" ] && sees_device python3; then
  py=python3 setup="offline: the machine's python3"
  if compgen -G ".whl/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/device_check_site"
    python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || exit 4
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    setup="$setup + wheels from .whl/: $(cd .whl && ls -- *.whl | tr '\n' ' ')"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "$py" ]; then
  echo "device_check.sh: no Python whose JAX sees a GPU (.venv/bin/python, python3), and pip cannot install one" >&2
  exit 4
fi
missing="$("$py" - <<'EOF'
import importlib.util
need = ("jax", "flax", "optax", "chex", "orbax.checkpoint", "ml_collections", "absl", "numpy", "scipy", "tqdm")
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)"
if [ -n "$missing" ]; then
  echo "device_check.sh: $py lacks: $missing. Where pip works, fetch their wheels into .whl/ and carry .whl," >&2
  echo "  e.g. python3 -m pip download --no-deps -d .whl ml_collections==1.1.0 (results/gpu/README.md)" >&2
  exit 4
fi
export DEVICE_CHECK_SETUP="$setup" DEVICE_CHECK_SETUP_SECONDS="$SECONDS"
left=$((limit - SECONDS - 5))
if [ "$left" -lt 60 ]; then
  echo "device_check.sh: the set-up took ${SECONDS} s of ${limit}; too little left to run the check" >&2
  exit 124
fi
echo "device_check.sh: $setup; ${left} s left for the check -> $out" >&2
# The parts share --budget_s; the 30 s kept back cover JAX's start and the last write.
timeout -k 10 "$left" "$py" scripts/device_check.py --out="$out" --budget_s="$((left - 30))" "$@"
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "device_check.sh: killed at the time limit (${limit} s); $out holds the parts that finished" >&2
  rc=124
fi
exit "$rc"
