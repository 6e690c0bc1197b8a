"""Tests of the maze task: generation (perfect, Prim-distributed, deterministic, split-disjoint), BFS paths,
text format and the reward, each against independent pure-Python computations."""

import collections
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from sera_jax.envs import maze

MOVE_DELTA = {maze.UP: (-1, 0), maze.DOWN: (1, 0), maze.LEFT: (0, -1), maze.RIGHT: (0, 1)}


# --- independent references ------------------------------------------------------------------------

def bfs_reference(grid: np.ndarray, start=(1, 1)) -> dict:
    """Plain BFS over open squares: distance from ``start`` to every reachable square."""
    dist = {start: 0}
    queue = collections.deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVE_DELTA.values():
            nb = (r + dr, c + dc)
            if 0 <= nb[0] < grid.shape[0] and 0 <= nb[1] < grid.shape[1] and grid[nb] and nb not in dist:
                dist[nb] = dist[(r, c)] + 1
                queue.append(nb)
    return dist


def reward_reference(grid: np.ndarray, tokens, length: int, stop_at_goal: bool = False) -> float:
    """The documented reward rule, written as a plain loop."""
    size = grid.shape[0]
    pos = (1, 1)
    for tok in list(tokens)[:length]:
        if tok == maze.DONE:
            return float(pos == (size - 2, size - 2))
        if tok not in MOVE_DELTA:
            return 0.0
        if stop_at_goal and pos == (size - 2, size - 2):
            return 0.0
        pos = (pos[0] + MOVE_DELTA[tok][0], pos[1] + MOVE_DELTA[tok][1])
        if not (0 <= pos[0] < size and 0 <= pos[1] < size) or not grid[pos]:
            return 0.0
    return 0.0


def edge_bits(grid: np.ndarray) -> tuple:
    """Open/closed state of every wall square between two neighbouring cells."""
    size = grid.shape[0]
    return tuple(
        int(grid[r, c]) for r in range(1, size - 1) for c in range(1, size - 1) if (r % 2) != (c % 2)
    )


def prim_reference(rng: random.Random, n: int) -> tuple:
    """Textbook randomised Prim's with a wall list (stale walls discarded), as edge bits of a grid."""
    size = 2 * n + 1
    grid = np.zeros((size, size), np.int8)
    grid[1::2, 1::2] = 1
    first = (rng.randrange(n), rng.randrange(n))
    visited = {first}

    def walls_of(cell):
        r, c = cell
        return [((r, c), (r + dr, c + dc)) for dr, dc in MOVE_DELTA.values() if 0 <= r + dr < n and 0 <= c + dc < n]

    walls = walls_of(first)
    while walls:
        a, b = walls.pop(rng.randrange(len(walls)))
        if (a in visited) != (b in visited):
            grid[a[0] + b[0] + 1, a[1] + b[1] + 1] = 1  # wall square between cells a and b
            new = b if a in visited else a
            visited.add(new)
            walls.extend(walls_of(new))
    return edge_bits(grid)


# --- generation ------------------------------------------------------------------------------------

CHUNK = 1024  # every generate_mazes call in this file uses this batch size: one compilation per size


def generate(seed, split, start, size):
    return np.asarray(maze.generate_mazes(maze.maze_keys(seed, split, np.arange(start, start + CHUNK)), size))


@pytest.fixture(scope="module")
def mazes_by_size():
    return {size: generate(0, "train", 0, size) for size in (7, 9, 17)}


@pytest.fixture(scope="module")
def paths_by_size(mazes_by_size):
    return {size: tuple(np.asarray(x) for x in maze.shortest_paths(jnp.asarray(mazes_by_size[size])))
            for size in (7, 17)}


