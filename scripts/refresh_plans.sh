#!/usr/bin/env bash
# Reruns the command at the head of each saved plan (results/plans/NAME.txt) from a clean worktree of HEAD and
# rewrites the file: its command:, commit: and date: header, the planner's output, and `exit CODE wall SECONDS s`
# (the layout scripts/plan_table.py reads). A plan that failed to run (exit other than 0, fits, or 1, does not
# fit) leaves its file as it was. Then `python scripts/plan_table.py --write` redraws the docs' tables.
#
#   bash scripts/refresh_plans.sh results/plans/maze_gpu_h200x8.txt [...]
#   bash scripts/refresh_plans.sh $(grep -l 'not recorded' results/plans/*.txt)   # the plans without a commit
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$repo" rev-parse HEAD)"
src="$(mktemp -d)/tree"
git -C "$repo" worktree add --detach "$src" "$commit" >/dev/null
trap 'git -C "$repo" worktree remove --force "$src"' EXIT
export JAX_PLATFORMS=cpu TPU_WORKER_HOSTNAMES=localhost
for plan in "$@"; do
  path="$(cd "$(dirname "$plan")" && pwd)/$(basename "$plan")"
  command="$(sed -n 's/^command: //p' "$path" | head -1)"
  # The planner is `python -m experiments.plan`; the plans saved before it moved there record
  # `python -m sera_jax.train.plan`, which hands its arguments to it (sera_jax/train/plan.py's __main__).
  if [[ "$command" != "python -m experiments.plan "* && "$command" != "python -m sera_jax.train.plan "* ]]; then
    echo "$plan: no planner command in its header; skipped" >&2
    continue
  fi
  out="$(mktemp)"
  start=$SECONDS
  set +e
  # The header's words, split as a shell would but never evaluated: a hand-edited header cannot run anything else.
  mapfile -d '' words < <("$repo/.venv/bin/python" -c 'import shlex, sys; sys.stdout.write("\0".join(shlex.split(sys.argv[1])))' "$command")
  (cd "$src" && "$repo/.venv/bin/python" "${words[@]:1}") > "$out" 2> "$out.err"
  code=$?
  set -e
  if [ "$code" -gt 1 ]; then
    echo "$plan: exit $code, kept as it was; the planner said:" >&2
    tail -5 "$out.err" >&2
    continue
  fi
  { echo "command: $command"; echo "commit: $commit"; echo "date: $(date -u +%F)"; cat "$out"
    echo "exit $code wall $((SECONDS - start)) s"; } > "$path"
  echo "$plan: exit $code in $((SECONDS - start)) s"
done
