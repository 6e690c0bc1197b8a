"""The maze experiment's ``paper`` variants: the SERA authors' settings, their data in verl's parquet layout (the
seed-42 draw, parsing, reward checks, refusals), the config's refusals, and ``paper_tiny`` end to end."""

import collections
import json
import random

import numpy as np
import pytest

from experiments.maze import config as config_lib
from experiments.maze import experiment as maze_main
from experiments.maze import task as task_lib
from sera_jax.envs import maze

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

SIZE = 5


def maxrl_words(grid, moves=()):
    """MaxRL's sequence for a grid (1 open) as text, written here square by square: ``<bos> GRID_START``, each
    row's WALL / PATH / START / GOAL then NEWLINE, ``GRID_END PATH_START``, then the moves and ``DONE <eos>``."""
    size = grid.shape[0]
    words = ["<bos>", "GRID_START"]
    for r in range(size):
        for c in range(size):
            words.append("START" if (r, c) == (1, 1) else "GOAL" if (r, c) == (size - 2, size - 2)
                         else "PATH" if grid[r, c] else "WALL")
        words.append("NEWLINE")
    words += ["GRID_END", "PATH_START"]
    if moves:
        words += list(moves) + ["DONE", "<eos>"]
    return " ".join(words)


STEPS = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}


def bfs_moves(grid):
    """A shortest path from (1, 1) to the goal of a grid (1 open) as move names, by plain breadth-first search;
    None when the goal is out of reach."""
    size = grid.shape[0]
    start, goal = (1, 1), (size - 2, size - 2)
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        here = queue.popleft()
        for name, (dr, dc) in STEPS.items():
            there = (here[0] + dr, here[1] + dc)
            if 0 <= there[0] < size and 0 <= there[1] < size and grid[there] and there not in parent:
                parent[there] = (here, name)
                queue.append(there)
    if goal not in parent:
        return None
    moves, at = [], goal
    while parent[at] is not None:
        at, name = parent[at]
        moves.append(name)
    return moves[::-1]


def authors_rows(grids, split="train"):
    """Rows in the layout of their parquet files (verl's: MaxRL's maze rows), with BFS paths as answers."""
    rows = []
    for i, grid in enumerate(grids):
        question, answer = maxrl_words(grid), maxrl_words(grid, bfs_moves(grid))
        rows.append({"data_source": "maze", "prompt": [{"role": "user", "content": question}], "ability": "maze",
                     "reward_model": {"style": "rule", "ground_truth": answer},
                     "extra_info": {"split": split, "index": i, "question": question, "answer": answer}})
    return rows


def write_parquet(path, rows, row_group_size=5):
    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=row_group_size)
    return str(path)


@pytest.fixture(scope="module")
def source_grids():
    """15 distinct 7x7 mazes from our generator (7x7 has 192 layouts; 5x5 only 4)."""
    return maze.make_heldout_set(7, 15, seed=9)


def test_loader_draws_their_rows_and_checks_them(tmp_path, source_grids):
    path = write_parquet(tmp_path / "train.parquet", authors_rows(source_grids))  # 3 row groups of 5
    grids, rows = task_lib.load_parquet_mazes(path, 7, num=8, seed=42)
    want = sorted(random.Random(42).sample(range(15), 8))  # maze/prepare_fixed_train.py's draw, restated
    assert rows.tolist() == want
    np.testing.assert_array_equal(grids, source_grids[want])
    # The loader scored each row's path with our reward (MaxRL's rule; a failing one is refused, below); the parsed
    # mazes are solvable by plain BFS.
    assert all(bfs_moves(grid) for grid in grids)
    # num = 0: every row in file order; a file of exactly num rows (their drawn file): all of it, in order.
    all_grids, all_rows = task_lib.load_parquet_mazes(path, 7)
    np.testing.assert_array_equal(all_grids, source_grids)
    assert all_rows.tolist() == list(range(15))
    drawn = write_parquet(tmp_path / "drawn.parquet", authors_rows(source_grids[want]))
    np.testing.assert_array_equal(task_lib.load_parquet_mazes(drawn, 7, num=8)[0], source_grids[want])


