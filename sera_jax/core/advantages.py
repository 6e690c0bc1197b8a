"""Per-rollout advantages on the flat rollout layout (docs/method.md §2, §6)."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from sera_jax.core import layout
from sera_jax.core.estimators import get_estimator

Array = jnp.ndarray


def advantages(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, estimator: str = "maxrl",
               rows_B: Optional[Array] = None) -> Array:
    """``A_ij = f(r_ij, K_i, N_i)`` for every rollout of the flat batch.

    Args:
      rewards_B: binary rewards (0/1) of the B rollouts.
      prompt_ids_B: prompt index in [0, num_prompts) of each rollout (groups need not be contiguous).
      num_prompts: static P.
      estimator: ``maxrl`` (default; zero-success groups get all-zero advantages, as in MaxRL's code),
        ``maxrl_no_baseline``, ``grpo``, ``rloo`` or ``reinforce``.
      rows_B: optional 0/1 mask of the rows whose rewards make a prompt's ``K_i`` and ``N_i`` (default: all).
        Rows outside it still get ``f(r, K_i, N_i)`` of their prompt's counted rows (a loss weight of 0 drops
        them): PODS computes its advantages on the kept rollouts only; padding rows count for nothing.

    Returns:
      float advantages of shape (B,), in the rewards' float dtype (float32 for integer rewards).
    """
    est = get_estimator(estimator)
    if rewards_B.ndim != 1 or rewards_B.shape != prompt_ids_B.shape:
        raise ValueError(
            f"rewards_B and prompt_ids_B must both have shape (B,), got {rewards_B.shape} and {prompt_ids_B.shape}")
    rewards = jnp.asarray(rewards_B)
    if not jnp.issubdtype(rewards.dtype, jnp.floating):
        rewards = rewards.astype(jnp.float32)
    if rows_B is None:
        successes_P = layout.segment_sum(rewards, prompt_ids_B, num_prompts)
        counts_P = layout.counts_from_prompt_ids(prompt_ids_B, num_prompts).astype(rewards.dtype)
    else:
        if rows_B.shape != prompt_ids_B.shape:
            raise ValueError(f"rows_B must have shape {prompt_ids_B.shape}, got {rows_B.shape}")
        counted = jnp.asarray(rows_B, rewards.dtype)
        successes_P = layout.segment_sum(rewards * counted, prompt_ids_B, num_prompts)
        # A prompt without counted rows gets N = 1 (its rows' weights are 0): no division by zero downstream.
        counts_P = jnp.maximum(layout.segment_sum(counted, prompt_ids_B, num_prompts), 1.0)
    return est.advantage(rewards, successes_P[prompt_ids_B], counts_P[prompt_ids_B])
