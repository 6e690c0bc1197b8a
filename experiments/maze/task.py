"""The maze task as an ``RLTask`` for the trainer, and its SFT data (BFS shortest paths). Rewards are
``maze.maze_rewards`` with its default, MaxRL's rule (success at the first arrival on the goal).

Training mazes come from an endless stream (``num_train=0``: a step's mazes are a pure function of the step,
none ever recurs) or from a fixed set of the stream's first ``num_train`` mazes, revisited in epochs as SERA's
7,424 17x17 mazes are (the history estimator and the selection peers need prompts that recur)."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.envs import maze
from sera_jax.rl.sft import SFTBatch
from sera_jax.rl.task import PromptBatch, SampleOutput
from sera_jax.train import config_utils
from sera_jax.train.distributed import host_array


@jax.jit
def _rewards(grids_PxGxG, prompt_ids_B, tokens_BxR, lengths_B):
    """Rewards of the flat batch: each rollout is scored on its own prompt's maze."""
    return maze.maze_rewards(grids_PxGxG[prompt_ids_B], tokens_BxR, lengths_B)


def check_num_train(num_train) -> int:
    """``num_train`` (``config.maze.num_train``) if it is an int >= 0 (0: the endless stream), else ValueError
    naming the field."""
    if not config_utils.is_int(num_train) or num_train < 0:
        raise ValueError(f"config.maze.num_train={num_train!r}: must be an int >= 0 (0: an endless stream of "
                         "training mazes; M > 0: a fixed set of M mazes revisited in epochs)")
    return num_train


class MazeTask:
    """Training mazes, endless (``num_train=0``: a pure function of the step) or a fixed set of ``num_train``
    revisited in epochs, and a fixed held-out set disjoint from them."""

    stop_tokens = maze.STOP_TOKENS  # <eos> and DONE, as MaxRL's generation_config.json
    pad_id = maze.PAD
    knows_success_rates = False  # p of a maze under the policy is unknown: sera.p_estimate="oracle" is refused

    def __init__(self, size: int, num_eval: int, seed: int = 0, max_new_tokens: int = 0, num_train: int = 0):
        self.size, self.seed = maze.check_size(size), seed
        self.max_new_tokens = max_new_tokens or maze.response_length(size)
        self.heldout = maze.make_heldout_set(size, num_eval, seed=seed)
        self.exclude = set(maze.fingerprints(self.heldout))
        # None: an endless stream (the pilot estimator, no history tracker); M: the set's size, the tracker's keys.
        self.num_train_prompts: Optional[int] = check_num_train(num_train) or None
        # The fixed set ``(M, G, G)``: the first M mazes of the task's own stream (order 0's; held-out ones skipped,
        # repeats kept as the stream keeps them), the same for every data order; generated once, 1,024 at a time
        # (the held-out set's compiled shape).
        self.train_set: Optional[np.ndarray] = None
        if self.num_train_prompts:
            self.train_set, _ = maze.make_train_mazes(self.size, 0, self.num_train_prompts, self.exclude, seed=seed)
        self._epoch_cache: Optional[tuple] = None  # (epoch, num, order, permutation) of the last finite step

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
