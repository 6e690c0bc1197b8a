"""What a step's groups turned out to be: mixed (some successes, some failures), all-fail or all-pass.

Only a mixed group gives MaxRL's estimator a gradient (an all-fail group has advantage 0 everywhere; an all-pass
group has ``r - mean = 0``), so the rollouts of unmixed groups are spent without signal. The SERA authors log the
realised mixed and all-fail fractions over the groups that were sampled (``useful_group_fraction``,
``all_zero_group_fraction``); here every allocator logs them, with the expected mixed fraction under the
step's estimates (``1 - (1-p)^N - p^N`` per group, ``released_rule.mixed_group_chance``) beside the realised one.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from sera_jax.core import validation
from sera_jax.core.released_rule import mixed_group_chance

Array = jnp.ndarray


def group_outcomes(successes_P: Array, counts_P: Array, p_P: Optional[Array] = None,
                   prefix: str = "") -> dict[str, Array]:
    """Fractions over the sampled groups (``counts_P > 0``) and the rollouts spent on unmixed ones.

    ``active_frac``: prompts sampled at all; ``useful_group_fraction`` / ``all_fail_group_fraction`` /
    ``all_pass_group_fraction``: the sampled groups that ended mixed / with no success / with no failure;
    ``rollouts_unmixed`` (and ``_frac`` of all rollouts): rollouts in groups that ended unmixed;
    ``useful_group_fraction_expected``: the mean mixed-group chance of the sampled groups at ``p_P`` (when given).
    No group sampled: the fractions are 0. ``0 <= successes_P <= counts_P``, both (P,); ``p_P`` in [0, 1]."""
    counts_P, successes_P = jnp.asarray(counts_P), jnp.asarray(successes_P)
    if counts_P.ndim != 1:
        raise ValueError(f"counts_P must have shape (P,), got {counts_P.shape}")
    if successes_P.shape != counts_P.shape:
        raise ValueError(f"successes_P must have shape (P,) = {counts_P.shape} like counts_P, got {successes_P.shape}")
    validation.check_outcomes(successes_P, counts_P)
    counts_P = counts_P.astype(jnp.int32)
    successes_P = successes_P.astype(jnp.float32)
    sampled_P = counts_P > 0
    groups = jnp.maximum(jnp.sum(sampled_P), 1).astype(jnp.float32)
    all_fail_P = sampled_P & (successes_P == 0)
    all_pass_P = sampled_P & (successes_P == counts_P.astype(jnp.float32))
    mixed_P = sampled_P & ~all_fail_P & ~all_pass_P
    unmixed = jnp.sum(jnp.where(sampled_P & ~mixed_P, counts_P, 0)).astype(jnp.float32)
    m = {"active_frac": jnp.mean(sampled_P.astype(jnp.float32)),
         "useful_group_fraction": jnp.sum(mixed_P) / groups,
         "all_fail_group_fraction": jnp.sum(all_fail_P) / groups,
         "all_pass_group_fraction": jnp.sum(all_pass_P) / groups,
         "rollouts_unmixed": unmixed,
         "rollouts_unmixed_frac": unmixed / jnp.maximum(jnp.sum(counts_P), 1).astype(jnp.float32)}
    if p_P is not None:
        chance_P = mixed_group_chance(jnp.asarray(p_P, jnp.float32), counts_P)
        m["useful_group_fraction_expected"] = jnp.sum(chance_P) / groups
    return {prefix + k: v for k, v in m.items()}
