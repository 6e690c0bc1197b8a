"""The maze experiment end to end on the tiny config: results layout, figures, resume, config errors."""

import json

import pytest

from experiments.maze import config as config_lib
from experiments.maze import experiment as maze_main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("maze")
    config = config_lib.get_config("tiny")
    return workdir, config, maze_main.run(config, workdir)


def test_results_layout(tiny_run):
    workdir, config, _ = tiny_run
    saved = json.loads((workdir / "results.json").read_text())
    methods = saved["results"]["methods"]
    assert set(methods) == set(config.methods)
    for entry in methods.values():
        assert entry["train_rollouts"] == [config.rl.steps * config.rl.rollouts_per_step]
        # The rows really sampled at each step (pilot included), as the step's metrics count them.
        assert [h["rollouts_sampled"] for h in entry["history"][0]["steps"]] == [config.rl.rollouts_per_step] * 2
        pk = entry["pass_at_k"]
        assert pk["k"] == list(config.eval.ks) and len(pk["mean"]) == len(pk["k"])
        assert all(0.0 <= v <= 1.0 for v in pk["mean"])
        assert "ci95" in pk  # None with a single seed
        assert len(entry["history"][0]["steps"]) == config.rl.steps
    assert saved["config"]["maze"]["size"] == config.maze.size
    assert (workdir / "pass_at_k.png").exists() and (workdir / "neg_log_pass_at_k.png").exists()


def test_rerun_resumes_instead_of_retraining(tiny_run):
    workdir, config, first = tiny_run
    again = maze_main.run(config, workdir)  # everything is checkpointed: nothing left to train
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert again["methods"][method]["history"] == first["methods"][method]["history"]


def test_a_killed_run_resumes_to_the_uninterrupted_result(tiny_run, tmp_path):
    _, config, first = tiny_run
    workdir = tmp_path / "killed"
    assert maze_main.run(config, workdir, stop_after=config.sft.steps + 1) is None  # mid-way through RL
    assert not (workdir / "results.json").exists()
    again = maze_main.run(config, workdir)
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert [h["loss"] for h in again["methods"][method]["history"][0]["steps"]] == \
            [h["loss"] for h in first["methods"][method]["history"][0]["steps"]]


def test_unknown_method_is_named(tmp_path):
    config = config_lib.get_config("tiny")
    with config.unlocked():
        config.methods = ("uniform", "ppo")
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        maze_main.run(config, tmp_path)


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="unknown variant 'huge'"):
        config_lib.get_config("huge")


def _snapshot(root):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_rerun_with_another_config_is_refused_and_changes_nothing(tiny_run):
    workdir, config, _ = tiny_run
    before = _snapshot(workdir)
    other = config_lib.get_config("tiny")
    other.model.ffn_dim = 64
    other.rl.learning_rate = 1e-3
    with pytest.raises(ValueError, match=r"(?s)different config.*model\.ffn_dim: workdir=32, now=64.*"
                                         r"rl\.learning_rate: workdir=0\.0003, now=0\.001"):
        maze_main.run(other, workdir)
    assert _snapshot(workdir) == before


def test_rerun_with_another_weight_decay_is_refused(tiny_run):
    workdir, _, _ = tiny_run
    other = config_lib.get_config("tiny")
    other.rl.weight_decay = 0.1
    with pytest.raises(ValueError, match=r"(?s)different config.*rl\.weight_decay: workdir=0\.0, now=0\.1"):
        maze_main.run(other, workdir)


def test_rows_that_do_not_split_over_the_devices_fail_before_any_work(tmp_path):
    import jax

    config = config_lib.get_config("tiny")
    config.eval.max_rollouts_per_call = 12  # 3 mazes x 4 samples per call
    if jax.device_count() % 4 == 0:  # the suite runs on 8 CPU devices (tests/conftest.py)
        with pytest.raises(ValueError, match=r"eval\.samples_per_prompt \(rows per call\)=12 must be a multiple"):
            maze_main.run(config, tmp_path / "w")
        assert not (tmp_path / "w").exists()
