"""What a run says: a line per phase at every scale, one line for Ctrl-C, pass@k with its k, comma-separated lists
on the command line, and none of the accelerator plugins' noise on a machine without the accelerator.

One ``tiny`` maze run in a subprocess, as a user starts it, checks them end to end; the rest are the functions.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from experiments import platforms
from experiments.maze import config as maze_config
from sera_jax.rl import comparison
from sera_jax.train import cli, writers

REPO = pathlib.Path(__file__).resolve().parents[2]
# What the CUDA plugin and libtpu print on a machine without a GPU or TPU (with the ``targets`` extra installed).
PLUGIN_NOISE = ("cudart_stub", "Could not find cuda drivers", "Unable to load CUDA", "absl::InitializeLog",
                "Jax plugin configuration error", "TPU accelerator type", "libtpu")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    """``python -m experiments.maze.main`` at ``tiny`` with the methods as a comma-separated list, JAX left to
    choose its platforms (no ``JAX_PLATFORMS``), on one CPU device."""
    workdir = tmp_path_factory.mktemp("tiny_maze") / "w"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    cmd = [sys.executable, "-m", "experiments.maze.main", "--config=experiments/maze/config.py:tiny",
           f"--workdir={workdir}", "--config.methods=sera,uniform"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, proc


def test_a_tiny_run_says_what_it_does(tiny_run):
    """A line as each phase begins (``tiny`` has its progress bars off), the methods in the order the command
    listed them, and a summary that names each k."""
    workdir, proc = tiny_run
    lines = proc.stdout.splitlines()
    assert lines[:4] == [f"maze: 1 seed x 2 methods (sera, uniform), 2 RL steps each, in {workdir}",
                         f"seed 0: SFT, 4 steps ({workdir}/seed_0/sft)",
                         f"seed 0, sera (run 1 of 2): RL, 2 steps ({workdir}/seed_0/sera)",
                         f"seed 0, uniform (run 2 of 2): RL, 2 steps ({workdir}/seed_0/uniform)"], proc.stdout
    assert "maze: final pass@k (mean over 1 seed)" in lines
    for method in ("sera", "uniform"):
        assert any(re.fullmatch(rf"{method} +pass@1 [01]\.\d{{3}}  pass@2 [01]\.\d{{3}}  pass@4 [01]\.\d{{3}}", line)
                   for line in lines), proc.stdout
    assert lines[-1] == f"results: {workdir}/results.json and 2 figures in {workdir}"


def test_a_run_without_an_accelerator_prints_no_plugin_noise(tiny_run):
    _, proc = tiny_run
    output = proc.stdout + proc.stderr
    assert not [noise for noise in PLUGIN_NOISE if noise in output], proc.stderr[-3000:]
    assert "Traceback" not in output


def test_comma_separated_words_are_a_list():
    """ml_collections reads ``--config.seeds=0,1`` as (0, 1) but ``--config.methods=uniform,sera`` as one name."""
    config = maze_config.get_config("tiny")
    config.methods = ("uniform,sera",)  # what ml_collections made of it
    cli.split_comma_lists(config, ["main", "--config=x.py:tiny", "--config.methods=uniform,sera"])
    assert config.methods == ("uniform", "sera")
    cli.split_comma_lists(config, ["main", "--config.methods", "grpo, dapo", "--config.methods=sera"])
    assert config.methods == ("grpo", "dapo", "sera")  # a repeated flag: the items of each, in order
    config.methods, config.seeds = ("a,b",), (0, 1)
    cli.split_comma_lists(config, ["main", "--config.methods=('a,b',)", "--config.seeds=0,1"])
    assert config.methods == ("a,b",) and config.seeds == (0, 1)  # Python literals stay as ml_collections read them
    config.maze.train_parquet = "a,b.parquet"
    cli.split_comma_lists(config, ["main", "--config.maze.train_parquet=a,b.parquet"])
    assert config.maze.train_parquet == "a,b.parquet"  # not a list field


def test_ctrl_c_ends_with_one_line_saying_how_to_resume(capsys):
    def interrupted():
        raise KeyboardInterrupt

    argv = [str(REPO / "experiments/maze/main.py"), "--config=experiments/maze/config.py:tiny", "--workdir=/tmp/w"]
    with pytest.raises(SystemExit) as stopped:
        cli.run_once(interrupted, workdir="/tmp/w", argv=argv)
    assert stopped.value.code == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("Interrupted. The same command with the same --workdir=/tmp/w resumes from the last "
                          "checkpoint: python ")
    assert err.rstrip().endswith("--config=experiments/maze/config.py:tiny --workdir=/tmp/w")
    assert cli.rerun_command(argv, "experiments.maze.main") == (
        "python -m experiments.maze.main --config=experiments/maze/config.py:tiny --workdir=/tmp/w")
    assert cli.rerun_command(["run.py", "--workdir=/tmp/a b"], "") == "python run.py '--workdir=/tmp/a b'"


def test_pass_at_k_is_labelled_with_its_k():
    assert writers.format_pass_at_k((1, 2, 4), [0.5, 0.25, 1.0]) == "pass@1 0.500  pass@2 0.250  pass@4 1.000"
    with pytest.raises(ValueError, match=r"2 pass@k values for 3 ks \[1, 2, 4\]"):
        writers.format_pass_at_k((1, 2, 4), [0.5, 0.25])
    results = {"methods": {"uniform": {"pass_at_k": {"k": [1, 2], "mean": [0.0, 0.125]}}, "no_eval": {}}}
    assert comparison.pass_at_k_summary(results) == {"uniform": "pass@1 0.000  pass@2 0.125"}


def test_status_lines_print_without_a_tty(capsys):
    writers.status("seed 0: SFT, 4 steps")
    assert capsys.readouterr().out == "seed 0: SFT, 4 steps\n"


def test_absent_accelerators_keep_their_plugins_out():
    modules: dict = {}
    environ = {"JAX_PLATFORMS": "cpu", "TPU_LIBRARY_PATH": "/venv/libtpu/libtpu.so"}  # set by a parent JAX process
    kept_out = platforms.quiet_absent_accelerators(environ, modules, nvidia=False, tpu=False)
    assert set(kept_out) == {*platforms.CUDA_LIBRARIES, *platforms.CUDA_PJRT_PLUGINS, "libtpu", "TPU_LIBRARY_PATH"}
    assert all(modules[name] is None for name in (*platforms.CUDA_LIBRARIES, "libtpu"))  # their imports fail
    for name in platforms.CUDA_PJRT_PLUGINS:
        assert modules[name].initialize() is None  # JAX initialises the stand-in: it registers nothing
    assert environ == {"JAX_PLATFORMS": "cpu"}  # no platform is forced: JAX picks from what is left


def test_present_or_asked_for_accelerators_keep_their_plugins():
    modules: dict = {}
    assert platforms.quiet_absent_accelerators({}, modules, nvidia=True, tpu=True) == [] and modules == {}
    assert platforms.quiet_absent_accelerators({"JAX_PLATFORMS": "cuda,cpu"}, modules, nvidia=False, tpu=True) == []
    environ = {"JAX_PLATFORMS": "tpu", "TPU_LIBRARY_PATH": "/opt/libtpu.so"}
    assert platforms.quiet_absent_accelerators(environ, {}, nvidia=True, tpu=False) == []
    assert environ["TPU_LIBRARY_PATH"] == "/opt/libtpu.so"
    assert platforms.quiet_absent_accelerators({}, {"jax": object()}, nvidia=False, tpu=False) == []  # too late


def test_accelerator_probes(tmp_path):
    assert platforms.has_nvidia_device(exists=lambda path: path == "/dev/nvidiactl")
    assert not platforms.has_nvidia_device(exists=lambda path: False)
    (tmp_path / "0000:00:04.0").mkdir()
    (tmp_path / "0000:00:04.0" / "vendor").write_text("0x10de\n")  # an NVIDIA PCI device is no TPU
    assert not platforms.has_tpu(str(tmp_path))
    (tmp_path / "0000:00:05.0").mkdir()
    (tmp_path / "0000:00:05.0" / "vendor").write_text("0x1ae0\n")
    assert platforms.has_tpu(str(tmp_path))
