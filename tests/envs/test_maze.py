"""Tests of the maze task: generation (perfect, distributed as MaxRL's Prim's, deterministic, split-disjoint),
BFS paths, MaxRL's vocabulary and text format, and MaxRL's reward, each against independent pure-Python
computations or hand-checked values."""

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


def judge_reference(grid: np.ndarray, tokens, length: int, rule: str = "maxrl") -> float:
    """MaxRL's ``judge_maze`` as docs/method.md §9 describes it, on the text a tokenizer decode with
    skip_special_tokens gives (then split on whitespace), with the two stricter rules for comparison."""
    size = grid.shape[0]
    words = " ".join(maze.TOKEN_NAMES[t] for t in list(tokens)[:length] if t not in maze.SPECIAL_TOKENS).split()
    if "DONE" not in words:
        return 0.0
    actions = words[: words.index("DONE")]
    if any(a not in ("UP", "DOWN", "LEFT", "RIGHT") for a in actions):
        return 0.0
    names = {"UP": maze.UP, "DOWN": maze.DOWN, "LEFT": maze.LEFT, "RIGHT": maze.RIGHT}
    pos, goal = (1, 1), (size - 2, size - 2)
    for a in actions:
        if pos == goal and rule == "maxrl":
            return 1.0  # the episode ended at the first arrival
        if pos == goal and rule == "end_at_goal":
            return 0.0
        d = MOVE_DELTA[names[a]]
        pos = (pos[0] + d[0], pos[1] + d[1])
        if not (0 <= pos[0] < size and 0 <= pos[1] < size) or not grid[pos]:
            return 0.0
    return float(pos == goal)


def edge_bits(grid: np.ndarray) -> tuple:
    """Open/closed state of every wall square between two neighbouring cells."""
    size = grid.shape[0]
    return tuple(
        int(grid[r, c]) for r in range(1, size - 1) for c in range(1, size - 1) if (r % 2) != (c % 2)
    )


def prim_reference(rng: random.Random, n: int) -> tuple:
    """MaxRL's Prim's as docs/method.md §9 describes it, one loop step per cell: carve (0, 0); a frontier list of
    uncarved cells next to the maze; remove a uniformly random frontier cell, join it to a uniformly random
    carved neighbour, add its uncarved neighbours not yet listed. Returns the grid's edge bits."""
    size = 2 * n + 1
    grid = np.zeros((size, size), np.int8)
    grid[1::2, 1::2] = 1

    def neighbours(cell):
        r, c = cell
        return [(r + dr, c + dc) for dr, dc in MOVE_DELTA.values() if 0 <= r + dr < n and 0 <= c + dc < n]

    carved = {(0, 0)}
    frontier = neighbours((0, 0))
    while frontier:
        cell = frontier.pop(rng.randrange(len(frontier)))
        parent = rng.choice([m for m in neighbours(cell) if m in carved])
        grid[cell[0] + parent[0] + 1, cell[1] + parent[1] + 1] = 1  # wall square between the two cells
        carved.add(cell)
        frontier += [m for m in neighbours(cell) if m not in carved and m not in frontier]
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


def test_distribution_matches_maxrl_prim():
    """The shortest-path formulation has the law of MaxRL's frontier-cell loop (3x3 cells: 192 mazes)."""
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


