"""Collects calibration runs of an RL comparison into one small JSON file docs/results.md can report.

    python scripts/calibration_record.py --out=results/cpu/maze/calibration.json WORKDIR [WORKDIR ...]

Each WORKDIR is a comparison's workdir (``python -m experiments.maze.main ... --workdir=WORKDIR``) with its
``results.json``. The record keeps, per workdir, the command and commit that made it, the settings a
calibration varies and every evaluation (step, pass@k, solved fraction) of every method and seed, and the active
fraction at every step where the run kept it, but not the rest of the per-step training history that makes a
results.json large. Runs already in ``--out`` are kept; a workdir of
the same name replaces its entry. ``scripts/readme_results.py`` renders it (``view=calibration``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
if __name__ == "__main__":  # before this process imports JAX (through sera_jax): experiments/platforms.py
    from experiments import platforms

    platforms.quiet_absent_accelerators()

from sera_jax.train.files import write_text_atomic  # noqa: E402
from sera_jax.train.writers import run_provenance  # noqa: E402

# The settings calibration varies, by their config path (those absent from an experiment's config are skipped).
SETTINGS = ("maze.size", "maze.num_eval", "maze.num_train", "maze.hard_fraction", "maze.easy_fraction", "data.num_train",
            "data.num_eval", "sft.steps", "sft.seed", "rl.steps", "rl.prompts_per_step", "rl.rollouts_per_step",
            "rl.learning_rate", "sera.n_max", "eval.samples_per_prompt")


def _get(config: dict, path: str):
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def run_entry(workdir: pathlib.Path) -> dict:
    """One workdir's record: its provenance, settings, and each method's evaluations per seed."""
    path = workdir / "results.json"
    try:
        saved = json.loads(path.read_text())
        methods = saved["results"]["methods"]
        config = saved["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a comparison's results.json ({e!r})")
    settings = {k: v for k in SETTINGS if (v := _get(config, k)) is not None}
    settings["rollouts_per_prompt"] = settings["rl.rollouts_per_step"] / settings["rl.prompts_per_step"]
    runs = {}
    for method, entry in methods.items():
        # The active fraction at every step, where the run kept its every step's allocation diagnostics.
        active = {h["seed"]: h["allocation"]["active_frac"] for h in entry.get("history", [])
                  if "active_frac" in (h.get("allocation") or {})}
        runs[method] = [{"seed": curve["seed"],
                         "evaluations": [{k: e[k] for k in ("step", "k", "pass_at_k", "solved_frac")}
                                         for e in curve["evaluations"]],
                         **({"active_frac": active[curve["seed"]]} if curve["seed"] in active else {})}
                        for curve in entry["curves"]]
    return {"name": workdir.name, "provenance": saved.get("provenance"), "settings": settings,
            "sft_final_loss": saved["results"].get("sft_final_loss"), "methods": runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("workdirs", nargs="+", type=pathlib.Path)
    args = parser.parse_args(argv)
    record = json.loads(args.out.read_text()) if args.out.exists() else {"results": {"runs": []}}
    runs = {r["name"]: r for r in record["results"]["runs"]}
    for workdir in args.workdirs:
        runs[workdir.name] = run_entry(workdir)
    record["results"]["runs"] = sorted(runs.values(), key=lambda r: r["name"])
    record["provenance"] = run_provenance()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
