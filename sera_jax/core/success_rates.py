"""Estimating success rates before sampling (docs/method.md §5).

* ``history``: a Beta-posterior tracker keyed by a dataset-wide prompt id. Per prompt it keeps decayed
  success / failure counts from earlier rollouts; the prior, shared by unseen prompts, is fitted by moments
  to the running success rates of the prompts seen so far. It uses past data only, so an allocation made
  from it is independent of the current rollouts and the estimator keeps its expectation
  ``(1/P) sum_i s(p_i, N_i) grad log p_i``.
* ``pilot``: ``n0`` rollouts per prompt first; a Beta posterior from them (Jeffreys prior by default);
  the rest of the budget allocated on it (``allocators.pilot_allocate``); all rollouts enter the gradient. The
  allocation then depends on the current samples: say so wherever results use it.

The tracker state is a pytree of arrays (checkpointable, jittable, shardable). Of ``core`` this module imports only
``allocation`` (``BetaPosterior``): the allocator registry and the selection rules build on it, never the reverse.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from sera_jax.core.allocation import BetaPosterior

Array = jnp.ndarray


class TrackerState(NamedTuple):
    """Decayed per-prompt counts over the whole dataset (``num_keys`` prompts)."""

    successes: Array  # (num_keys,)
    failures: Array  # (num_keys,)


def tracker_init(num_keys: int, dtype=jnp.float32) -> TrackerState:
    return TrackerState(jnp.zeros((num_keys,), dtype), jnp.zeros((num_keys,), dtype))


def tracker_update(state: TrackerState, keys_P: Array, successes_P: Array, counts_P: Array,
                   decay: float = 1.0) -> TrackerState:
    """Adds a step's results for prompts ``keys_P``; their old counts are first multiplied by ``decay``.

    ``decay < 1`` forgets older epochs geometrically (the policy moves). Keys must be distinct within a call.
    """
    dtype = state.successes.dtype
    successes_P = jnp.asarray(successes_P, dtype)
    failures_P = jnp.asarray(counts_P, dtype) - successes_P
    return TrackerState(
        successes=state.successes.at[keys_P].set(decay * state.successes[keys_P] + successes_P),
        failures=state.failures.at[keys_P].set(decay * state.failures[keys_P] + failures_P),
    )


def fitted_prior(state: TrackerState, default_strength: float = 2.0, min_strength: float = 0.5,
                 max_strength: float = 1000.0) -> tuple[Array, Array]:
    """Beta(a0, b0) fitted by moments to the seen prompts' success rates.

    Mean ``m``: pooled success rate of the seen prompts (Jeffreys-smoothed). Concentration
    ``kappa = m (1 - m) / v - 1`` from the between-prompt variance ``v`` (the variance of per-prompt rates
    minus their average binomial noise), clipped to [min_strength, max_strength]; ``default_strength``
    while fewer than two prompts are seen or the between-prompt variance is not positive.
    """
    trials = state.successes + state.failures
    seen = trials > 0
    num_seen = jnp.sum(seen)
    mean = (jnp.sum(state.successes) + 0.5) / (jnp.sum(trials) + 1.0)
    rates = jnp.where(seen, state.successes / jnp.where(seen, trials, 1.0), 0.0)
    safe_seen = jnp.maximum(num_seen, 1)
    rate_mean = jnp.sum(rates) / safe_seen
    rate_var = jnp.sum(jnp.where(seen, (rates - rate_mean) ** 2, 0.0)) / safe_seen
    noise = jnp.sum(jnp.where(seen, rates * (1 - rates) / jnp.where(seen, trials, 1.0), 0.0)) / safe_seen
    between = rate_var - noise
    kappa = jnp.where(between > 0, mean * (1 - mean) / jnp.where(between > 0, between, 1.0) - 1.0, default_strength)
    kappa = jnp.where(num_seen >= 2, jnp.clip(kappa, min_strength, max_strength), default_strength)
    return mean * kappa, (1 - mean) * kappa


def tracker_posterior(state: TrackerState, keys_P: Array, **prior_kwargs) -> BetaPosterior:
    """Beta posterior of each prompt's success rate: fitted prior + its decayed counts."""
    a0, b0 = fitted_prior(state, **prior_kwargs)
    return BetaPosterior(a0 + state.successes[keys_P], b0 + state.failures[keys_P])


def tracker_predict(state: TrackerState, keys_P: Array, **prior_kwargs) -> Array:
    """Posterior-mean success rates ``p_hat`` of prompts ``keys_P``."""
    return tracker_posterior(state, keys_P, **prior_kwargs).mean


def pilot_posterior(successes_P: Array, n0: int, prior: tuple[float, float] = (0.5, 0.5)) -> BetaPosterior:
    """Beta posterior after ``n0`` pilot rollouts with ``successes_P`` successes (Jeffreys prior by default)."""
    successes_P = jnp.asarray(successes_P)
    if not jnp.issubdtype(successes_P.dtype, jnp.floating):
        successes_P = successes_P.astype(jnp.float32)
    return BetaPosterior(prior[0] + successes_P, prior[1] + n0 - successes_P)