def test_path_lengths_match_maxrl_data(paths_by_size):
    """docs/method.md §9: over 1,500 17x17 mazes of MaxRL's generator the BFS path has 29.1 +- 2.1 moves (random edge
    weights give 30.5 +- 3.4). 1,024 mazes here: the mean's standard error is 0.07."""
    lengths = paths_by_size[17][1]
    assert abs(lengths.mean() - 29.1) < 0.3, lengths.mean()
    assert abs(lengths.std() - 2.1) < 0.3, lengths.std()
    assert lengths.min() >= 28  # (1, 1) -> (15, 15) needs 28 moves at least


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
    assert prompts.shape == (4, 310) == (4, maze.prompt_length(17))  # docs/method.md §9: 310 tokens at 17x17
    for grid, prompt in zip(grids, prompts):
        assert list(prompt[:2]) == [maze.BOS, maze.GRID_START]
        assert list(prompt[-2:]) == [maze.GRID_END, maze.PATH_START]
        rows = prompt[2:-2].reshape(17, 18)
        assert np.all(rows[:, -1] == maze.NEWLINE)
        assert rows[1, 1] == maze.START and rows[15, 15] == maze.GOAL
        assert np.sum(rows == maze.WALL) == np.sum(grid == 0)
        np.testing.assert_array_equal(maze.decode_prompt(prompt, 17), grid)
    text = maze.detokenize(prompts[0])
    assert text.startswith("<bos> GRID_START WALL") and text.count("\n") == 17
    assert text.endswith("NEWLINE\nGRID_END PATH_START")
    with pytest.raises(ValueError, match="prompt_T"):
        maze.decode_prompt(prompts[0][:-1], 17)


def words_of(grid, tail=""):
    """MaxRL's text of a grid (1 open), square by square: ``<bos> GRID_START``, rows of WALL / PATH / START /
    GOAL each closed by NEWLINE, ``GRID_END PATH_START``, then ``tail``."""
    size = grid.shape[0]
    squares = [["START" if (r, c) == (1, 1) else "GOAL" if (r, c) == (size - 2, size - 2)
                else "PATH" if grid[r, c] else "WALL" for c in range(size)] + ["NEWLINE"] for r in range(size)]
    return " ".join(["<bos>", "GRID_START"] + sum(squares, []) + ["GRID_END", "PATH_START"] + tail.split())


def test_text_prompts_parse_to_their_grids(mazes_by_size):
    for size in (7, 17):
        grids = mazes_by_size[size][:5]
        # Line breaks after each NEWLINE, as a file may hold them, read the same.
        texts = [words_of(g).replace("NEWLINE ", "NEWLINE\n") for g in grids]
        np.testing.assert_array_equal(maze.parse_prompt_texts(texts, size), grids)
    grids, answers = maze.parse_sequence_texts([words_of(mazes_by_size[7][0], "DOWN RIGHT DONE <eos>")], 7)
    np.testing.assert_array_equal(grids[0], mazes_by_size[7][0])
    np.testing.assert_array_equal(answers[0], [maze.DOWN, maze.RIGHT, maze.DONE, maze.EOS])
    assert maze.parse_sequence_texts([words_of(mazes_by_size[7][0])], 7)[1][0].size == 0
    assert maze.parse_prompt_texts([], 7).shape == (0, 7, 7)


def test_text_prompts_that_are_not_mazes_are_named(mazes_by_size):
    good = [words_of(g) for g in mazes_by_size[7][:3]]
    corner = mazes_by_size[7][2].copy()
    corner[2, 2] = 1  # an open square between four cells: not on the cell lattice
    cases = [
        (good[:2] + [good[2].replace(" START ", " PATH ", 1)], 2, "START must be at \\(1, 1\\)"),
        (good[:1] + [good[1] + " UP"], 1, "it has 61 words"),
        (good[:1] + [good[1].replace("WALL", "ROCK", 1)], 1, "'ROCK' is not a word of the maze vocabulary"),
        (good[:2] + [words_of(corner)], 2, "not a maze on the cell lattice"),
        ([words_of(mazes_by_size[9][0])], 0, "not a 7x7 maze prompt"),
    ]
    for texts, index, match in cases:
        with pytest.raises(maze.MazeTextError, match=match) as e:
            maze.parse_prompt_texts(texts, 7)
        assert e.value.index == index and str(e.value).startswith(f"text {index}: ")
    with pytest.raises(maze.MazeTextError, match="text 1: no PATH_START"):
        maze.parse_sequence_texts([good[0], good[1].replace("PATH_START", "")], 7)
    with pytest.raises(maze.MazeTextError, match="text 0: answer: 'NORTH' is not a word"):
        maze.parse_sequence_texts([good[0] + " NORTH DONE"], 7)


