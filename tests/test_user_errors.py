"""The mistakes a user makes on the command line, end to end: each is one clear message, nothing saved is lost.

Runs ``python -m experiments.NAME.main`` as a user would (a subprocess each: a few seconds of imports), and
checks the message names the problem, that the run stops with status 1 and that no traceback is printed
(``cli.is_user_error``), on stdout or stderr.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from sera_jax.train import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENTS = ("maze", "math_reasoning", "imagenet_alignment")


def run_main(name: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"experiments.{name}.main", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def assert_one_message(proc: subprocess.CompletedProcess) -> None:
    """A user error: exit status 1 and no traceback anywhere in the output."""
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


def config_arg(name: str, variant: str = "tiny") -> str:
    return f"--config=experiments/{name}/config.py:{variant}"


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_unknown_config_field_is_named_with_close_matches(name, tmp_path):
    field = {"maze": "rl.learning_rat", "math_reasoning": "rl.learning_rat", "imagenet_alignment": "optim.lrr"}[name]
    proc = run_main(name, config_arg(name), f"--workdir={tmp_path / 'w'}", f"--config.{field}=0.1")
    assert_one_message(proc)
    assert f"--config.{field}: unknown config field" in proc.stderr
    assert "did you mean" in proc.stderr
    assert not (tmp_path / "w").exists()  # nothing was started


def test_unknown_flag_and_missing_workdir_are_usage_errors(tmp_path):
    proc = run_main("maze", config_arg("maze"), f"--workdir={tmp_path}", "--learning_rate=3")
    assert_one_message(proc)
    assert "Unknown command line flag 'learning_rate'" in proc.stderr
    proc = run_main("maze", config_arg("maze"))
    assert_one_message(proc)
    assert "--workdir=DIR are required" in proc.stderr
    proc = run_main("imagenet_alignment", config_arg("imagenet_alignment"), f"--workdir={tmp_path}", "--multihost")
    assert_one_message(proc)
    assert "runs on one host only" in proc.stderr


def test_unknown_variant_is_named(tmp_path):
    proc = run_main("maze", config_arg("maze", "huge"), f"--workdir={tmp_path}")
    assert_one_message(proc)
    assert "unknown variant 'huge'" in proc.stderr


def test_unusable_workdir_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("precious")
    proc = run_main("maze", config_arg("maze"), f"--workdir={blocker / 'run'}")
    assert_one_message(proc)
    assert f"workdir {blocker / 'run'} cannot be created" in last_line(proc)
    assert blocker.read_text() == "precious"


def test_missing_dataset_directory_says_what_to_download(tmp_path):
    missing = tmp_path / "no_tfds_here"
    proc = run_main("imagenet_alignment", config_arg("imagenet_alignment"), f"--workdir={tmp_path / 'w'}",
                    "--config.data.name=cifar10", f"--config.data.data_dir={missing}")
    assert_one_message(proc)
    message = last_line(proc)
    assert "FileNotFoundError" in message and str(missing) in message and "cifar10" in proc.stderr
    # The paper-scale math config on a machine without the model files.
    proc = run_main("math_reasoning", config_arg("math_reasoning", "gpu"), f"--workdir={tmp_path / 'm'}",
                    f"--config.model.dir={missing}")
    assert_one_message(proc)  # it used to print a 20-line traceback above the message
    message = last_line(proc)
    assert f"config.model.dir='{missing}' is not a directory" in message
    assert "huggingface-cli download HuggingFaceTB/SmolLM2-360M-Instruct --repo-type model" in message


def test_bad_sampling_temperature_is_named_before_any_work(tmp_path):
    proc = run_main("maze", config_arg("maze"), f"--workdir={tmp_path / 'w'}", "--config.eval.temperature=0")
    assert_one_message(proc)
    assert last_line(proc) == ("FATAL ValueError: config.eval.temperature=0.0: must be a finite number > 0 "
                               "(0 does not mean greedy decoding)")
    assert not (tmp_path / "w").exists()


def test_only_errors_the_project_raises_are_user_errors():
    """A ValueError raised by our own ``raise`` is a message for the user; one from inside a library keeps its
    traceback (likely a bug)."""
    import json

    from sera_jax.train import config_utils

    def caught(fn):
        try:
            fn()
        except Exception as e:
            return e
        raise AssertionError("no error")

    assert cli.is_user_error(caught(lambda: config_utils.require({"a": 0}, "a", lambda v: v > 0, "must be > 0")))
    assert cli.is_user_error(caught(lambda: cli.load_config_spec("no/such/config.py:tiny")))
    assert not cli.is_user_error(caught(lambda: json.loads("{")))  # a ValueError raised inside the json module
    assert not cli.is_user_error(caught(lambda: {}["missing"]))  # KeyError: not a user-error type


def test_an_embedded_traceback_is_reduced_to_its_exception():
    message = ("flag --config=x.py:huge: Error whilst parsing config file:\n\nTraceback (most recent call last):\n"
               '  File "x.py", line 3, in get_config\n    raise ValueError("unknown variant")\n'
               "ValueError: unknown variant 'huge'\n")
    assert cli.strip_traceback(message) == ("flag --config=x.py:huge: Error whilst parsing config file: "
                                            "ValueError: unknown variant 'huge'")
    assert cli.strip_traceback("no trace here") == "no trace here"


def test_config_overrides_are_found_in_argv():
    argv = ["main", "--config=x.py:tiny", "--config.rl.steps=3", "--noconfig.log.progress", "--workdir=w",
            "-config.a=1", "--configuration=2"]
    assert cli.config_overrides(argv) == ["rl.steps", "log.progress", "a"]


def test_explain_override_error_names_the_first_bad_field():
    path = REPO / "experiments" / "maze" / "config.py"
    argv = ["main", f"--config={path}:tiny", "--config.rl.steps=3", "--config.sft.stepz=2", "--config.x=1"]
    message = cli.explain_override_error(argv)
    assert message.startswith("--config.sft.stepz: unknown config field")
    assert "'steps'" in message  # the close match
    assert cli.explain_override_error(["main", f"--config={path}:tiny", "--config.rl.steps=3"]) is None
    assert "need --config=" in cli.explain_override_error(["main", "--config.rl.steps=3"])
    assert "could not be loaded" in cli.explain_override_error(["main", f"--config={path}:huge", "--config.a=1"])


def test_helpshort_lists_the_experiment_flags():
    proc = run_main("imagenet_alignment", "--helpshort")
    for flag in ("--config", "--workdir", "--stop_after"):
        assert flag in proc.stdout + proc.stderr