@pytest.mark.parametrize("size", [7, 9, 17])
def test_mazes_are_perfect(mazes_by_size, size):
    n_cells = ((size - 1) // 2) ** 2
    grids = mazes_by_size[size]
    assert grids.shape == (CHUNK, size, size) and grids.dtype == np.int8
    assert np.all(grids[:, 1::2, 1::2] == 1), "every cell is open"
    assert np.all(grids[:, ::2, ::2] == 0), "corners between cells are walls"
    border = np.ones((size, size), bool)
    border[1:-1, 1:-1] = False
    assert not grids[:, border].any()
    np.testing.assert_array_equal(grids.sum(axis=(1, 2)) - n_cells, n_cells - 1)  # C - 1 passages
    for grid in grids[:64]:
        # Connected with C - 1 edges on C cells: a spanning tree.
        assert len(bfs_reference(grid)) == int(grid.sum())


def test_generation_is_deterministic_and_per_key(mazes_by_size):
    a = mazes_by_size[17]
    np.testing.assert_array_equal(generate(0, "train", 0, 17), a)
    # Maze i depends only on its key, not on its place in the batch.
    keys = maze.maze_keys(0, "train", np.arange(CHUNK))
    perm = np.random.default_rng(0).permutation(CHUNK)
    np.testing.assert_array_equal(np.asarray(maze.generate_mazes(keys[perm], 17)), a[perm])
    assert len(set(maze.fingerprints(a))) == CHUNK  # 17x17 mazes essentially never repeat
    assert not set(maze.fingerprints(generate(1, "train", 0, 17))) & set(maze.fingerprints(a))


def test_distribution_matches_textbook_prim():
    """The shortest-path-tree formulation has the law of list-based Prim's (3x3 cells: 192 mazes)."""
    jax_mazes = np.concatenate([generate(11, "train", start, 7) for start in range(0, 12 * CHUNK, CHUNK)])
    n_samples = len(jax_mazes)
    jax_counts = collections.Counter(edge_bits(g) for g in jax_mazes)
    rng = random.Random(5)
    ref_counts = collections.Counter(prim_reference(rng, 3) for _ in range(n_samples))
    keys = sorted(set(jax_counts) | set(ref_counts))
    assert len(keys) <= 192  # the 3x3 grid graph has 192 spanning trees
    table = np.array([[jax_counts[k] for k in keys], [ref_counts[k] for k in keys]])
    _, p_value, _, _ = scipy.stats.chi2_contingency(table)
    assert p_value > 1e-3, p_value
    # Prim's is far from uniform over spanning trees: a uniform law would fail this check.
    uniform = np.full(len(keys), n_samples / len(keys))
    assert scipy.stats.chisquare(table[0], uniform).pvalue < 1e-6


def test_fingerprints_identify_mazes(mazes_by_size):
    grids = mazes_by_size[7][:300]  # few 7x7 layouts exist, so there are many repeats
    fps = maze.fingerprints(grids)
    same = [(fps[i] == fps[j], np.array_equal(grids[i], grids[j])) for i in range(300) for j in range(i + 1, 300)]
    assert all(f == g for f, g in same)
    assert any(f for f, _ in same) and not all(f for f, _ in same)


def test_train_and_heldout_are_disjoint():
    for size, n_test in [(7, 32), (9, 64)]:
        test = maze.make_heldout_set(size, n_test, seed=1)
        test_fps = set(maze.fingerprints(test))
        assert len(test_fps) == n_test
        train, next_start = maze.make_train_mazes(size, 0, 300, exclude=test_fps, seed=1)
        assert train.shape == (300, size, size) and next_start >= 300
        assert not test_fps & set(maze.fingerprints(train))
        # Resuming from next_start continues the same stream.
        more, _ = maze.make_train_mazes(size, next_start, 5, exclude=test_fps, seed=1)
        both, _ = maze.make_train_mazes(size, 0, 305, exclude=test_fps, seed=1)
        np.testing.assert_array_equal(both[300:], more)
    # The raw key streams differ too.
    assert not set(maze.fingerprints(generate(0, "train", 0, 17))) & set(maze.fingerprints(generate(0, "test", 0, 17)))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="size"):
        maze.check_size(8)
    with pytest.raises(ValueError, match="split"):
        maze.maze_keys(0, "valid", np.arange(2))
    with pytest.raises(ValueError, match="count"):
        maze.make_heldout_set(7, 500)  # only 192 distinct 7x7 mazes exist


# --- shortest paths --------------------------------------------------------------------------------

def walk(grid, moves):
    pos = (1, 1)
    for m in moves:
        pos = (pos[0] + MOVE_DELTA[m][0], pos[1] + MOVE_DELTA[m][1])
        assert grid[pos], "path enters a wall"
    return pos


def test_bfs_paths_are_valid_and_shortest(mazes_by_size, paths_by_size):
    for size in (7, 17):
        moves_BxM, lengths_B = paths_by_size[size]
        assert moves_BxM.shape == (CHUNK, maze.max_moves(size))
        for grid, moves, length in list(zip(mazes_by_size[size], moves_BxM, lengths_B))[:32]:
            assert length == bfs_reference(grid)[(size - 2, size - 2)]
            assert walk(grid, moves[:length]) == (size - 2, size - 2)
            assert np.all(moves[length:] == maze.PAD)


