"""scripts/run_seed_by_seed.sh, on a throwaway repository whose "experiment" only records which seeds it ran.

The script is what keeps a declared 16-seed comparison alive across machines that are wiped between sessions, so
what it must get right is checked here: every seed runs from a clean worktree of the declaration commit (not the
working tree), the runs so far are copied to SAVE after each seed, a fresh workdir is seeded from SAVE, seeds SAVE
holds are not rerun, and a failing seed stops the script without touching what SAVE already holds.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Stands in for an experiment's main: pools the workdir's results.json with this invocation's seed, as
# comparison.with_earlier_runs does, and logs the seed and the source tree it ran from.
FAKE_MAIN = '''
import json, os, pathlib, sys
args = dict(a.split("=", 1) for a in sys.argv[1:])
workdir = pathlib.Path(args["--workdir"])
seed = int(args["--config.seeds"].strip("(),"))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"seed": seed, "cwd": os.getcwd(), "version": open("VERSION").read().strip()}) + "\\n")
if seed == int(os.environ.get("FAKE_FAIL_SEED", "-1")):
    sys.exit(3)
path = workdir / "results.json"
results = json.loads(path.read_text()) if path.exists() else {"results": {"methods": {"a": {"seeds": []}, "b": {"seeds": []}}}}
for method in results["results"]["methods"].values():
    method["seeds"].append(seed)
path.write_text(json.dumps(results))
'''


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def toy_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "experiments" / "fake").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run_seed_by_seed.sh", repo / "scripts")
    (repo / "experiments" / "fake" / "main.py").write_text(FAKE_MAIN)
    (repo / "experiments" / "fake" / "config.py").write_text("")
    (repo / "VERSION").write_text("declared\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "declaration")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    # The working tree moves on after the declaration; the runs must not see it.
    (repo / "VERSION").write_text("later\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").symlink_to(sys.executable)
    return repo, commit


def _run(repo, commit, workdir, seeds, log, fail_seed=None):
    env = dict(os.environ, FAKE_LOG=str(log))
    if fail_seed is not None:
        env["FAKE_FAIL_SEED"] = str(fail_seed)
    return subprocess.run(["bash", str(repo / "scripts" / "run_seed_by_seed.sh"), commit,
                           "experiments/fake/config.py:x", str(workdir), "results/save.json", *map(str, seeds)],
                          env=env, capture_output=True, text=True)


def _ran(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _saved_seeds(repo):
    methods = json.loads((repo / "results" / "save.json").read_text())["results"]["methods"]
    return {name: sorted(m["seeds"]) for name, m in methods.items()}


def test_runs_each_seed_from_the_declared_commit_and_saves_after_each(toy_repo, tmp_path):
    repo, commit = toy_repo
    log = tmp_path / "log"
    done = _run(repo, commit, tmp_path / "work", [0, 1], log)
    assert done.returncode == 0, done.stderr
    assert [r["seed"] for r in _ran(log)] == [0, 1]
    assert {r["version"] for r in _ran(log)} == {"declared"}
    assert {r["cwd"] for r in _ran(log)} == {str(tmp_path / "work") + ".src"}
    assert _saved_seeds(repo) == {"a": [0, 1], "b": [0, 1]}


def test_a_wiped_workdir_resumes_from_save_and_skips_the_seeds_it_holds(toy_repo, tmp_path):
    repo, commit = toy_repo
    log = tmp_path / "log"
    assert _run(repo, commit, tmp_path / "first", [0, 1], log).returncode == 0
    shutil.rmtree(tmp_path / "first")  # the machine is wiped; only SAVE (committed) survives
    again = _run(repo, commit, tmp_path / "second", [0, 1, 2], log)
    assert again.returncode == 0, again.stderr
    assert [r["seed"] for r in _ran(log)] == [0, 1, 2]  # 0 and 1 were not rerun
    assert "seed 0: already in" in again.stdout
    assert _saved_seeds(repo) == {"a": [0, 1, 2], "b": [0, 1, 2]}


def test_a_failing_seed_stops_the_script_and_save_keeps_the_seeds_before_it(toy_repo, tmp_path):
    repo, commit = toy_repo
    log = tmp_path / "log"
    failed = _run(repo, commit, tmp_path / "work", [0, 1, 2], log, fail_seed=1)
    assert failed.returncode != 0
    assert [r["seed"] for r in _ran(log)] == [0, 1]  # seed 2 never started
    assert _saved_seeds(repo) == {"a": [0], "b": [0]}
