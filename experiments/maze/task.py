"""The maze task as an ``RLTask`` for the trainer, and its SFT data (BFS shortest paths). Rewards are
``maze.maze_rewards`` with its default, MaxRL's rule (success at the first arrival on the goal)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.envs import maze
from sera_jax.rl.sft import SFTBatch
from sera_jax.rl.task import PromptBatch, SampleOutput
from sera_jax.train.distributed import host_array


@jax.jit
def _rewards(grids_PxGxG, prompt_ids_B, tokens_BxR, lengths_B):
    """Rewards of the flat batch: each rollout is scored on its own prompt's maze."""
    return maze.maze_rewards(grids_PxGxG[prompt_ids_B], tokens_BxR, lengths_B)


class MazeTask:
    """Endless training mazes (a pure function of the step), a fixed held-out set disjoint from them."""

    stop_tokens = maze.STOP_TOKENS  # <eos> and DONE, as MaxRL's generation_config.json
    pad_id = maze.PAD
    num_train_prompts = None  # an endless stream: the pilot estimator, no history tracker
    knows_success_rates = False  # p of a maze under the policy is unknown: sera.p_estimate="oracle" is refused

    def __init__(self, size: int, num_eval: int, seed: int = 0, max_new_tokens: int = 0):
        self.size, self.seed = maze.check_size(size), seed
        self.max_new_tokens = max_new_tokens or maze.response_length(size)
        self.heldout = maze.make_heldout_set(size, num_eval, seed=seed)
        self.exclude = set(maze.fingerprints(self.heldout))

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

    def train_prompts(self, step: int, num: int, order: int = 0) -> PromptBatch:
        """Mazes ``step * num`` .. ``+ num`` of order ``order``'s stream (0: the task's own)."""
        start = step * num
        return self._prompt_batch(self._mazes(start, num, order), np.arange(start, start + num))

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
