"""What the RL trainer needs from a task: prompts per step, held-out prompts, binary rewards."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol

import numpy as np

from sera_jax.models.sampler import SampleOutput  # re-exported: the protocol's type; models never import rl


class PromptBatch(NamedTuple):
    """P prompts of a step: dataset keys, left-padded tokens and what the task needs to score them."""

    keys_P: np.ndarray  # int, dataset-wide prompt ids (the history tracker's keys)
    tokens_PxT: np.ndarray  # int32, left-padded
    lengths_P: np.ndarray  # int32
    payload: Any  # task-specific (maze grids, reference answers, ...)


class RLTask(Protocol):
    """Everything the trainer calls on a task.

    ``train_prompts(step, P)`` must be a pure function of the step (a resumed run sees the same data); a task
    that can also reorder its data takes ``order=`` (an int; 0: its own order), which ``rl.data_order="seed"``
    sets to the run's seed, so that seeds differ in data order and the methods of a seed see the same prompts;
    ``rewards`` returns one 0/1 reward per rollout row ``b`` of ``sample``, scored against prompt
    ``prompt_ids_B[b]`` (host or device arrays; it is the step's only host round trip where it cannot be
    jitted). ``oracle_success_rates`` is called only when ``knows_success_rates`` (``sera.p_estimate='oracle'``
    is refused for tasks that cannot give p).
    """

    num_train_prompts: Optional[int]  # dataset size (None: an endless generator, no history tracker)
    stop_tokens: tuple[int, ...]
    pad_id: int
    max_new_tokens: int
    knows_success_rates: bool

    def train_prompts(self, step: int, num: int) -> PromptBatch: ...  # optionally order: int = 0

    def eval_prompts(self) -> PromptBatch: ...

    def rewards(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, sample: SampleOutput) -> np.ndarray: ...

    def oracle_success_rates(self, prompts: PromptBatch) -> np.ndarray: ...
