"""Frozen per-epoch discounted Beta estimates of success rates: the SERA authors' released estimator.

Restates ``HistoricalSuccessEstimator`` (ChenZihao0121/SERA @ 3252ed5, ``verl/trainer/ppo/SERA.py``; the
historical estimates of the paper's Appendix C.1) as pure jax.numpy over a fixed key space of E training prompts
(dataset-wide prompt ids ``0 .. E-1``). Per prompt q the state keeps decayed evidence ``(s_q, f_q)`` around a
fixed Beta(a0, b0) prior, and the current epoch's outcomes (``k_q`` successes of ``n_q`` rollouts) pending. At
each epoch boundary (:func:`epoch_history_start_epoch`), with discount d::

    s_q <- d s_q + k_q,     f_q <- d f_q + (n_q - k_q),     p_hat_q = (a0 + s_q) / (a0 + b0 + s_q + f_q)

(their ``alpha_q <- a0 + d (alpha_q - a0) + K_q``, ``beta_q <- b0 + d (beta_q - b0) + N_q - K_q``). Within an
epoch a lookup reads only the frozen ``p_hat``: the current epoch's outcomes leak into no allocation of it.

A prompt has an estimate once at least one rollout outcome of it was recorded before the last boundary; from
then on it keeps one (its evidence only decays, with d = 0 down to nothing, leaving the prior mean
``a0 / (a0 + b0)``), as their dicts keep a key forever once an outcome put it there. A prompt given zero
rollouts records nothing. Their first ``start_epoch`` (epoch -1 -> 0) promotes nothing; so does ours.

Their trainer calls ``start_epoch`` at the start of each pass over the training set, looks up the step's prompts,
allocates uniformly for the whole step if any prompt has no estimate (:func:`epoch_history_all_known`; so all of
epoch 0), and records every rollout's outcome. Here the trainer calls :func:`epoch_history_advance` at the start
of every step instead (a no-op within an epoch), so a state restored mid-epoch continues exactly: the current
epoch's frozen estimates plus its pending outcomes so far.

The state is a NamedTuple of arrays (checkpointable, jittable). ``prior``, ``discount`` and ``steps_per_epoch``
are static Python numbers (``static_argnames`` under jit). Concrete bad inputs raise ValueError naming the
argument; traced ones are not checked (traced keys outside ``[0, E)`` are dropped by a record and unknown to a
lookup). Shape letters: E the training set's prompts (the key space), P a step's prompts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import validation

Array = jnp.ndarray

DEFAULT_PRIOR = (0.5, 0.5)  # their historical_prior_alpha / historical_prior_beta
DEFAULT_DISCOUNT = 0.75  # their historical_discount
UNKNOWN = -1.0  # mean_E of a prompt with no estimate yet


class EpochHistoryState(NamedTuple):
    """Evidence per dataset prompt; E = ``num_keys``."""

    successes_E: Array  # (E,) float: decayed successes as of the last epoch boundary
    failures_E: Array  # (E,) float: decayed failures as of the last epoch boundary
    pending_successes_E: Array  # (E,) float: the current epoch's successes (promoted at the next boundary)
    pending_failures_E: Array  # (E,) float: the current epoch's failures
    mean_E: Array  # (E,) float: frozen posterior mean p_hat; UNKNOWN (-1, finite: checkpoints refuse NaN) where none
    epoch: Array  # () int32: the current epoch; -1 before the first epoch_history_start_epoch


# ---------------------------------------------------------------------------------------------------------
# Checks


def _check_prior(prior) -> tuple[float, float]:
    if not isinstance(prior, (tuple, list)) or len(prior) != 2:
        raise ValueError(f"prior must be a pair (a0, b0) of Beta prior parameters, got {prior!r}")
    for name, value in zip(("a0", "b0"), prior):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"prior {name} must be a static Python number, got {value!r}")
        if not (math.isfinite(float(value)) and float(value) > 0):
            raise ValueError(f"prior {name} must be finite and > 0, got {value!r}")
    return float(prior[0]), float(prior[1])


def _check_discount(discount) -> float:
    if isinstance(discount, bool) or not isinstance(discount, (int, float, np.integer, np.floating)):
        raise ValueError(f"discount must be a static Python number in [0, 1], got {discount!r}")
    if not 0.0 <= float(discount) <= 1.0:  # also rejects NaN
        raise ValueError(f"discount must lie in [0, 1], got {discount!r}")
    return float(discount)


def _check_state(state) -> int:
    """Returns E (the number of keys)."""
    if not isinstance(state, EpochHistoryState):
        raise ValueError(f"state must be an EpochHistoryState (from epoch_history_init), got {type(state).__name__}")
    num_keys = np.shape(state.mean_E)[0] if np.ndim(state.mean_E) == 1 else -1
    for name in ("successes_E", "failures_E", "pending_successes_E", "pending_failures_E", "mean_E"):
        if np.shape(getattr(state, name)) != (num_keys,):
            raise ValueError(f"state.{name} must have shape (E,) like state.mean_E, got "
                             f"{np.shape(getattr(state, name))}")
    if np.shape(state.epoch) != ():
        raise ValueError(f"state.epoch must be a scalar, got shape {np.shape(state.epoch)}")
    return num_keys


def _check_keys(keys_P, num_keys: int) -> Array:
    keys_P = jnp.asarray(keys_P)
    if keys_P.ndim != 1:
        raise ValueError(f"keys_P must have shape (P,), got {keys_P.shape}")
    if not jnp.issubdtype(keys_P.dtype, jnp.integer):
        raise ValueError(f"keys_P must be an integer array of dataset prompt ids, got dtype {keys_P.dtype}")
    if not validation.is_traced(keys_P) and keys_P.size:
        k = np.asarray(keys_P)
        if np.any(k < 0) or np.any(k >= num_keys):
            raise ValueError(f"keys_P must lie in [0, {num_keys}) (the state's num_keys), got values in "
                             f"[{k.min()}, {k.max()}]")
    return keys_P


def _safe_keys(keys_P: Array, num_keys: int) -> Array:
    """Keys outside [0, E) (possible only when traced) become E, which scatters drop and gathers fill."""
    return jnp.where((keys_P >= 0) & (keys_P < num_keys), keys_P, num_keys)


def _check_outcomes(successes_P, counts_P, shape: tuple) -> tuple[Array, Array]:
    successes_P, counts_P = jnp.asarray(successes_P), jnp.asarray(counts_P)
    for name, x in (("successes_P", successes_P), ("counts_P", counts_P)):
        if x.shape != shape:
            raise ValueError(f"{name} must have shape (P,) = {shape} like keys_P, got {x.shape}")
    if not validation.is_traced(successes_P, counts_P):
        k, n = np.asarray(successes_P, np.float64), np.asarray(counts_P, np.float64)
        if not np.all(np.isfinite(n)) or np.any(n < 0):
            raise ValueError("counts_P must be finite and >= 0 (rollouts per prompt)")
        if not np.all(np.isfinite(k)) or np.any(k < 0) or np.any(k > n):
            raise ValueError("successes_P must lie in [0, counts_P] (successes among each prompt's rollouts)")
    return successes_P, counts_P


# ---------------------------------------------------------------------------------------------------------
# The estimator


def epoch_history_init(num_keys: int, dtype=jnp.float32) -> EpochHistoryState:
    """An empty history over ``num_keys`` dataset prompts: no evidence, no estimates, epoch -1."""
    num_keys = validation.check_int(num_keys, "num_keys", minimum=1)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    zeros_E = jnp.zeros((num_keys,), dtype)
    return EpochHistoryState(zeros_E, zeros_E, zeros_E, zeros_E, jnp.full((num_keys,), UNKNOWN, dtype),
                             jnp.asarray(-1, jnp.int32))


def epoch_history_start_epoch(state: EpochHistoryState, *, prior: tuple[float, float] = DEFAULT_PRIOR,
                              discount: float = DEFAULT_DISCOUNT) -> EpochHistoryState:
    """Starts the next epoch: promotes the pending outcomes and freezes the new posterior means.

    For every prompt q: ``s_q <- d s_q + k_q``, ``f_q <- d f_q + (n_q - k_q)`` (``k_q`` of ``n_q``: its pending
    outcomes), and ``p_hat_q = (a0 + s_q) / (a0 + b0 + s_q + f_q)`` where q has ever had an outcome (earlier
    estimate or pending ones; a prompt not visited this epoch keeps an estimate, its evidence only decayed),
    UNKNOWN elsewhere. Pending outcomes are cleared and ``epoch += 1``. At the first call (epoch -1 -> 0) nothing is
    promoted, as in the released code.
    """
    _check_state(state)
    a0, b0 = _check_prior(prior)
    discount = _check_discount(discount)
    successes_E = discount * state.successes_E + state.pending_successes_E
    failures_E = discount * state.failures_E + state.pending_failures_E
    evidence_E = (state.mean_E >= 0) | (state.pending_successes_E + state.pending_failures_E > 0)
    mean_E = jnp.where(evidence_E, (a0 + successes_E) / (a0 + b0 + successes_E + failures_E), UNKNOWN)
    started = state.epoch >= 0

    def promoted(new, old):
        return jnp.where(started, new, old).astype(old.dtype)

    return EpochHistoryState(
        successes_E=promoted(successes_E, state.successes_E),
        failures_E=promoted(failures_E, state.failures_E),
        pending_successes_E=promoted(jnp.zeros_like(state.pending_successes_E), state.pending_successes_E),
        pending_failures_E=promoted(jnp.zeros_like(state.pending_failures_E), state.pending_failures_E),
        mean_E=promoted(mean_E, state.mean_E),
        epoch=state.epoch + 1,
    )


def epoch_history_record(state: EpochHistoryState, keys_P: Array, successes_P: Array,
                         counts_P: Array) -> EpochHistoryState:
    """Stages a step's outcomes for the next epoch: prompt ``keys_P[i]`` had ``successes_P[i]`` of ``counts_P[i]``.

    ``pending_successes[keys_P] += successes_P``, ``pending_failures[keys_P] += counts_P - successes_P``; the
    frozen means do not change until the next :func:`epoch_history_start_epoch`. A prompt with zero rollouts
    records nothing (it gains no estimate). Repeated keys add up (the released code takes one binary outcome per
    rollout; ``successes_P`` may also be a sum of rewards in [0, 1]). Must follow the first start_epoch (the
    released code raises; checked here when ``state.epoch`` is concrete).
    """
    num_keys = _check_state(state)
    keys_P = _check_keys(keys_P, num_keys)
    successes_P, counts_P = _check_outcomes(successes_P, counts_P, keys_P.shape)
    if not validation.is_traced(state.epoch) and int(state.epoch) < 0:
        raise ValueError("state.epoch is -1: call epoch_history_start_epoch (or epoch_history_advance) before "
                         "recording outcomes")
    dtype = state.pending_successes_E.dtype
    successes_P, counts_P = successes_P.astype(dtype), counts_P.astype(dtype)
    idx_P = _safe_keys(keys_P, num_keys)
    return state._replace(
        pending_successes_E=state.pending_successes_E.at[idx_P].add(successes_P, mode="drop"),
        pending_failures_E=state.pending_failures_E.at[idx_P].add(counts_P - successes_P, mode="drop"),
    )


def epoch_history_lookup(state: EpochHistoryState, keys_P: Array) -> tuple[Array, Array]:
    """Frozen posterior means of prompts ``keys_P``: ``(p_hat_P, known_P)``, ``p_hat_P`` NaN where ``~known_P``."""
    num_keys = _check_state(state)
    keys_P = _check_keys(keys_P, num_keys)
    stored_P = state.mean_E.at[_safe_keys(keys_P, num_keys)].get(mode="fill", fill_value=UNKNOWN)
    known_P = stored_P >= 0
    return jnp.where(known_P, stored_P, jnp.nan), known_P


def epoch_history_all_known(state: EpochHistoryState, keys_P: Array) -> Array:
    """True iff every prompt of the step has an estimate; the released trainer allocates the whole step uniformly
    otherwise (a bool scalar)."""
    return jnp.all(epoch_history_lookup(state, keys_P)[1])


# ---------------------------------------------------------------------------------------------------------
# Epochs of a finite training set


def epoch_length(num_train_prompts: int, prompts_per_step: int) -> int:
    """Steps per epoch when each step takes ``prompts_per_step`` distinct prompts of a training set of
    ``num_train_prompts``: ``num_train_prompts // prompts_per_step`` (the last remainder of each epoch skipped)."""
    num_train_prompts = validation.check_int(num_train_prompts, "num_train_prompts", minimum=1)
    prompts_per_step = validation.check_int(prompts_per_step, "prompts_per_step", minimum=1)
    if prompts_per_step > num_train_prompts:
        raise ValueError(f"prompts_per_step ({prompts_per_step}) must be <= num_train_prompts ({num_train_prompts})")
    return num_train_prompts // prompts_per_step