def test_bfs_on_grids_with_loops():
    """Hand-made 7x7 rooms where shortest paths are not unique or not monotone."""
    open_room = np.pad(np.ones((5, 5), np.int8), 1)  # no inner walls: many shortest paths
    ring = open_room.copy()
    ring[2:5, 2:5] = 0  # two routes of equal length around a block
    snake = open_room.copy()
    snake[1:5, 2] = 0  # two staggered walls: the only route goes down, up and down again (16 moves)
    snake[2:6, 4] = 0
    walled = open_room.copy()
    walled[4, 1:6] = 0  # a full wall across the room: unreachable
    grids = jnp.asarray(np.stack([open_room, ring, snake, walled]))
    moves_BxM, lengths_B = (np.asarray(x) for x in maze.shortest_paths(grids))
    np.testing.assert_array_equal(lengths_B, [8, 8, 16, -1])
    for grid, moves, length in zip([open_room, ring, snake], moves_BxM, lengths_B):
        assert length == bfs_reference(grid)[(5, 5)]
        assert walk(grid, moves[:length]) == (5, 5)


# --- text format -----------------------------------------------------------------------------------

def test_prompt_rendering_round_trips(mazes_by_size):
    grids = mazes_by_size[17][:4]
    prompts = np.asarray(maze.render_prompts(grids))
    assert prompts.shape == (4, 308) == (4, maze.prompt_length(17))
    for grid, prompt in zip(grids, prompts):
        assert prompt[0] == maze.BOS and prompt[-1] == maze.SEP
        rows = prompt[1:-1].reshape(17, 18)
        assert np.all(rows[:, -1] == maze.NEWLINE)
        assert rows[1, 1] == maze.START and rows[15, 15] == maze.GOAL
        assert np.sum(rows == maze.WALL) == np.sum(grid == 0)
        np.testing.assert_array_equal(maze.decode_prompt(prompt, 17), grid)
    text = maze.detokenize(prompts[0])
    assert text.startswith("<bos> WALL") and text.count("\n") == 17 and text.endswith("SEP")
    with pytest.raises(ValueError, match="prompt_T"):
        maze.decode_prompt(prompts[0][:-1], 17)


def test_vocabulary_layout():
    assert maze.VOCAB_SIZE == len(maze.TOKEN_NAMES) == 32
    named = ["<pad>", "<bos>", "<eos>", "DONE", "PATH", "WALL", "GOAL", "START", "NEWLINE", "UP", "DOWN", "LEFT",
             "RIGHT"]
    assert list(maze.TOKEN_NAMES[:13]) == named


def test_encode_answers_layout():
    moves = jnp.array([[maze.DOWN, maze.RIGHT, maze.PAD], [maze.UP, maze.UP, maze.LEFT]])
    answers, lengths = maze.encode_answers(moves, jnp.array([2, 3]))
    np.testing.assert_array_equal(
        answers,
        [[maze.DOWN, maze.RIGHT, maze.DONE, maze.EOS, maze.PAD],
         [maze.UP, maze.UP, maze.LEFT, maze.DONE, maze.EOS]],
    )
    np.testing.assert_array_equal(lengths, [4, 5])
    assert maze.decode_answer(answers[0]) == ["DOWN", "RIGHT", "DONE"]


# --- reward ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reward_jit():
    return jax.jit(maze.maze_rewards, static_argnames="stop_at_goal")


def test_bfs_answers_score_one(mazes_by_size, paths_by_size, reward_jit):
    grids = jnp.asarray(mazes_by_size[17])
    answers, lengths = maze.encode_answers(*paths_by_size[17])
    np.testing.assert_array_equal(reward_jit(grids, answers, lengths), np.ones(CHUNK))
    # Without the trailing EOS (the sampler may stop at DONE) the answer is just as good.
    np.testing.assert_array_equal(reward_jit(grids, answers, lengths - 1), np.ones(CHUNK))


def _answer(tokens, width=40):
    return np.array(list(tokens) + [maze.PAD] * (width - len(tokens)), np.int32)


