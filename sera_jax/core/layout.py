"""The flat rollout layout of docs/method.md §6 and per-prompt segment statistics.

With a fixed budget B the rollout batch is a flat ``(B, ...)`` array whose row b belongs to prompt
``prompt_ids_B[b]``; rows of one prompt are contiguous when built by :func:`prompt_ids_from_counts`.
Per-prompt statistics are segment sums with a static ``num_prompts``: nothing is padded and nothing
recompiles when the allocation changes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jnp.ndarray


def prompt_ids_from_counts(counts_P: Array, total: int) -> Array:
    """``prompt_ids_B = repeat(arange(P), counts_P)`` with the static length ``total`` (= sum of counts)."""
    num_prompts = counts_P.shape[0]
    return jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), counts_P, total_repeat_length=total)


def segment_sum(values_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """Per-prompt sums of a flat ``(B, ...)`` array: shape ``(num_prompts, ...)``."""
    return jax.ops.segment_sum(values_B, prompt_ids_B, num_segments=num_prompts)


def counts_from_prompt_ids(prompt_ids_B: Array, num_prompts: int) -> Array:
    """Rollouts per prompt, ``N_P`` (int32)."""
    ones = jnp.ones(prompt_ids_B.shape, dtype=jnp.int32)
    return segment_sum(ones, prompt_ids_B, num_prompts)


def segment_mean(values_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """Per-prompt means; prompts without rollouts get 0."""
    sums = segment_sum(values_B, prompt_ids_B, num_prompts)
    counts = counts_from_prompt_ids(prompt_ids_B, num_prompts).astype(sums.dtype)
    counts = counts.reshape(counts.shape + (1,) * (sums.ndim - 1))
    return jnp.where(counts > 0, sums / jnp.maximum(counts, 1), 0.0)


def rank_within_prompt(prompt_ids_B: Array, num_prompts: int) -> Array:
    """Index j of each rollout inside its (contiguous) prompt group: 0, 1, ..., N_i - 1."""
    counts = counts_from_prompt_ids(prompt_ids_B, num_prompts)
    starts = jnp.cumsum(counts) - counts
    return jnp.arange(prompt_ids_B.shape[0], dtype=jnp.int32) - starts[prompt_ids_B]
