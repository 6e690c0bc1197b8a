"""scripts/reproduce.py: a tiny run of one experiment end to end, the report's tables and figures from the
published results.json files, and --report-only redrawing every figure and table from those files alone."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def reproduce(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/reproduce.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)


def tables(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("|")]


# Published results (results/cpu) in the report's layout, one file a section: the report is drawn from files as the
# experiments save them (the math section from the epochs comparison, the experiment's own cpu file being a
# calibration record).
PUBLISHED = {"imagenet_alignment": "imagenet_alignment", "maze": "maze", "math_reasoning": "math_epochs"}


def test_a_tiny_run_reports_its_experiment(tmp_path):
    """The run path end to end on one experiment (the other two's tiny runs are their own tests'): the command,
    ``--extra`` reaching it, and its section of the report with one seed's config and no interval."""
    out = tmp_path / "results"
    proc = reproduce("--scale=tiny", f"--out={out}", "--only", "maze", "--extra=maze:--config.rl.steps=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--config.rl.steps=2" in proc.stdout  # --extra reaches the experiment's command line
    report = (out / "REPORT.md").read_text()
    assert "## Maze navigation" in report and "| uniform |" in report and "| sera |" in report
    assert "Config `tiny` (seeds [0])" in report  # the configs and seeds used
    assert "With 1 paired seed there is no interval" in report  # one seed cannot compare methods
    assert "## Math reasoning\n\nNot run" in report and "_maze: " in report  # the others not run; its time
    assert (out / "maze_pass_at_k.png").is_file()


def test_the_report_from_saved_results_then_report_only_redraws_it(tmp_path):
    import shutil

    out = tmp_path / "results"
    for name, folder in PUBLISHED.items():
        (out / name).mkdir(parents=True)
        shutil.copy(REPO / "results" / "cpu" / folder / "results.json", out / name / "results.json")
    proc = reproduce("--report-only", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "-m experiments." not in proc.stdout  # nothing was run
    report = (out / "REPORT.md").read_text()
    for heading in ("## Allocation at equal budget", "## Gradient alignment", "### Checkpoint at step 0",
                    "### Training dynamics", "## Maze navigation", "## Math reasoning", "Paired by seed"):
        assert heading in report, heading
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert {"allocation.png", "maze_pass_at_k.png", "math_reasoning_pass_at_k.png",
            "imagenet_alignment_cosine_vs_budget.png", "imagenet_alignment_training_curves.png"} <= set(links)
    assert all((out / link).is_file() for link in links)

    figures = sorted(p.name for p in out.glob("*.png"))
    for path in out.glob("*.png"):
        path.unlink()
    (out / "REPORT.md").unlink()
    proc = reproduce("--report-only", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in out.glob("*.png")) == figures
    assert tables((out / "REPORT.md").read_text()) == tables(report)


def test_bad_extra_is_named(tmp_path):
    proc = reproduce("--report-only", f"--out={tmp_path}", "--extra=mazes:--config.x=1")
    assert proc.returncode != 0 and "--extra='mazes:--config.x=1': expected EXPERIMENT:--flag=value" in proc.stderr


def test_power_sentence_states_the_detectable_range():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_script", REPO / "scripts" / "reproduce.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    paired = {"sera": {"num_seeds": 16, "ci95": [0.02, 0.04], "mde80": [0.023, 0.053]},
              "grpo": {"num_seeds": 16, "ci95": [0.03, 0.05], "mde80": [0.041, 0.065]}}
    sentence = script._power_sentence(paired)
    assert "16 paired seeds" in sentence and "0.023 to 0.065" in sentence
    assert script._power_sentence({"sera": {"num_seeds": 16, "ci95": [0.02], "k": [1]}}) == ""  # no MDE saved
