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
import numpy as np

from sera_jax.core import validation
from sera_jax.core.allocation import BetaPosterior

Array = jnp.ndarray


class TrackerState(NamedTuple):
    """Decayed per-prompt counts over the whole dataset (``num_keys`` prompts)."""

    successes: Array  # (num_keys,)
    failures: Array  # (num_keys,)


def tracker_init(num_keys: int, dtype=jnp.float32) -> TrackerState:
    """No evidence yet about ``num_keys`` dataset prompts (keys ``0 .. num_keys - 1``)."""
    num_keys = validation.check_int(num_keys, "num_keys", minimum=1)
    return TrackerState(jnp.zeros((num_keys,), dtype), jnp.zeros((num_keys,), dtype))


def _check_state(state: TrackerState) -> int:
    """The tracker's num_keys, after checking that its two count vectors match."""
    if not isinstance(state, TrackerState):
        raise ValueError(f"state must be a TrackerState (from tracker_init), got {type(state).__name__}")
    shape = np.shape(state.successes)
    if len(shape) != 1 or np.shape(state.failures) != shape:
        raise ValueError(f"state.failures must have shape {shape} like state.successes, both (num_keys,); got "
                         f"{np.shape(state.failures)}")
    return shape[0]


def _check_keys(keys_P, num_keys: int) -> Array:
    keys_P = jnp.asarray(keys_P)
    if keys_P.ndim != 1 or not jnp.issubdtype(keys_P.dtype, jnp.integer):
        raise ValueError(f"keys_P must be an integer array of shape (P,), got {keys_P.dtype} {keys_P.shape}")
    validation.require(keys_P, lambda k: (k < 0) | (k >= num_keys),
                       f"keys_P must lie in [0, {num_keys}) (the tracker's num_keys)")
    return keys_P


def tracker_update(state: TrackerState, keys_P: Array, successes_P: Array, counts_P: Array,
                   decay: float = 1.0) -> TrackerState:
    """Adds a step's results for prompts ``keys_P``; their old counts are first multiplied by ``decay``.

    ``decay < 1`` forgets older epochs geometrically (the policy moves). Keys must be distinct within a call;
    ``0 <= successes_P <= counts_P`` (a prompt given no rollouts adds nothing, and its counts only decay).
    """
    keys_P = _check_keys(keys_P, _check_state(state))
    for name, x in (("successes_P", successes_P), ("counts_P", counts_P)):
        if np.shape(x) != keys_P.shape:
            raise ValueError(f"{name} must have shape (P,) = {keys_P.shape} like keys_P, got {np.shape(x)}")
    validation.check_outcomes(successes_P, counts_P)
    validation.require(decay, lambda d: ~((d >= 0) & (d <= 1)), "decay must lie in [0, 1]")
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
    _check_state(state)
    for name, value in (("default_strength", default_strength), ("min_strength", min_strength),
                        ("max_strength", max_strength)):
        validation.check_real(value, name, 0.0, np.inf)
        if not value > 0:
            raise ValueError(f"{name} must be > 0 (a Beta prior's concentration), got {value!r}")
    if min_strength > max_strength:
        raise ValueError(f"min_strength ({min_strength}) must be <= max_strength ({max_strength})")
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
    keys_P = _check_keys(keys_P, _check_state(state))
    a0, b0 = fitted_prior(state, **prior_kwargs)
    return BetaPosterior(a0 + state.successes[keys_P], b0 + state.failures[keys_P])


def tracker_predict(state: TrackerState, keys_P: Array, **prior_kwargs) -> Array:
    """Posterior-mean success rates ``p_hat`` of prompts ``keys_P``."""
    return tracker_posterior(state, keys_P, **prior_kwargs).mean


def pilot_posterior(successes_P: Array, n0: int, prior: tuple[float, float] = (0.5, 0.5), *,
                    check: bool = True) -> BetaPosterior:
    """Beta posterior after ``n0`` pilot rollouts with ``successes_P`` successes (Jeffreys prior by default).

    ``n0``: an integer >= 1; ``0 <= successes_P <= n0``; the prior's two parameters > 0."""
    if not validation.is_traced(n0):
        n0_value = np.asarray(n0)
        if n0_value.shape != () or not np.issubdtype(n0_value.dtype, np.integer) or int(n0_value) < 1:
            raise ValueError(f"n0 must be >= 1, an integer (pilot rollouts per prompt); got {n0!r}")
        validation.require(successes_P, lambda k: ~((k >= 0) & (k <= int(n0_value))),
                           f"successes_P must lie in [0, n0] = [0, {int(n0_value)}] (pilot successes)", check=check)
    if len(prior) != 2 or not all(validation.check_real(v, "prior", 0.0, np.inf) > 0 for v in prior):
        raise ValueError(f"prior must be a pair (a0, b0) of Beta parameters > 0, got {prior!r}")
    successes_P = jnp.asarray(successes_P)
    if not jnp.issubdtype(successes_P.dtype, jnp.floating):
        successes_P = successes_P.astype(jnp.float32)
    return BetaPosterior(prior[0] + successes_P, prior[1] + n0 - successes_P)