def test_in_chunks_pads_the_last_chunk_and_drops_it():
    x = np.arange(10)
    calls = []
    out = maze.in_chunks(lambda a: calls.append(a.shape) or a * 2, x, chunk=4)
    np.testing.assert_array_equal(out, x * 2)
    assert calls == [(4,), (4,), (4,)]


def test_vocabulary_is_maxrls():
    """The 32 ids of MaxRL's maze/ckpt-1500/tokenizer.json, written out by hand."""
    expected = (["<pad>", "<bos>", "<eos>", "<unk>", "GRID_START", "GRID_END", "PATH_START", "DONE", "PATH", "WALL",
                 "GOAL", "START", "NEWLINE", "UP", "DOWN", "LEFT", "RIGHT", "\n"]
                + [f"RESERVED_{i}" for i in range(14)])
    assert list(maze.TOKEN_NAMES) == expected and maze.VOCAB_SIZE == 32
    assert (maze.PAD, maze.BOS, maze.EOS, maze.GRID_START, maze.PATH_START, maze.DONE, maze.UP, maze.RIGHT) == \
        (0, 1, 2, 4, 6, 7, 13, 16)
    assert maze.STOP_TOKENS == (2, 7)  # generation_config.json: eos_token_id [2, 7]
    assert maze.response_length(17) == 180 and maze.answer_length(17) == 128


def test_tokenizer_json_encodes_the_rendered_text(mazes_by_size):
    """A Hugging Face tokenizer built from ``tokenizer_json`` reads MaxRL's text format back to our ids, and
    its decode with skip_special_tokens is the text MaxRL's judge reads."""
    import json

    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_str(json.dumps(maze.tokenizer_json()))
    maze.check_tokenizer_json(maze.tokenizer_json())
    prompt = np.asarray(maze.render_prompts(mazes_by_size[9][:1]))[0]
    answer = [maze.DOWN, maze.DOWN, maze.RIGHT, maze.DONE, maze.EOS]
    ids = prompt.tolist() + answer
    text = " ".join(maze.TOKEN_NAMES[t] for t in ids)
    assert tok.encode(text, add_special_tokens=False).ids == ids
    assert tok.decode(answer, skip_special_tokens=True) == "DOWN DOWN RIGHT DONE"
    bad = maze.tokenizer_json()
    bad["model"]["vocab"]["DONE"], bad["model"]["vocab"]["PATH"] = 8, 7
    with pytest.raises(ValueError, match=r"'DONE': 8 \(expected 7\)"):
        maze.check_tokenizer_json(bad)


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
    return jax.jit(maze.maze_rewards, static_argnames="rule")


def test_bfs_answers_score_one(mazes_by_size, paths_by_size, reward_jit):
    grids = jnp.asarray(mazes_by_size[17])
    answers, lengths = maze.encode_answers(*paths_by_size[17])
    np.testing.assert_array_equal(reward_jit(grids, answers, lengths), np.ones(CHUNK))
    # Without the trailing EOS (the sampler may stop at DONE) the answer is just as good.
    np.testing.assert_array_equal(reward_jit(grids, answers, lengths - 1), np.ones(CHUNK))


def _answer(tokens, width=40):
    return np.array(list(tokens) + [maze.PAD] * (width - len(tokens)), np.int32)


# A hand-made 7x7 perfect maze: one corridor snaking right, down, left, down, right to the goal (5, 5).
SNAKE = np.array([[0, 0, 0, 0, 0, 0, 0],
                  [0, 1, 1, 1, 1, 1, 0],
                  [0, 0, 0, 0, 0, 1, 0],
                  [0, 1, 1, 1, 1, 1, 0],
                  [0, 1, 0, 0, 0, 0, 0],
                  [0, 1, 1, 1, 1, 1, 0],
                  [0, 0, 0, 0, 0, 0, 0]], np.int8)
