"""The flat rollout layout of docs/method.md §6 and per-prompt segment statistics.

With a fixed budget B the rollout batch is a flat ``(B, ...)`` array whose row b belongs to prompt
``prompt_ids_B[b]`` in ``[0, P)``; rows of one prompt are contiguous when built by :func:`prompt_ids_from_counts`.
Per-prompt statistics are segment sums with a static ``num_prompts``: nothing is padded and nothing
recompiles when the allocation changes. A prompt with no rows (0 rollouts) has sum 0 and mean 0.

Bad input (an id outside ``[0, P)``, counts that do not fill the B rows) raises ValueError where it is entered;
under ``jit`` those value checks run inside ``checkify.checkify`` (``core.validation``).
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import validation

Array = jnp.ndarray


def prompt_ids_from_counts(counts_P: Array, total: int) -> Array:
    """``prompt_ids_B = repeat(arange(P), counts_P)`` with the static length ``total``.

    ``counts_P``: integers >= 0 that sum to ``total`` exactly (the rows of the layout: a shorter sum would leave
    rows that belong to no prompt, a longer one would drop rollouts).
    """
    counts_P = jnp.asarray(counts_P)
    if counts_P.ndim != 1:
        raise ValueError(f"counts_P must have shape (P,), got {counts_P.shape}")
    if not jnp.issubdtype(counts_P.dtype, jnp.integer):
        raise ValueError(f"counts_P must be an integer array (rollouts per prompt), got dtype {counts_P.dtype}")
    total = validation.check_int(_static_int(total), "total", minimum=0)
    validation.require(counts_P, lambda c: c < 0, "counts_P must be >= 0 (rollouts per prompt)")
    total_sum = jnp.sum(counts_P) if validation.is_traced(counts_P) else int(np.asarray(counts_P).sum())
    validation.require_true(total_sum == total, f"counts_P must sum to total = {total} (the flat layout's rows)"
                            + ("" if validation.is_traced(total_sum) else f"; they sum to {total_sum}"))
    return jnp.repeat(jnp.arange(counts_P.shape[0], dtype=jnp.int32), counts_P, total_repeat_length=total)


def _static_int(x):
    """A concrete integer scalar (a NumPy or concrete jax one included) as an int; anything else unchanged, for
    ``check_int`` to name."""
    try:
        return operator.index(x)
    except TypeError:
        return x


def _check_values(values_B: Array, prompt_ids_B: Array) -> Array:
    values_B = jnp.asarray(values_B)
    if values_B.ndim < 1 or values_B.shape[0] != prompt_ids_B.shape[0]:
        raise ValueError(f"values_B must have B = {prompt_ids_B.shape[0]} rows like prompt_ids_B, got shape "
                         f"{values_B.shape}")
    return values_B


def segment_sum(values_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """Per-prompt sums of a flat ``(B, ...)`` array: shape ``(num_prompts, ...)``."""
    num_prompts = validation.check_num_prompts(num_prompts)
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    return _segment_sum(_check_values(values_B, prompt_ids_B), prompt_ids_B, num_prompts)


def _segment_sum(values_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """:func:`segment_sum` on a layout already checked (the callers inside core)."""
    return jax.ops.segment_sum(values_B, prompt_ids_B, num_segments=num_prompts)


def counts_from_prompt_ids(prompt_ids_B: Array, num_prompts: int) -> Array:
    """Rollouts per prompt, ``N_P`` (int32)."""
    num_prompts = validation.check_num_prompts(num_prompts)
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    return _counts(prompt_ids_B, num_prompts)


def _counts(prompt_ids_B: Array, num_prompts: int) -> Array:
    return _segment_sum(jnp.ones(prompt_ids_B.shape, dtype=jnp.int32), prompt_ids_B, num_prompts)


def segment_mean(values_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """Per-prompt means; prompts without rollouts get 0."""
    num_prompts = validation.check_num_prompts(num_prompts)
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    sums = _segment_sum(_check_values(values_B, prompt_ids_B), prompt_ids_B, num_prompts)
    counts = _counts(prompt_ids_B, num_prompts).astype(sums.dtype)
    counts = counts.reshape(counts.shape + (1,) * (sums.ndim - 1))
    return jnp.where(counts > 0, sums / jnp.maximum(counts, 1), 0.0)


def rank_within_prompt(prompt_ids_B: Array, num_prompts: int) -> Array:
    """Index j of each rollout inside its prompt group: 0, 1, ..., N_i - 1. ``prompt_ids_B`` must be
    non-decreasing: each prompt's rows together, in prompt order, as :func:`prompt_ids_from_counts` lays them out
    (a group's first row is found from the counts of the prompts before it)."""
    num_prompts = validation.check_num_prompts(num_prompts)
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    message = "prompt_ids_B must be non-decreasing (each prompt's rows together, in prompt order)"
    if validation.is_traced(prompt_ids_B):
        validation.require_true(jnp.all(prompt_ids_B[1:] >= prompt_ids_B[:-1]), message)
    else:
        ids = np.asarray(prompt_ids_B)
        drops = np.flatnonzero(ids[1:] < ids[:-1])
        if drops.size:
            raise ValueError(f"{message}; row {drops[0] + 1} has prompt {ids[drops[0] + 1]} after prompt "
                             f"{ids[drops[0]]}")
    counts = _counts(prompt_ids_B, num_prompts)
    starts = jnp.cumsum(counts) - counts
    return jnp.arange(prompt_ids_B.shape[0], dtype=jnp.int32) - starts[prompt_ids_B]
