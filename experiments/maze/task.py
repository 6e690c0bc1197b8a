"""The maze task as an ``RLTask`` for the trainer, and its SFT data (BFS shortest paths). Rewards are
``maze.maze_rewards`` with its default, MaxRL's rule (success at the first arrival on the goal).

Training mazes come from an endless stream (``num_train=0``: a step's mazes are a pure function of the step,
none ever recurs) or from a fixed set of the stream's first ``num_train`` mazes, revisited in epochs as SERA's
7,424 17x17 mazes are (the history estimator and the selection peers need prompts that recur), or from a local
copy of the SERA authors' data (``train_parquet``, ``eval_parquet``: ``load_parquet_mazes``)."""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from sera_jax.data import parquet
from sera_jax.envs import maze
from sera_jax.rl.sft import SFTBatch
from sera_jax.rl.task import PromptBatch, SampleOutput
from sera_jax.train import config_utils
from sera_jax.train.distributed import host_array


@jax.jit
def _rewards(grids_PxGxG, prompt_ids_B, tokens_BxR, lengths_B):
    """Rewards of the flat batch: each rollout is scored on its own prompt's maze."""
    return maze.maze_rewards(grids_PxGxG[prompt_ids_B], tokens_BxR, lengths_B)


_answer_rewards = jax.jit(maze.maze_rewards)  # one answer per maze (a data file's ground-truth paths)


def check_num_train(num_train) -> int:
    """``num_train`` (``config.maze.num_train``) if it is an int >= 0 (0: the endless stream), else ValueError
    naming the field."""
    if not config_utils.is_int(num_train) or num_train < 0:
        raise ValueError(f"config.maze.num_train={num_train!r}: must be an int >= 0 (0: an endless stream of "
                         "training mazes; M > 0: a fixed set of M mazes revisited in epochs)")
    return num_train


# -- the SERA authors' data: verl parquet files -------------------------------------------------------------------
#
# Their maze data (Hugging Face dataset capybaraczh/SERA-Maze-17x17, MaxRL's maze rows) in verl's parquet layout, as
# their trainer reads it (ChenZihao0121/SERA @ 3252ed5, verl/utils/dataset/rl_dataset.py with
# data.apply_chat_template=False, verl/utils/reward_score/maze.py via MaxRL): ``prompt`` a list of chat messages whose
# contents, joined, are the prompt text ("<bos> GRID_START ... GRID_END PATH_START"); ``reward_model.ground_truth``
# the whole sequence, the grid of which judge_maze scores against; ``data_source`` starting with "maze" (their reward
# routing). Other columns are not read (``extra_info.index``, their history estimator's key, is the source row; ours
# is the maze's position in the draw, which is in source order: the same keys up to their order).
PARQUET_COLUMNS = ("prompt", "reward_model", "data_source")
AUTHORS_DRAW_SEED = 42  # maze/prepare_fixed_train.py --seed (default 42; the fixed_train7424_seed42 of maze_17.sh)


def authors_draw(num_rows: int, num: int, seed: int = AUTHORS_DRAW_SEED) -> np.ndarray:
    """The SERA authors' fixed training set: ``num`` of ``num_rows`` source rows without replacement, in source
    order, ``sorted(random.Random(seed).sample(range(num_rows), num))`` (maze/prepare_fixed_train.py). The same
    generator (Python's own Mersenne Twister and ``sample``), so the same rows as theirs from the same source file;
    a file of exactly ``num`` rows (their drawn ``train.parquet``) gives all its rows, in order."""
    if not config_utils.is_int(num) or not 1 <= num <= num_rows:
        raise ValueError(f"cannot draw {num!r} rows from {num_rows}")
    return np.array(sorted(random.Random(seed).sample(range(num_rows), num)), np.int64)


def read_parquet_rows(path: str, indices: Optional[np.ndarray] = None) -> tuple[list[dict[str, Any]], int]:
    """Rows of a parquet file as dicts of the ``PARQUET_COLUMNS`` it has: all in file order (``indices`` None) or
    the sorted ``indices``, reading only the row groups that hold one (as their prepare script does). Returns them
    with the file's row count; ValueError if the file has no ``prompt`` column."""
    names, num_rows = parquet.parquet_layout(path)
    if "prompt" not in names:
        raise ValueError(f"{path}: no 'prompt' column (columns {names}); expected verl's parquet layout")
    columns = [c for c in PARQUET_COLUMNS if c in names]
    return parquet.read_parquet(path, columns, indices), num_rows