U, D, L, R, DONE = maze.UP, maze.DOWN, maze.LEFT, maze.RIGHT, maze.DONE
SNAKE_PATH = [R] * 4 + [D] * 2 + [L] * 4 + [D] * 2 + [R] * 4  # the shortest (and only simple) path

# name: (tokens, length or None for all, expected under "maxrl", "at_done", "end_at_goal"), checked by hand.
HAND_CASES = {
    "shortest path": (SNAKE_PATH + [DONE, maze.EOS], None, (1, 1, 1)),
    "shortest path, no EOS": (SNAKE_PATH + [DONE], None, (1, 1, 1)),
    "past the goal into a wall": (SNAKE_PATH + [R, DONE], None, (1, 0, 0)),
    "past the goal into a wall x3": (SNAKE_PATH + [U, U, U, DONE], None, (1, 0, 0)),
    "past the goal and stopping off it": (SNAKE_PATH + [L, DONE], None, (1, 0, 0)),
    "past the goal and back": (SNAKE_PATH + [L, R, DONE], None, (1, 1, 0)),
    "wall before the goal": (SNAKE_PATH[:9] + [D] + SNAKE_PATH[9:] + [DONE], None, (0, 0, 0)),
    "first move into a wall": ([D] + SNAKE_PATH + [DONE], None, (0, 0, 0)),
    "stops one short": (SNAKE_PATH[:-1] + [DONE], None, (0, 0, 0)),
    "no DONE": (SNAKE_PATH, None, (0, 0, 0)),
    "EOS instead of DONE": (SNAKE_PATH + [maze.EOS], None, (0, 0, 0)),
    "DONE cut by the length": (SNAKE_PATH + [DONE], len(SNAKE_PATH), (0, 0, 0)),
    "DONE first": ([DONE] + SNAKE_PATH, None, (0, 0, 0)),
    "empty": ([], None, (0, 0, 0)),
    "junk after DONE": (SNAKE_PATH + [DONE, maze.WALL, U, 18], None, (1, 1, 1)),
    "a grid word before DONE": (SNAKE_PATH + [maze.PATH, DONE], None, (0, 0, 0)),
    "a reserved word before DONE": (SNAKE_PATH[:3] + [18] + SNAKE_PATH[3:] + [DONE], None, (0, 0, 0)),
    "GRID_END before DONE": (SNAKE_PATH + [maze.GRID_END, DONE], None, (0, 0, 0)),
    # Detokenisation drops <pad> <bos> <eos> <unk>, and the whitespace split drops the word "\n".
    "special tokens inside": ([maze.BOS] + SNAKE_PATH[:5] + [maze.PAD, maze.EOS, maze.UNK, maze.LINE_BREAK]
                              + SNAKE_PATH[5:] + [DONE], None, (1, 1, 1)),
}


def test_reward_on_hand_checked_answers(reward_jit):
    names = list(HAND_CASES)
    grids = jnp.asarray(np.stack([SNAKE] * len(names)))
    answers = jnp.asarray(np.stack([_answer(HAND_CASES[k][0]) for k in names]))
    lengths = jnp.asarray([len(HAND_CASES[k][0]) if HAND_CASES[k][1] is None else HAND_CASES[k][1] for k in names])
    for column, rule in enumerate(maze.REWARD_RULES):
        got = np.asarray(reward_jit(grids, answers, lengths, rule=rule))
        for name, g in zip(names, got):
            assert g == HAND_CASES[name][2][column], f"{name} (rule={rule}): got {g}"
        ref = [judge_reference(SNAKE, a, int(n), rule) for a, n in zip(np.asarray(answers), np.asarray(lengths))]
        np.testing.assert_array_equal(got, ref)
    # The default is MaxRL's rule.
    np.testing.assert_array_equal(reward_jit(grids, answers, lengths), reward_jit(grids, answers, lengths, rule="maxrl"))
    with pytest.raises(ValueError, match="rule"):
        maze.maze_rewards(grids, answers, lengths, rule="strict")


