"""Per-rollout advantages on the flat rollout layout (docs/method.md §2, §6)."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from sera_jax.core import layout, validation
from sera_jax.core.estimators import get_estimator

Array = jnp.ndarray


def advantages(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, estimator: str = "maxrl",
               rows_B: Optional[Array] = None) -> Array:
    """``A_ij = f(r_ij, K_i, N_i)`` for every rollout of the flat batch.

    Args:
      rewards_B: binary rewards (0/1) of the B rollouts: every registered estimator's ``f(r, K, N)`` is written for
        success/failure outcomes (``K`` counts the successes), so other values are refused.
      prompt_ids_B: prompt index in [0, num_prompts) of each rollout (groups need not be contiguous).
      num_prompts: static P. Prompts without rollouts are allowed (they have no rows).
      estimator: ``maxrl`` (default; zero-success groups get all-zero advantages, as in MaxRL's code),
        ``maxrl_no_baseline``, ``grpo``, ``rloo`` or ``reinforce``.
      rows_B: optional 0/1 mask of the rows whose rewards make a prompt's ``K_i`` and ``N_i`` (default: all).
        Rows outside it still get ``f(r, K_i, N_i)`` of their prompt's counted rows (a loss weight of 0 drops
        them): PODS computes its advantages on the kept rollouts only; padding rows count for nothing.

    Returns:
      float advantages of shape (B,), in the rewards' float dtype (float32 for integer rewards).

    Bad input raises ValueError (values of traced arrays: inside ``checkify.checkify``; ``core.validation``).
    """
    est = get_estimator(estimator)
    num_prompts = validation.check_num_prompts(num_prompts)
    rewards = jnp.asarray(rewards_B)
    prompt_ids_B = jnp.asarray(prompt_ids_B)
    if rewards.ndim != 1 or rewards.shape != prompt_ids_B.shape:
        raise ValueError(
            f"rewards_B and prompt_ids_B must both have shape (B,), got {rewards.shape} and {prompt_ids_B.shape}")
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    validation.require(rewards, lambda r: (r != 0) & (r != 1),
                       f"rewards_B must be binary (0 or 1) for estimator {estimator!r} (success or failure)")
    if not jnp.issubdtype(rewards.dtype, jnp.floating):
        rewards = rewards.astype(jnp.float32)
    if rows_B is None:
        successes_P = layout._segment_sum(rewards, prompt_ids_B, num_prompts)
        counts_P = layout._counts(prompt_ids_B, num_prompts).astype(rewards.dtype)
    else:
        counted = jnp.asarray(validation.check_mask(rows_B, "rows_B", prompt_ids_B.shape), rewards.dtype)
        successes_P = layout._segment_sum(rewards * counted, prompt_ids_B, num_prompts)
        # A prompt without counted rows gets N = 1 (its rows' weights are 0): no division by zero downstream.
        counts_P = jnp.maximum(layout._segment_sum(counted, prompt_ids_B, num_prompts), 1.0)
    return est.advantage(rewards, successes_P[prompt_ids_B], counts_P[prompt_ids_B])