def epoch_of_step(step, steps_per_epoch: int):
    """The epoch of 0-based step ``step``: ``step // steps_per_epoch`` (as ``divmod(step, M // num)[0]`` in the
    math task's ``train_prompts``). An int for an int step, an int32 array for an array."""
    steps_per_epoch = validation.check_int(steps_per_epoch, "steps_per_epoch", minimum=1)
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return int(step) // steps_per_epoch
    step = jnp.asarray(step)
    if step.shape != () or not jnp.issubdtype(step.dtype, jnp.integer):
        raise ValueError(f"step must be an integer scalar, got shape {step.shape} and dtype {step.dtype}")
    if not validation.is_traced(step) and int(step) < 0:
        raise ValueError(f"step must be >= 0, got {int(step)}")
    return step.astype(jnp.int32) // steps_per_epoch


def epoch_history_advance(state: EpochHistoryState, step, steps_per_epoch: int, *,
                          prior: tuple[float, float] = DEFAULT_PRIOR,
                          discount: float = DEFAULT_DISCOUNT) -> EpochHistoryState:
    """Calls :func:`epoch_history_start_epoch` until ``state.epoch == epoch_of_step(step, steps_per_epoch)``.

    Call it at the start of every step: within an epoch it changes nothing; at a step that opens epoch e it
    promotes the finished epoch's outcomes (and, after skipped epochs, decays once more per skipped epoch, as
    calling start_epoch at each would). A state already past the step's epoch is an error when concrete and left
    unchanged when traced.
    """
    _check_state(state)
    _check_prior(prior)
    _check_discount(discount)
    target = jnp.asarray(epoch_of_step(step, steps_per_epoch), jnp.int32)
    if not validation.is_traced(state.epoch, target) and int(state.epoch) > int(target):
        raise ValueError(f"step {int(step)} is in epoch {int(target)} but state.epoch is already {int(state.epoch)}")
    return jax.lax.while_loop(lambda s: s.epoch < target,
                              lambda s: epoch_history_start_epoch(s, prior=prior, discount=discount), state)