def prompt_text(prompt: Any) -> str:
    """A row's prompt as text: the contents of its chat messages joined (their RLHFDataset without a chat
    template), or the string itself; ValueError for anything else."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) for m in prompt):
        raise ValueError(f"prompt must be a list of chat messages or a string, got {type(prompt).__name__}")
    return "".join(str(message.get("content") or "") for message in prompt)


def mazes_from_rows(rows: list[dict[str, Any]], size: int, source_rows: np.ndarray, path: str) -> np.ndarray:
    """The grids ``(M, G, G)`` of parquet rows, each checked (ValueError naming ``path`` and the source row): a
    ``data_source`` (when the column is there) starting with "maze"; a prompt that is MaxRL's rendering of a
    ``size`` x ``size`` maze on the cell lattice; a ground truth (when there) of the same maze whose path, if it
    has one, scores 1 under our reward (``maze.maze_rewards``, MaxRL's rule); and a goal reachable from the
    start (BFS)."""
    def fail(i: int, what: str):
        raise ValueError(f"{path}: source row {int(source_rows[i])}: {what}")

    texts = []
    for i, row in enumerate(rows):
        source = row.get("data_source")
        if source is not None and not str(source).startswith("maze"):
            fail(i, f"data_source={source!r} is not a maze row (their reward routing needs 'maze...')")
        try:
            texts.append(prompt_text(row["prompt"]))
        except ValueError as e:
            fail(i, str(e))
    try:
        grids = maze.parse_prompt_texts(texts, size)
    except maze.MazeTextError as e:
        fail(e.index, f"prompt: {e}")
    truths = [(row.get("reward_model") or {}).get("ground_truth") for row in rows]
    have = [i for i, t in enumerate(truths) if t]
    if have:
        try:
            truth_grids, answers = maze.parse_sequence_texts([truths[i] for i in have], size)
        except maze.MazeTextError as e:
            fail(have[e.index], f"reward_model.ground_truth: {e}")
        differ = np.any(truth_grids != grids[have], axis=(1, 2))
        if differ.any():
            fail(have[int(np.argmax(differ))], "reward_model.ground_truth holds another maze than the prompt")
        solved = [j for j, a in enumerate(answers) if a.size]
        if solved:
            # One compiled width per size for shortest-path answers (moves, DONE, <eos>), longer ones rounded up.
            width = max([maze.answer_length(size)] + [-(-answers[j].size // 64) * 64 for j in solved])
            answers_BxR = np.full((len(solved), width), maze.PAD, np.int32)
            for row, j in enumerate(solved):
                answers_BxR[row, :answers[j].size] = answers[j]
            lengths = np.array([answers[j].size for j in solved], np.int32)
            rewards = maze.in_chunks(_answer_rewards, truth_grids[solved], answers_BxR, lengths)
            if np.any(rewards != 1):
                fail(have[solved[int(np.argmax(rewards != 1))]],
                     "the path in reward_model.ground_truth does not solve its maze under MaxRL's reward")
    unsolvable = maze.in_chunks(lambda g: maze.shortest_paths(g)[1], grids) < 0
    if unsolvable.any():
        fail(int(np.argmax(unsolvable)), "the goal cannot be reached from the start")
    return grids


def load_parquet_mazes(path: str, size: int, num: int = 0,
                       seed: int = AUTHORS_DRAW_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Mazes of a parquet file in the authors' layout and the source rows they come from: every row in file order
    (``num=0``), or the authors' draw of ``num`` rows (``authors_draw``). ValueError naming the file for too few
    rows or a row that fails ``mazes_from_rows``."""
    path = os.path.expanduser(path)
    if num:
        _, num_rows = parquet.parquet_layout(path)
        if num > num_rows:
            raise ValueError(f"{path} has {num_rows} rows; cannot draw {num}")
        indices = authors_draw(num_rows, num, seed)
        rows, _ = read_parquet_rows(path, indices)
    else:
        rows, num_rows = read_parquet_rows(path)
        indices = np.arange(num_rows)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return mazes_from_rows(rows, size, indices, path), indices


def _check_distinct(grids: np.ndarray, what: str) -> None:
    prints = maze.fingerprints(grids)
    if len(set(prints)) != len(prints):
        first = next(i for i, fp in enumerate(prints) if prints.index(fp) != i)
        raise ValueError(f"{what} repeats a maze (index {first} equals index {prints.index(prints[first])}); their "
                         "prepare script refuses such a sample: deduplicate the source or draw with another seed")


def hopeless_mix(successes_N: np.ndarray, count: int, fraction: float, what: str,
                 easy_fraction: float = 0.0) -> np.ndarray:
    """Positions in a pool of ``count`` mazes, ``round(fraction * count)`` of them hopeless for the policy the counts
    came from (no success in its samples), ``round(easy_fraction * count)`` the pool's most solved ones (ties in pool
    order) and the rest neither, each the first of its kind in pool order, returned in pool order; ValueError naming
    ``what`` when the pool holds too few of any kind."""
    successes_N = np.asarray(successes_N)
    num_hard, num_easy = int(round(fraction * count)), int(round(easy_fraction * count))
    by_successes = np.argsort(-successes_N, kind="stable")
    easy = np.sort(by_successes[:num_easy]) if num_easy else np.zeros(0, int)
    hopeless = np.flatnonzero(successes_N == 0)
    other = np.setdiff1d(np.flatnonzero(successes_N > 0), easy)
    num_other = count - num_hard - num_easy
    if len(hopeless) < num_hard or len(other) < num_other or (num_easy and successes_N[easy].min() == 0):
        kinds = f"{len(hopeless)} of {len(successes_N)} pool mazes have no success and {len(other) + len(easy)} some"
        easy_part = f" and {num_easy} the most solved" if num_easy else ""
        raise ValueError(f"{what}: {kinds}; a set of {count} with {num_hard} hopeless{easy_part} needs a larger pool "
                         "(config.maze.hard_pool_factor) or another config.maze.hard_fraction")
    return np.sort(np.concatenate([hopeless[:num_hard], easy, other[:num_other]])).astype(int)


class MazeTask:
    """Training mazes, endless (``num_train=0``: a pure function of the step) or a fixed set of ``num_train``
    revisited in epochs, and a fixed held-out set disjoint from them."""

    stop_tokens = maze.STOP_TOKENS  # <eos> and DONE, as MaxRL's generation_config.json
    pad_id = maze.PAD
    knows_success_rates = False  # p of a maze under the policy is unknown: sera.p_estimate="oracle" is refused

    def __init__(self, size: int, num_eval: int, seed: int = 0, max_new_tokens: int = 0, num_train: int = 0,
                 train_parquet: str = "", draw_seed: int = AUTHORS_DRAW_SEED, eval_parquet: str = "",
                 pool_factor: int = 1):
        self.size, self.seed = maze.check_size(size), seed
        # pool_factor > 1: the held-out set and the fixed training set are candidate pools of pool_factor times their
        # sizes until ``select`` keeps num_eval and num_train of them (a selection by the start policy's successes).
        self.pool_factor, self.selection = pool_factor, None
        if pool_factor != 1 and (train_parquet or eval_parquet or not num_train):
            raise ValueError(f"config.maze.hard_pool_factor={pool_factor}: selecting mazes needs generated ones and a "
                             "fixed training set (maze.num_train > 0, no parquet files)")
        self.max_new_tokens = max_new_tokens or maze.response_length(size)
        self.train_parquet, self.draw_seed, self.eval_parquet = train_parquet, draw_seed, eval_parquet
        if eval_parquet:  # the authors' validation file: its first num_eval mazes, in file order
            heldout, _ = load_parquet_mazes(eval_parquet, self.size)
            if len(heldout) < num_eval:
                raise ValueError(f"config.maze.eval_parquet={eval_parquet!r} holds {len(heldout)} mazes, fewer than "
                                 f"config.maze.num_eval={num_eval}")
            if len(heldout) > num_eval:
                logging.warning("config.maze.eval_parquet=%s holds %d mazes: evaluating the first %d "
                                "(config.maze.num_eval; their trainer evaluates every row)", eval_parquet,
                                len(heldout), num_eval)
            self.heldout = heldout[:num_eval]
            _check_distinct(self.heldout, f"config.maze.eval_parquet={eval_parquet!r}")
        else:
            self.heldout = maze.make_heldout_set(size, num_eval * pool_factor, seed=seed)
        self.exclude = set(maze.fingerprints(self.heldout))
        # None: an endless stream (the pilot estimator, no history tracker); M: the set's size, the tracker's keys.
        self.num_train_prompts: Optional[int] = check_num_train(num_train) or None
        # The fixed set ``(M, G, G)``: the first M mazes of the task's own stream (order 0's; held-out ones skipped,
        # repeats kept as the stream keeps them), the same for every data order; generated once, 1,024 at a time
        # (the held-out set's compiled shape). With ``train_parquet``: the authors' draw of M rows of that file (keys:
        # positions in the draw, which is in source order; ``train_source_rows`` the rows, their extra_info.index).
        self.train_set: Optional[np.ndarray] = None
        self.train_source_rows: Optional[np.ndarray] = None
        if train_parquet:
            if not self.num_train_prompts:
                raise ValueError(f"config.maze.train_parquet={train_parquet!r} needs config.maze.num_train > 0: the "
                                 "number of rows to draw from it (7,424 in the authors' runs)")
            self.train_set, self.train_source_rows = load_parquet_mazes(train_parquet, self.size,
                                                                        self.num_train_prompts, draw_seed)
            _check_distinct(self.train_set, f"config.maze.train_parquet={train_parquet!r} (draw seed {draw_seed})")
            shared = [i for i, fp in enumerate(maze.fingerprints(self.train_set)) if fp in self.exclude]
            if shared:
                raise ValueError(f"config.maze.train_parquet={train_parquet!r}: source row "
                                 f"{int(self.train_source_rows[shared[0]])} is a held-out maze ({len(shared)} "
                                 "such); training and held-out mazes must be disjoint")
        elif self.num_train_prompts:
            self.train_set, _ = maze.make_train_mazes(self.size, 0, self.num_train_prompts * pool_factor, self.exclude,
                                                      seed=seed)
        self._epoch_cache: Optional[tuple] = None  # (epoch, num, order, permutation) of the last finite step

    def select(self, train_positions: np.ndarray, eval_positions: np.ndarray, summary: dict[str, Any]) -> None:
        """Keeps the pools' mazes at these positions (``num_train`` and the held-out count, in pool order) as the
        training and held-out sets; ``summary`` says how they were chosen (``describe``). Once: before any step."""
        if self.selection is not None or self.pool_factor == 1:
            raise ValueError("MazeTask.select: the sets were chosen already (or there is no pool to choose from)")
        if len(train_positions) != self.num_train_prompts or len(eval_positions) * self.pool_factor != len(self.heldout):
            raise ValueError(f"MazeTask.select: {len(train_positions)} training and {len(eval_positions)} held-out "
                             f"positions; the task keeps {self.num_train_prompts} and "
                             f"{len(self.heldout) // self.pool_factor}")
        self.train_set, self.heldout = self.train_set[train_positions], self.heldout[eval_positions]
        self.selection = summary

    def describe(self) -> dict[str, Any]:
        """Where the mazes come from, for ``results.json``: with parquet files, their paths, the draw and digests of
        the mazes used (SHA-256 of their fingerprints), so a result names its data; nothing for generated mazes."""
        if self.selection is not None:
            return {"selection": self.selection}
        if not (self.train_parquet or self.eval_parquet):
            return {}
        def digest(grids: np.ndarray) -> str:
            return hashlib.sha256(b"".join(maze.fingerprints(grids))).hexdigest()

        out: dict[str, Any] = {"heldout_mazes": len(self.heldout), "heldout_sha256": digest(self.heldout)}
        if self.eval_parquet:
            out["eval_parquet"] = self.eval_parquet
        if self.train_parquet:
            rows = self.train_source_rows
            out.update(train_parquet=self.train_parquet, train_draw_seed=self.draw_seed, train_mazes=len(rows),
                       train_source_rows_sha256=hashlib.sha256(rows.astype("<i8").tobytes()).hexdigest(),
                       train_sha256=digest(self.train_set))
        return out

    @staticmethod
    def train_set_size(config) -> int:
        """``config.maze.num_train`` checked against the run (0: the endless stream): ValueError naming the field
        for a negative or non-int one, or one smaller than ``config.rl.prompts_per_step``."""
        num_train = check_num_train(config.maze.num_train)
        per_step = config.rl.prompts_per_step
        if num_train and config_utils.is_int(per_step) and per_step > num_train:
            raise ValueError(f"config.rl.prompts_per_step={per_step} must be in [1, {num_train}] "
                             f"(config.maze.num_train={num_train}, the training set size)")
        return num_train

    @staticmethod
    def response_cap(config) -> int:
        """Response tokens sampled per rollout: ``config.maze.max_new_tokens``, or MaxRL's rule
        (``maze.response_length``: 180 at 17x17) when it is 0."""
        cap = config.maze.max_new_tokens
        if not isinstance(cap, int) or cap < 0:
            raise ValueError(f"config.maze.max_new_tokens={cap!r}: must be an int >= 0 (0: maze.response_length)")
        return cap or maze.response_length(config.maze.size)

    def _mazes(self, start: int, count: int, order: int = 0) -> np.ndarray:
        grids, _ = maze.make_train_mazes(self.size, start, count, self.exclude, seed=self.stream_seed(order),
                                         chunk=count)
        return grids

    def stream_seed(self, order: int) -> int:
        """The seed of data order ``order``'s training stream: the task's own for 0, else an independent stream
        drawn from (task seed, order), so each order's mazes are fresh draws (held-out mazes still excluded)."""
        if not isinstance(order, (int, np.integer)) or order < 0:
            raise ValueError(f"order={order!r}: must be an int >= 0")
        if order == 0:
            return self.seed
        return int(np.random.SeedSequence([self.seed, 0x0DE4, int(order)]).generate_state(1)[0] >> 1)

    def prompt_batch_of(self, grids: np.ndarray, keys: np.ndarray) -> PromptBatch:
        """The prompts of ``grids[keys]`` (keys: positions in ``grids``)."""
        return self._prompt_batch(grids[keys], keys)

    def _prompt_batch(self, grids: np.ndarray, keys: np.ndarray) -> PromptBatch:
        tokens = np.asarray(maze.render_prompts(jnp.asarray(grids)))
        lengths = np.full(len(grids), tokens.shape[1], np.int32)
        return PromptBatch(keys, tokens, lengths, grids)

    def epoch_order(self, epoch: int, order: int = 0) -> np.ndarray:
        """The permutation of the fixed training set used in ``epoch`` of data order ``order`` (deterministic in
        the seed; 0: the task's own order), as the math task's."""
        if not isinstance(order, (int, np.integer)) or order < 0:
            raise ValueError(f"order={order!r}: must be an int >= 0")
        entropy = [self.seed, 0x3A2E, epoch] + ([int(order)] if order else [])
        return np.random.default_rng(entropy).permutation(self.num_train_prompts)

    def train_prompts(self, step: int, num: int, order: int = 0) -> PromptBatch:
        """Step ``step``'s ``num`` mazes of data order ``order`` (0: the task's own). Endless: mazes
        ``step * num`` .. ``+ num`` of the order's stream (keys: their stream indices). Fixed set of M: epoch
        ``step // (M // num)`` of a per-epoch permutation (its last ``M % num`` mazes skipped), so each epoch
        visits the set once; keys: the mazes' positions in the set, 0..M-1."""
        if self.train_set is None:
            start = step * num
            return self._prompt_batch(self._mazes(start, num, order), np.arange(start, start + num))
        if not 1 <= num <= self.num_train_prompts:
            raise ValueError(f"config.rl.prompts_per_step={num} must be in [1, {self.num_train_prompts}] "
                             f"(config.maze.num_train={self.num_train_prompts}, the training set size)")
        epoch, pos = divmod(step, self.num_train_prompts // num)
        if self._epoch_cache is None or self._epoch_cache[:3] != (epoch, num, order):
            self._epoch_cache = (epoch, num, order, self.epoch_order(epoch, order))
        keys = self._epoch_cache[3][pos * num:(pos + 1) * num]
        return self._prompt_batch(self.train_set[keys], keys)

    def eval_prompts(self) -> PromptBatch:
        return self._prompt_batch(self.heldout, np.arange(len(self.heldout)))

    def rewards(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, sample: SampleOutput) -> np.ndarray:
        # Scored on the device, on the sample's layout; the rewards are gathered from every host (multi-host).
        return host_array(_rewards(jnp.asarray(prompts.payload), jnp.asarray(prompt_ids_B),
                                   jnp.asarray(sample.tokens_BxR), jnp.asarray(sample.lengths_B)))

    def sft_batch(self, step: int, batch_size: int) -> SFTBatch:
        """BFS shortest paths for mazes of an SFT stream disjoint from RL's (negative start indices unused)."""
        grids = self._mazes(10**9 + step * batch_size, batch_size)  # far from the RL stream's indices
        moves, lengths = maze.shortest_paths(jnp.asarray(grids))
        answers, answer_lengths = maze.encode_answers(moves, lengths)
        prompts = np.asarray(maze.render_prompts(jnp.asarray(grids)))
        return SFTBatch(prompts, np.full(batch_size, prompts.shape[1], np.int32),
                        np.asarray(answers), np.asarray(answer_lengths))
