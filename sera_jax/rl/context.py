"""What an RL step is built from and what its stages hand each other: the run's context (``RLContext``, with the
allocator ``sera.method`` names, looked up once), the rollouts on the flat layout and the success-rate estimate.

Data only: the step (``sera_jax.rl.trainer``), its metrics (``sera_jax.rl.metrics``), sampling and scoring
(``sera_jax.rl.rollouts``) and evaluation (``sera_jax.rl.evaluation``) all read these types, so they live below
all of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
from flax import nnx

import sera_jax.core as core
from sera_jax.models.sampler import SampleOutput
from sera_jax.rl.settings import RunSettings
from sera_jax.rl.task import RLTask
from sera_jax.train.sharding import Placement


@dataclasses.dataclass(frozen=True)
class RLContext:
    """What the step is built from, bound once: task, the run's checked settings (``settings.RunSettings``, parsed
    once at the run's door) and the allocator ``sera.method`` names (the registry's entry, resolved with them;
    every stage reads it here), model structure, placement, compiled functions."""

    task: RLTask
    settings: RunSettings
    graphdef: nnx.GraphDef
    placement: Placement
    sample_fn: Callable
    eval_sample_fn: Callable
    update_fn: Callable  # step.make_policy_gradient_update(graphdef, tx, microbatches)
    allocator: core.Allocator


class Rollouts(NamedTuple):
    """Rollouts on the flat layout: rollout b belongs to prompt ``prompt_ids_B[b]`` of the step."""

    prompt_ids_B: jax.Array
    sample: SampleOutput
    rewards_B: Optional[jax.Array]  # None until scored
    train_B: Optional[jax.Array] = None  # 0/1: the rollouts that enter the loss (None: all; Allocator.keep_fn)
    counted_B: Optional[jax.Array] = None  # 0/1: real rows (None: all); padding rows count for nothing


class Estimate(NamedTuple):
    """What the allocation is computed from: p_hat (None for uniform), the allocation's target (p_hat, or a
    Beta posterior with ``sera.use_posterior``), and the pilot rollouts and their successes per prompt when the
    pilot made the estimate."""

    p_hat_P: Optional[jax.Array]
    target: Any
    pilot: Optional[Rollouts] = None
    pilot_successes_P: Optional[jax.Array] = None
    posterior: Optional[core.BetaPosterior] = None  # the Beta belief behind p_hat (pilot, history); None otherwise
    pilot_lengths_P: Optional[jax.Array] = None  # mean response length of each prompt's pilot (token budgets)
    cold: bool = False  # epoch_history with a prompt not yet estimated: the step is uniform (the authors' rule)