def test_reward_failure_cases(mazes_by_size, paths_by_size, reward_jit):
    index = int(np.argmax(paths_by_size[7][1]))  # the longest path among the 7x7 mazes
    grid = mazes_by_size[7][index]
    path = [int(m) for m in paths_by_size[7][0][index][: paths_by_size[7][1][index]]]
    first_wall = next(m for m in MOVE_DELTA if not grid[1 + MOVE_DELTA[m][0], 1 + MOVE_DELTA[m][1]])
    back = {maze.UP: maze.DOWN, maze.DOWN: maze.UP, maze.LEFT: maze.RIGHT, maze.RIGHT: maze.LEFT}
    open_grid = np.ones((7, 7), np.int8)  # no border: a walker can leave the grid
    cases = {  # name: (grid, tokens, length, expected, expected with stop_at_goal)
        "bfs": (grid, path + [maze.DONE, maze.EOS], None, 1, 1),
        "junk after DONE": (grid, path + [maze.DONE, maze.WALL, maze.UP, maze.UP], None, 1, 1),
        "wall hit": (grid, [first_wall] + path + [maze.DONE], None, 0, 0),
        "malformed": (grid, path[:2] + [maze.PATH] + path[2:] + [maze.DONE], None, 0, 0),
        "eos instead of DONE": (grid, path + [maze.EOS], None, 0, 0),
        "no DONE": (grid, path, None, 0, 0),
        "DONE cut by length": (grid, path + [maze.DONE], len(path), 0, 0),
        "DONE early": (grid, path[:-1] + [maze.DONE], None, 0, 0),
        "detour through goal": (grid, path + [back[path[-1]], path[-1], maze.DONE], None, 1, 0),
        "empty": (grid, [], None, 0, 0),
        "leave grid": (open_grid, [maze.UP, maze.UP, maze.DONE], None, 0, 0),
        "open grid ok": (open_grid, [maze.DOWN] * 4 + [maze.RIGHT] * 4 + [maze.DONE], None, 1, 1),
    }
    grids = jnp.asarray(np.stack([c[0] for c in cases.values()]))
    answers = jnp.asarray(np.stack([_answer(c[1]) for c in cases.values()]))
    lengths = jnp.asarray([len(c[1]) if c[2] is None else c[2] for c in cases.values()])
    for stop_at_goal, column in [(False, 3), (True, 4)]:
        got = np.asarray(reward_jit(grids, answers, lengths, stop_at_goal=stop_at_goal))
        expected = np.array([c[column] for c in cases.values()], np.float32)
        for name, g, e in zip(cases, got, expected):
            assert g == e, f"{name} (stop_at_goal={stop_at_goal}): got {g}, expected {e}"
        ref = [reward_reference(np.asarray(gr), a, int(n), stop_at_goal)
               for gr, a, n in zip(grids, np.asarray(answers), np.asarray(lengths))]
        np.testing.assert_array_equal(got, ref)


def test_reward_matches_reference_on_random_answers(mazes_by_size, paths_by_size, reward_jit):
    """Random answers (mostly moves, some DONE/other tokens; some BFS prefixes) vs the plain-loop rule."""
    rng = np.random.default_rng(0)
    grids = mazes_by_size[7][:400]
    paths, lens = paths_by_size[7][0][:400], paths_by_size[7][1][:400]
    vocab = [maze.UP, maze.DOWN, maze.LEFT, maze.RIGHT] * 4 + [maze.DONE, maze.DONE, maze.PATH, maze.EOS]
    answers = rng.choice(vocab, size=(400, 20)).astype(np.int32)
    for i in range(0, 400, 2):  # half start with the BFS path, then noise
        answers[i, : lens[i]] = paths[i, : lens[i]]
        answers[i, lens[i]] = rng.choice([maze.DONE, maze.UP, maze.DOWN])
    lengths = rng.integers(0, 21, 400)
    expected = [reward_reference(g, a, int(n)) for g, a, n in zip(grids, answers, lengths)]
    got = np.asarray(reward_jit(jnp.asarray(grids), jnp.asarray(answers), jnp.asarray(lengths)))
    np.testing.assert_array_equal(got, expected)
    assert 20 < np.sum(expected) < 380  # both outcomes are exercised


def test_reward_jit_equals_no_jit(mazes_by_size, paths_by_size):
    """One example, evaluated op by op under ``disable_jit`` and compiled; short answers keep it quick."""
    grid = jnp.asarray(mazes_by_size[7][0])
    path = paths_by_size[7][0][0]
    broken = np.array([path[0], maze.LEFT, *path[1:4]], np.int32)
    for answer, length in [(np.array([*path[:8], maze.DONE], np.int32), int(paths_by_size[7][1][0]) + 1),
                           (broken, 5)]:
        answer = jnp.asarray(np.pad(answer, (0, 12 - len(answer))))  # same shape: one compilation
        jitted = jax.jit(maze.maze_reward)(grid, answer, length)
        with jax.disable_jit():
            eager = maze.maze_reward(grid, answer, length)
        assert float(jitted) == float(eager) == reward_reference(np.asarray(grid), np.asarray(answer), length)
