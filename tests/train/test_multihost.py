"""Multi-host for real: the tiny maze RL job as two JAX processes on this machine, each with 4 fake CPU devices.

The processes join through the TPU-pod launcher's path: ``--multihost`` with ``SERA_COORDINATOR`` (localhost, a free
port), ``SERA_NUM_PROCESSES`` and ``SERA_PROCESS_ID`` -> ``cli.make_main`` -> ``distributed.maybe_initialize_distributed``
-> ``jax.distributed.initialize``; cross-process collectives are gloo's (``jax_cpu_collectives_implementation``).
Each process runs ``python -m experiments.maze.main --config=experiments/maze/config.py:tiny --workdir=DIR
--multihost``, the command ``scripts/launch_tpu_pod.sh`` ends with; the script itself is not called because it
pip-installs ``jax[tpu]`` first.

The two-process job is killed mid-run (``--stop_after``: after SFT and one RL step) and restarted; the restarted
job's ``results.json`` must equal an uninterrupted one-process run's (this pytest process, conftest's 8 devices). The
killed launch runs the uninterrupted path (SFT trained and saved from process-local arrays, evaluation at step 0,
RL step 0 from the fresh state, its checkpoint); the restart runs the resume path (SFT and RL restored onto the
two-process mesh, RL step 1, the last evaluation, results). Both launches' metrics end up in ``results.json``.

What must match: the global mesh has 8 devices either way (2 processes x 4, or 1 x 8), so every device runs the same
program on the same rows, and only the cross-device sums of the update (loss and gradient reductions: gloo's order
vs one process's) may differ in the last float bits. Sampling does not depend on the layout (partitionable
threefry); rewards, allocations and pass@k are counts, so they must be equal, and the per-step float metrics
(losses, gradient norms, scale factors) equal to float tolerance. SFT runs on every process's own device.

The overrides give the policy enough SFT to earn rewards (so the update and its losses are not all zero) and keep
one method (SERA with pilot estimates: pilot sampling, allocation, main sampling, scoring, update, evaluation).
pass@k on the two held-out 5x5 mazes is 0 at this scale; the training steps' rewards are not.

Cost: about 130 CPU-seconds in all, most of it compilation (JAX writes its persistent compilation cache from
process 0 only, and process 1 finds none of its programs there, so it compiles all of them at every launch).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import chex
import jax
import pytest

from experiments.maze import config as config_lib
from experiments.maze import experiment as maze_experiment
from sera_jax.train import plan

REPO = pathlib.Path(__file__).resolve().parents[2]
SFT_STEPS, SFT_LEARNING_RATE = 30, 0.05
OVERRIDES = ("--config.methods=('sera',)", f"--config.sft.steps={SFT_STEPS}",
             f"--config.sft.learning_rate={SFT_LEARNING_RATE}")
DEVICES = 8  # of the global mesh: NUM_PROCESSES x DEVICES_PER_PROCESS, and of the one-process reference
NUM_PROCESSES = 2
LAUNCH_TIMEOUT_S = 300  # per launch, a safety net (a launch takes 30-80 s): then its processes are killed
TIMING = re.compile(r"^(step_seconds|time_share/)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _child_env(num_devices: int, process_id: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = plan.with_host_device_count(env.get("XLA_FLAGS", ""), num_devices)
    env.update(JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", PYTHONUNBUFFERED="1",
               # Every program the first launch compiles is reused by the later ones (the resume).
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.update(SERA_COORDINATOR=f"localhost:{port}", SERA_NUM_PROCESSES=str(NUM_PROCESSES),
               SERA_PROCESS_ID=str(process_id))
    return env


def _tail(path: pathlib.Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return text[-chars:]


def run_processes(args: list[str], logs: pathlib.Path, devices_per_process: int) -> None:
    """Runs ``python ARGS`` as ``NUM_PROCESSES`` processes of one job (``SERA_*`` set, a fresh port) and waits for
    all of them; any failure (a non-zero exit, the timeout) kills the others and fails with every process's log."""
    command = [sys.executable, *args]
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    paths = [logs / f"process_{i}.log" for i in range(NUM_PROCESSES)]
    procs: list[subprocess.Popen] = []
    try:
        for i, path in enumerate(paths):
            with open(path, "w") as log:
                procs.append(subprocess.Popen(command, cwd=REPO, env=_child_env(devices_per_process, i, port),
                                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"process {failed[0]} exited with {procs[failed[0]].returncode}" if failed else \
                    f"timed out after {LAUNCH_TIMEOUT_S} s"
                pytest.fail(f"{' '.join(command)}: {why}\n" + "\n".join(
                    f"--- process {i} ---\n{_tail(p)}" for i, p in enumerate(paths)))
            time.sleep(0.2)
        codes = [p.returncode for p in procs]
        assert codes == [0] * len(procs), f"exit codes {codes}\n" + "\n".join(
            f"--- process {i} ---\n{_tail(p)}" for i, p in enumerate(paths))
    finally:
        for p in procs:  # only the processes started here, by their handle
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def launch(workdir: pathlib.Path, logs: pathlib.Path, extra: tuple[str, ...] = ()) -> None:
    """The maze command on every process of a two-process job, each with its share of the ``DEVICES``."""
    run_processes(["-m", "experiments.maze.main", "--config=experiments/maze/config.py:tiny", f"--workdir={workdir}",
                   "--multihost", *OVERRIDES, *extra], logs, DEVICES // NUM_PROCESSES)


def load_results(workdir: pathlib.Path) -> dict:
    return json.loads((workdir / "results.json").read_text())


def assert_same_results(got: dict, want: dict) -> None:
    """Equal pass@k and evaluations, train rollouts and config; per-step metrics (losses, rewards, allocation)
    equal to float tolerance; wall-clock timings left out."""
    assert got["config"] == want["config"]
    assert got["results"]["sft_final_loss"] == pytest.approx(want["results"]["sft_final_loss"], rel=1e-6)
    assert set(got["results"]["methods"]) == set(want["results"]["methods"])
    for method, w in want["results"]["methods"].items():
        g = got["results"]["methods"][method]
        assert g["pass_at_k"] == w["pass_at_k"], method
        assert g["curves"] == w["curves"], method  # every evaluation: pass@k, solved fraction, quantiles
        assert g["train_rollouts"] == w["train_rollouts"], method
        steps = [[{k: v for k, v in s.items() if not TIMING.match(k)} for s in h["steps"]]
                 for h in (g["history"][0], w["history"][0])]
        assert len(steps[0]) == len(steps[1]) == want["config"]["rl"]["steps"]
        for got_step, want_step in zip(*steps):
            assert got_step.keys() == want_step.keys()
            for key in ("reward_mean", "prompts_solved_frac", "counts_min", "counts_max", "rollouts_sampled"):
                assert got_step[key] == want_step[key], (method, got_step["step"], key)
        chex.assert_trees_all_close(steps[0], steps[1], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The same config run uninterrupted in this (one) process, on its 8 devices (tests/conftest.py)."""
    assert jax.process_count() == 1 and jax.device_count() == DEVICES
    workdir = tmp_path_factory.mktemp("one_process")
    config = config_lib.get_config("tiny")
    config.methods, config.sft.steps, config.sft.learning_rate = ("sera",), SFT_STEPS, SFT_LEARNING_RATE
    maze_experiment.run(config, workdir)
    results = load_results(workdir)
    # The comparison means something only if the policy earned rewards, so its updates and losses are not zero.
    steps = results["results"]["methods"]["sera"]["history"][0]["steps"]
    assert any(s["reward_mean"] > 0 for s in steps) and any(s["loss"] != 0 for s in steps), steps
    return results


def test_two_processes_killed_and_restarted_match_one_process(reference, tmp_path):
    workdir = tmp_path / "run"
    # The simulated kill: both processes stop after SFT and one RL step, as a kill would (nothing saved after the
    # RL checkpoint of step 1).
    launch(workdir, tmp_path / "logs_killed", extra=(f"--stop_after={SFT_STEPS + 1}",))
    assert not (workdir / "results.json").exists()
    assert sorted(p.name for p in (workdir / "seed_0" / "sera" / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
    assert (workdir / "seed_0" / "sft" / "checkpoints" / str(SFT_STEPS)).is_dir()
    # Process 0 alone writes the workdir's own files, the others wait for it (claim_workdir): no leftovers.
    assert json.loads((workdir / "config_fingerprint.json").read_text())["sft.steps"] == SFT_STEPS
    assert [p.name for p in workdir.iterdir() if p.name.startswith(".")] == []

    # The restart restores SFT (saved from process-local arrays) and RL step 1 onto the two-process mesh; its
    # results.json (with the killed launch's metrics and evaluation carried over in the checkpoint) must equal
    # the uninterrupted one-process run's.
    launch(workdir, tmp_path / "logs_resumed")
    assert_same_results(load_results(workdir), reference)


def test_checkpoints_reads_and_workdir_with_one_device_per_process(tmp_path):
    """One device per process (one process per GPU): ``tests/train/multihost_worker.py`` on both processes."""
    run_processes(["-m", "tests.train.multihost_worker", str(tmp_path / "run")], tmp_path / "logs", 1)
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("done_")) == ["done_0", "done_1"]
