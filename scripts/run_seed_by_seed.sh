#!/usr/bin/env bash
# Runs a declared comparison one seed per invocation, so that a machine which is wiped between sessions loses at
# most one seed's runs: after every seed the workdir's results.json (the runs of all seeds so far, with each
# invocation's command and commit) is copied to SAVE, which you commit; the next session copies SAVE back into a
# fresh workdir and goes on with the seeds SAVE does not hold yet (comparison.with_earlier_runs pools them).
#
#   scripts/run_seed_by_seed.sh COMMIT CONFIG WORKDIR SAVE [SEED ...]
#   scripts/run_seed_by_seed.sh 7d4f522 experiments/maze/config.py:cpu_epochs /tmp/maze_epochs \
#       results/cpu/maze_epochs/in_progress.json 0 1 2
#
# COMMIT is the declaration's commit: the runs go from a clean worktree of it (WORKDIR.src), so every run's
# provenance names a commit of main. SAVE is relative to this repository. Without SEEDs: the config's seeds.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$1" config="$2" workdir="$3" save="$repo/$4"
shift 4
python="$repo/.venv/bin/python"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
module="$(dirname "${config%%:*}" | tr / .).main"
src="$workdir.src"
if [ ! -d "$src" ]; then
  git -C "$repo" worktree add --force --detach "$src" "$commit" >/dev/null
fi
mkdir -p "$workdir"
if [ -f "$save" ] && [ ! -f "$workdir/results.json" ]; then
  cp "$save" "$workdir/results.json"
fi
seeds=("$@")
if [ ${#seeds[@]} -eq 0 ]; then
  read -r -a seeds <<< "$(cd "$src" && "$python" -c "
from ml_collections import config_flags
from absl import flags
config_flags.DEFINE_config_file('config')
flags.FLAGS(['run', '--config=$config'])
print(*flags.FLAGS.config.seeds)")"
fi
done_seeds() {  # the seeds whose runs the workdir's results.json holds for every method
  [ -f "$workdir/results.json" ] || return 0
  "$python" - "$workdir/results.json" <<'EOF'
import json, sys
methods = json.load(open(sys.argv[1]))["results"]["methods"]
print(*sorted(set.intersection(*(set(m["seeds"]) for m in methods.values()))))
EOF
}
for seed in "${seeds[@]}"; do
  if [[ " $(done_seeds) " == *" $seed "* ]]; then
    echo "seed $seed: already in $workdir/results.json"
    continue
  fi
  echo "seed $seed: $(date -u +%FT%TZ)"
  (cd "$src" && "$python" -m "$module" --config="$config" --workdir="$workdir" --config.seeds="($seed,)")
  mkdir -p "$(dirname "$save")"
  cp "$workdir/results.json" "$save"
done