@pytest.mark.parametrize("change, match", [
    (lambda r: r.update(data_source="openai/gsm8k"), r"source row 3: data_source='openai/gsm8k' is not a maze"),
    (lambda r: r["prompt"][0].update(content=r["prompt"][0]["content"].replace(" START ", " PATH ", 1)),
     r"source row 3: prompt: text 3: not MaxRL's rendering"),
    (lambda r: r["prompt"][0].update(content=r["prompt"][0]["content"] + " UP"),
     rf"source row 3: prompt: .*it has {maze.prompt_length(SIZE) + 1} words"),
    (lambda r: r["prompt"][0].update(content=r["prompt"][0]["content"].replace("WALL", "TREE", 1)),
     r"source row 3: prompt: .*'TREE' is not a word of the maze vocabulary"),
    (lambda r: r["reward_model"].update(
        ground_truth=r["reward_model"]["ground_truth"].replace("PATH_START", "PATH_START UP")),  # into the wall
     r"source row 3: the path in reward_model.ground_truth does not solve its maze"),
    (lambda r: r["reward_model"].update(ground_truth=r["reward_model"]["ground_truth"].replace("PATH_START", "")),
     r"source row 3: reward_model.ground_truth: text 3: no PATH_START"),
])
def test_loader_names_the_bad_row(tmp_path, change, match):
    grids = maze.make_heldout_set(SIZE, 4, seed=0)
    rows = authors_rows(grids)
    change(rows[3])
    with pytest.raises(ValueError, match=match):
        task_lib.load_parquet_mazes(write_parquet(tmp_path / "bad.parquet", rows), SIZE)


def test_task_refuses_repeated_or_held_out_training_mazes(tmp_path, source_grids):
    repeated = write_parquet(tmp_path / "rep.parquet", authors_rows(source_grids[[0, 1, 2, 1]]))
    with pytest.raises(ValueError, match=r"repeats a maze"):
        task_lib.MazeTask(7, 2, seed=9, num_train=4, train_parquet=repeated)
    heldout = write_parquet(tmp_path / "eval.parquet", authors_rows(source_grids[:3]))
    train = write_parquet(tmp_path / "train.parquet", authors_rows(source_grids[2:8]))
    with pytest.raises(ValueError, match=r"source row 0 is a held-out maze"):
        task_lib.MazeTask(7, 3, num_train=6, train_parquet=train, eval_parquet=heldout)
    with pytest.raises(ValueError, match=r"holds 3 mazes, fewer than config.maze.num_eval=4"):
        task_lib.MazeTask(7, 4, num_train=6, train_parquet=train, eval_parquet=heldout)
    with pytest.raises(ValueError, match=r"cannot draw 7"):
        task_lib.MazeTask(7, 2, num_train=7, train_parquet=heldout)


@pytest.mark.parametrize("field, value, match", [
    ("maze.train_parquet", "/nowhere/train.parquet", r"config\.maze\.train_parquet='/nowhere/train.parquet': no such"),
    ("maze.eval_parquet", "/nowhere/test.parquet", r"config\.maze\.eval_parquet='/nowhere/test.parquet': no such"),
    ("maze.train_draw_seed", -1, r"config\.maze\.train_draw_seed=-1: must be an int >= 0"),
    ("eval.bootstrap_repeats", -5, r"config\.eval\.bootstrap_repeats=-5: must be an int >= 0"),
    ("eval.bootstrap_seed", 2**32, r"config\.eval\.bootstrap_seed=4294967296: must be an int in \[0, 2\^32 - 1\]"),
])
def test_bad_paper_fields_are_named_before_any_work(tmp_path, field, value, match):
    config = config_lib.get_config("paper_tiny")
    group, name = field.split(".")
    with config.unlocked():
        config[group][name] = value
    with pytest.raises(ValueError, match=match):
        maze_main.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_train_parquet_needs_a_fixed_set_size(tmp_path, source_grids):
    config = config_lib.get_config("paper_tiny")
    config.maze.train_parquet = write_parquet(tmp_path / "t.parquet", authors_rows(source_grids))
    config.maze.num_train = 0
    with pytest.raises(ValueError, match=r"config\.maze\.train_parquet=.* needs config\.maze\.num_train > 0"):
        config_lib.validate_config(config)