def test_leaving_the_grid_fails():
    open_grid = np.ones((7, 7), np.int8)  # no border: a walker can step off the grid
    cases = [([U, U, DONE], 0.0), ([U, D, D, D, D, D, R, R, R, R, DONE], 1.0), ([D] * 4 + [R] * 4 + [DONE], 1.0)]
    got = maze.maze_rewards(jnp.asarray(np.stack([open_grid] * 3)), jnp.asarray(np.stack([_answer(c) for c, _ in cases])),
                            jnp.asarray([len(c) for c, _ in cases]))
    np.testing.assert_array_equal(got, [e for _, e in cases])


def test_a_shortest_path_then_extra_moves_scores_one(mazes_by_size, paths_by_size, reward_jit):
    """The issue's check: BFS path + 1-3 random extra moves + DONE scores 1 under MaxRL's rule on every maze,
    and 0 under "at_done" wherever the extra moves leave the goal."""
    rng = np.random.default_rng(1)
    grids = mazes_by_size[17][:200]
    moves, lens = paths_by_size[17][0][:200], paths_by_size[17][1][:200]
    answers = np.full((200, 64), maze.PAD, np.int32)
    lengths = np.zeros(200, np.int32)
    for i in range(200):
        extra = rng.choice(maze.MOVE_TOKENS, size=rng.integers(1, 4)).tolist()
        tokens = moves[i, : lens[i]].tolist() + extra + [DONE]
        answers[i, : len(tokens)], lengths[i] = tokens, len(tokens)
    maxrl = np.asarray(reward_jit(jnp.asarray(grids), jnp.asarray(answers), jnp.asarray(lengths)))
    at_done = np.asarray(reward_jit(jnp.asarray(grids), jnp.asarray(answers), jnp.asarray(lengths), rule="at_done"))
    np.testing.assert_array_equal(maxrl, np.ones(200))
    assert at_done.sum() < 20  # moving off the goal and coming back within 3 moves is rare
    np.testing.assert_array_equal(at_done, [judge_reference(g, a, int(n), "at_done")
                                            for g, a, n in zip(grids, answers, lengths)])


def test_reward_matches_reference_on_random_answers(mazes_by_size, paths_by_size, reward_jit):
    """Random answers (mostly moves, some DONE / special / other tokens; some BFS prefixes) vs the plain loop."""
    rng = np.random.default_rng(0)
    grids = mazes_by_size[7][:400]
    paths, lens = paths_by_size[7][0][:400], paths_by_size[7][1][:400]
    vocab = list(maze.MOVE_TOKENS) * 4 + [DONE, DONE, maze.PATH, maze.EOS, maze.PAD, maze.LINE_BREAK, 20]
    answers = rng.choice(vocab, size=(400, 24)).astype(np.int32)
    for i in range(0, 400, 2):  # half start with the BFS path, then noise
        answers[i, : lens[i]] = paths[i, : lens[i]]
        answers[i, lens[i]] = rng.choice([DONE, U, D])
    lengths = rng.integers(0, 25, 400)
    for rule in maze.REWARD_RULES:
        expected = [judge_reference(g, a, int(n), rule) for g, a, n in zip(grids, answers, lengths)]
        got = np.asarray(reward_jit(jnp.asarray(grids), jnp.asarray(answers), jnp.asarray(lengths), rule=rule))
        np.testing.assert_array_equal(got, expected, err_msg=rule)
        assert 20 < np.sum(expected) < 380  # both outcomes are exercised


def test_reward_jit_equals_no_jit():
    """One example, evaluated op by op under ``disable_jit`` and compiled; short answers keep it quick."""
    grid = jnp.asarray(SNAKE)
    for tokens in (SNAKE_PATH + [L, DONE], SNAKE_PATH[:3] + [D, DONE]):
        answer = jnp.asarray(_answer(tokens, 24))
        jitted = jax.jit(maze.maze_reward)(grid, answer, len(tokens))
        with jax.disable_jit():
            eager = maze.maze_reward(grid, answer, len(tokens))
        assert float(jitted) == float(eager) == judge_reference(SNAKE, tokens, len(tokens))
