"""The maze's hard mix (``cpu_epochs_hard``): training and held-out sets chosen from pools by the start policy's
successes, a declared fraction of them hopeless for it."""

import json

import numpy as np
import pytest

from experiments.maze import config as config_lib
from experiments.maze import experiment as maze_experiment
from experiments.maze.task import MazeTask, hopeless_mix
from sera_jax.envs import maze
from sera_jax.train import sharding as sharding_lib


def test_the_mix_takes_the_first_of_each_kind_in_pool_order():
    successes = np.array([0, 3, 0, 0, 5, 1, 0])
    # Hopeless: positions 0, 2, 3, 6; others 1, 4, 5. Half of 4: the first two of each.
    assert hopeless_mix(successes, 4, 0.5, "x").tolist() == [0, 1, 2, 4]
    assert hopeless_mix(successes, 3, 1.0, "x").tolist() == [0, 2, 3]
    assert hopeless_mix(successes, 3, 0.0, "x").tolist() == [1, 4, 5]
    with pytest.raises(ValueError, match="held-out: 4 of 7 pool mazes have no success and 3 some"):
        hopeless_mix(successes, 6, 1 / 6, "held-out")  # 5 with some success needed


def test_an_easy_share_takes_the_most_solved_mazes_and_leaves_them_out_of_the_rest():
    successes = np.array([0, 3, 0, 9, 5, 1, 9, 2])
    # One hopeless (position 0), two the most solved (3 and 6, tied at 9: pool order), then the first others (1, 4).
    assert hopeless_mix(successes, 5, 0.2, "x", easy_fraction=0.4).tolist() == [0, 1, 3, 4, 6]
    assert hopeless_mix(successes, 3, 0.0, "x", easy_fraction=1 / 3).tolist() == [1, 3, 4]
    with pytest.raises(ValueError, match="a set of 8 with 1 hopeless and 3 the most solved needs a larger pool"):
        hopeless_mix(successes, 8, 1 / 8, "x", easy_fraction=3 / 8)  # 4 others needed, 3 left (1, 5 and 7)
    bad = config_lib.get_config("cpu_active_set")
    bad.maze.easy_fraction = 0.9
    with pytest.raises(ValueError, match=r"config.maze.easy_fraction=0.9: must be in \[0, 1 - maze.hard_fraction\]"):
        config_lib.validate_config(bad)


def test_the_variant_declares_a_quarter_or_more_hopeless_and_bad_fields_are_named():
    c = config_lib.get_config("cpu_epochs_hard")
    assert c.maze.hard_fraction >= 0.25 and c.maze.hard_samples >= c.sera.n_max and c.maze.num_train > 0
    for field, value, message in (("hard_fraction", 1.5, "must be in \\[0, 1\\]"),
                                  ("hard_samples", 0, "must be an int >= 1"),
                                  ("hard_pool_factor", 1, "must be an int >= 2")):
        bad = config_lib.get_config("cpu_epochs_hard")
        bad.maze[field] = value
        with pytest.raises(ValueError, match=f"config.maze.{field}.*{message}"):
            config_lib.validate_config(bad)


def test_the_start_policy_chooses_the_sets_once_and_a_resumed_run_reuses_the_choice(tmp_path):
    config = config_lib.get_config("tiny")
    config.maze.update(size=7, num_eval=2, num_train=4, hard_fraction=1.0, hard_samples=4, hard_pool_factor=2)
    task = maze_experiment.make_task(config)
    assert task.train_set.shape[0] == 8 and task.heldout.shape[0] == 4  # the pools
    pools = task.train_set.copy(), task.heldout.copy()
    model = maze_experiment.build_model(config, 0)  # untrained: no success on a 7x7 maze
    placement = sharding_lib.make_placement(config.mesh)
    summary = maze_experiment.select_hard_mix(config, task, model, 0, tmp_path, placement)
    counts = json.loads((tmp_path / "hard_mix.json").read_text())
    assert len(counts["train"]) == 8 and len(counts["heldout"]) == 4 and counts["samples"] == 4
    train = hopeless_mix(np.array(counts["train"]), 4, 1.0, "t")
    np.testing.assert_array_equal(task.train_set, pools[0][train])
    assert task.heldout.shape[0] == 2 and task.describe()["selection"] == summary
    assert summary["hard_fraction"] == 1.0 and summary["start_p_selected_mean"]["train"] == 0.0
    # Training and held-out mazes stay disjoint, and a second task chooses the same sets from the cache alone.
    assert not set(maze.fingerprints(task.train_set)) & set(maze.fingerprints(task.heldout))
    again = maze_experiment.make_task(config)
    assert maze_experiment.select_hard_mix(config, again, None, 0, tmp_path, placement) == summary
    np.testing.assert_array_equal(again.train_set, task.train_set)
    with pytest.raises(ValueError, match="chosen already"):
        again.select(train, np.arange(2), summary)
    # Counts cached for other pools (another hard_pool_factor) are refused, not read against these pools.
    (tmp_path / "hard_mix.json").write_text(json.dumps({**counts, "train": counts["train"][:6]}))
    with pytest.raises(ValueError, match="move the file away to count again"):
        maze_experiment.select_hard_mix(config, maze_experiment.make_task(config), None, 0, tmp_path, placement)


def test_a_pool_needs_generated_mazes_and_a_fixed_set():
    with pytest.raises(ValueError, match="hard_pool_factor=2: selecting mazes needs"):
        MazeTask(7, 2, num_train=0, pool_factor=2)