def test_paper_is_the_authors_run():
    c = config_lib.get_config("paper")
    assert (c.maze.size, c.maze.num_train, c.maze.num_eval, c.maze.train_draw_seed) == (17, 7_424, 256, 42)
    assert maze_main.MazeTask.response_cap(c) == 180 and c.model.preset == "maze_full" and c.model.init_dir == ""
    assert (c.rl.steps, c.rl.prompts_per_step, c.rl.rollouts_per_step) == (3_000, 256, 256 * 128)
    assert (c.rl.learning_rate, c.rl.b1, c.rl.b2, c.rl.weight_decay, c.rl.grad_clip) == (1e-4, 0.9, 0.999, 0.01, 1.0)
    assert c.methods == ("uniform", "sera") and c.sera.p_estimate == "epoch_history"
    assert config_lib.METHODS["sera"]["method"] == "sera"  # the registry's name: the released rule
    s = c.sera
    assert (s.n_min, s.n_max, s.activation_threshold, tuple(s.epoch_prior), s.epoch_discount) == (2, 512, 0.05,
                                                                                                   (0.5, 0.5), 0.75)
    assert (s.aggregation, s.loss_microbatch_rows) == ("token_mean_microbatch", 4_096)
    assert (c.eval.every, c.eval.samples_per_prompt, c.eval.temperature, c.eval.ks[-1]) == (250, 2_048, 1.0, 2_048)
    assert (c.eval.bootstrap_repeats, c.eval.bootstrap_seed, c.ckpt.every) == (1_000, 42, 250)
    assert tuple(c.mesh.shape) == (1, 4, 1)
    # 29 steps an epoch: 3,000 steps revisit each maze about 103 times.
    assert c.maze.num_train % c.rl.prompts_per_step == 0 and c.maze.num_train // c.rl.prompts_per_step == 29


def test_paper_tiny_end_to_end_on_the_authors_layout(tmp_path, source_grids):
    """paper_tiny from a MaxRL-layout checkpoint (no SFT) on parquet files in their layout: SERA with frozen
    per-epoch estimates (epoch 0 cold), their micro-batched token-mean, both pass@k estimators. SERA alone, to keep
    the test short: uniform runs the same calls (the tiny maze tests run it)."""
    from tests.experiments.test_maze_experiment import write_maxrl_style_checkpoint

    config = config_lib.get_config("paper_tiny")
    write_maxrl_style_checkpoint(tmp_path / "ckpt-1500")
    config.model.init_dir = str(tmp_path / "ckpt-1500")
    config.maze.train_parquet = write_parquet(tmp_path / "train.parquet", authors_rows(source_grids[:12]))
    config.maze.eval_parquet = write_parquet(tmp_path / "test.parquet", authors_rows(source_grids[12:]))
    config.methods = ("sera",)
    results = maze_main.run(config, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["results"]["task"]["train_mazes"] == 8 and saved["results"]["task"]["heldout_mazes"] == 2
    sera = results["methods"]["sera"]["history"][0]["steps"]
    assert [s["cold_start"] for s in sera] == [1.0, 1.0, 0.0]
    assert all(s["rollouts_sampled"] == config.rl.rollouts_per_step for s in sera)
    evaluation = results["methods"]["sera"]["curves"][0]["evaluations"][-1]
    assert evaluation["k"] == list(config.eval.ks)
    boot = evaluation["pass_at_k_bootstrap"]
    assert len(boot) == len(config.eval.ks) and boot[0] == pytest.approx(evaluation["pass_at_k"][0], abs=1e-12)
