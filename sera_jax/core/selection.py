"""Prompt selection from a candidate window: MoPPS's posterior sampling and GRESO's pre-rollout skipping.

Both decide *which* prompts are rolled out, not how many rollouts each gets (docs/allocators.md §0 (b)). The
trainer fetches a window of ``C = ratio * P`` candidates (the next C prompts of the prompt stream every method
sees) and keeps P of them; each kept prompt then gets the same count, ``B // P`` with the remainder to the first
``B mod P`` selected prompts in the returned order (``allocation.uniform_counts``).

* MoPPS (arXiv 2507.04632, docs/allocators.md §5): :func:`mopps_posterior`, :func:`mopps_select`,
  :func:`mopps_select_from_draws`.
* GRESO (arXiv 2506.02177, docs/allocators.md §4): :class:`SkipState`, :func:`skip_state_init`,
  :func:`greso_skip_probability`, :func:`greso_select`, :func:`greso_update`.

Everything is pure jax.numpy and jittable (counts and hyperparameters are static Python numbers); randomness is
an explicit argument (a PRNG key, or the draws / coins themselves so a test can inject them); ties go to the
lower candidate index. Concrete bad inputs raise ValueError naming the argument; traced ones are not checked.
Shape letters: C candidates, P selected (or visited) prompts.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import validation
from sera_jax.core.allocation import BetaPosterior, _check_posterior
from sera_jax.core.success_rates import TrackerState

Array = jnp.ndarray


# ---------------------------------------------------------------------------------------------------------
# Shared input checks


def _check_num_select(num_select, num_candidates: int) -> int:
    num_select = validation.check_int(num_select, "num_select", minimum=1)
    if num_select > num_candidates:
        raise ValueError(f"num_select ({num_select}) must be <= the number of candidates ({num_candidates})")
    return num_select


def _check_vector(x, name: str) -> Array:
    x = jnp.asarray(x)
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must have shape (n,) with n >= 1, got {x.shape}")
    return x


def _check_keys(keys, num_keys: int, name: str, distinct: bool = False) -> Array:
    """Integer dataset keys in [0, num_keys) (eagerly checked); ``distinct`` for scatter updates."""
    keys = _check_vector(keys, name)
    if not jnp.issubdtype(keys.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array of dataset prompt ids, got dtype {keys.dtype}")
    if not validation.is_traced(keys):
        k = np.asarray(keys)
        if np.any(k < 0) or np.any(k >= num_keys):
            raise ValueError(f"{name} must lie in [0, {num_keys}) (the state's num_keys), got values in "
                             f"[{k.min()}, {k.max()}]")
        if distinct and np.unique(k).size != k.size:
            raise ValueError(f"{name} must be distinct within a call (one update per prompt)")
    return keys


def _check_real(value, name: str, low: float, high: float) -> float:
    """A static real in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a static Python number, got {value!r}")
    value = float(value)
    if not (low <= value <= high):
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")
    return value


# ---------------------------------------------------------------------------------------------------------
# MoPPS: Thompson-sample each candidate's success rate, keep the P closest to the target rate.

MOPPS_PRIOR = (1.0, 1.0)  # MoPPS's Beta(1, 1) prior


def mopps_posterior(tracker: TrackerState, keys_C: Array) -> BetaPosterior:
    """MoPPS's posterior ``Beta(1 + s_i, 1 + f_i)`` of candidates ``keys_C`` from the decayed history tracker.

    MoPPS (Model Predictive Prompt Selection, arXiv 2507.04632; thu-rllab/MoPPS @ a883f519 ``recipe/ours/mopps.py``
    ``PosteriorSampler.train``; docs/allocators.md §5) starts every prompt at the prior Beta(1, 1) and, after a
    prompt selected in a step gets k successes out of n, updates only it:

        alpha <- lambda alpha + (1 - lambda) * 1 + k,     beta <- lambda beta + (1 - lambda) * 1 + (n - k).

    Why the tracker (``success_rates.tracker_update`` with ``decay = lambda``, also only on the step's prompts)
    gives the same posterior: write ``alpha = 1 + a``. Then the update reads
    ``1 + a' = lambda (1 + a) + (1 - lambda) + k = 1 + lambda a + k``, i.e. ``a' = lambda a + k``, which is the
    tracker's ``successes <- decay * successes + k``, from the same start ``a = 0`` (alpha = 1). Likewise
    ``beta - 1`` is the tracker's decayed failures. So ``alpha = 1 + successes``, ``beta = 1 + failures`` exactly,
    for any lambda (the published scripts use lambda = 1, and 0.5 for countdown / geo3k).

    MoPPS's optional offline initialisation ``alpha = 1 + 3 successes``, ``beta = 1 + 3 failures`` is a tracker
    started at 3x the offline counts; the "noinit" scripts (and this function) start from zero counts. This uses
    MoPPS's fixed prior, not the tracker's fitted prior (``success_rates.tracker_posterior``).
    """
    keys_C = _check_keys(keys_C, tracker.successes.shape[0], "keys_C")
    return BetaPosterior(MOPPS_PRIOR[0] + tracker.successes[keys_C], MOPPS_PRIOR[1] + tracker.failures[keys_C])


@functools.partial(jax.jit, static_argnames=("num_select", "target_rate"))
def _closest_to_target(draws_C, num_select, target_rate):
    distance_C = jnp.square(draws_C - target_rate)
    # A stable sort: equal distances keep candidate order (ties by index).
    return jnp.argsort(distance_C, stable=True)[:num_select].astype(jnp.int32)


def mopps_select_from_draws(draws_C: Array, num_select: int, target_rate: float = 0.5) -> Array:
    """MoPPS's selection given the sampled success rates ``draws_C``: the ``num_select`` candidates with the
    smallest ``(draw_i - target_rate)^2``, in that order (closest first; ties by candidate index).

    This is :func:`mopps_select` with its Thompson draws injected (docs/allocators.md §5.5: draws
    ``[0.10, 0.45, 0.70, 0.52]``, P = 2, target 0.5 select ``[3, 1]``). Returns int32 ``idx`` of shape
    ``(num_select,)``, distinct indices into the window.
    """
    draws_C = _check_vector(draws_C, "draws_C")
    if not jnp.issubdtype(draws_C.dtype, jnp.floating):
        raise ValueError(f"draws_C must be a floating-point array (sampled success rates), got {draws_C.dtype}")
    validation.check_probabilities_any(draws_C, "draws_C")
    num_select = _check_num_select(num_select, draws_C.shape[0])
    target_rate = _check_real(target_rate, "target_rate", 0.0, 1.0)
    return _closest_to_target(draws_C, num_select=num_select, target_rate=target_rate)


def mopps_select(posterior: BetaPosterior, num_select: int, key: Array, target_rate: float = 0.5) -> Array:
    """MoPPS's prompt selection (arXiv 2507.04632): Thompson sampling of the candidates' success rates.

    Published rule (thu-rllab/MoPPS @ a883f519 ``recipe/ours/mopps.py`` ``PosteriorSampler.sample_batch``, the
    "topk" mode; README equations; docs/allocators.md §5): the dataloader yields ``ts_ratio * P`` candidates
    (``ts_ratio`` 16 for math, 8 for countdown / geo3k); draw ``gamma_i ~ Beta(alpha_i, beta_i)`` for each; keep
    the P with the smallest ``(gamma_i - gamma*)^2``, ``gamma* = 0.5`` (``torch.topk``); the rest are dropped for
    this pass. Each kept prompt gets n rollouts; its posterior is then updated (:func:`mopps_posterior`).

    Adaptations: ``posterior`` covers the trainer's window of the next C prompts of the shared stream (as
    published, not the whole dataset); ties (probability 0 under continuous draws) go to the lower index; at a
    budget B the counts are ``B // P`` with +1 for the first ``B mod P`` prompts in the returned (selection)
    order. The "threshold" variant (random among draws in [0.3, 0.7]) is not implemented.

    ``key``: a JAX PRNG key (the draws are ``jax.random.beta(key, alpha, beta)``). Returns int32 ``idx`` of
    shape ``(num_select,)``: distinct window indices, closest to the target first.
    """
    posterior = _check_posterior(posterior, check=True)
    draws_C = jax.random.beta(key, posterior.alpha, posterior.beta)
    num_select = _check_num_select(num_select, draws_C.shape[0])
    target_rate = _check_real(target_rate, "target_rate", 0.0, 1.0)
    return _closest_to_target(draws_C, num_select=num_select, target_rate=target_rate)


# ---------------------------------------------------------------------------------------------------------
# GRESO: skip prompts whose recent groups were all correct (easy) or all wrong (hard), with adaptive odds.

GRESO_INITIAL_P = 0.5  # p_e = p_h = 0.5 at the start
GRESO_MIN_KEEP = 0.01  # the keep probability max(p^z, 0.01): a prompt is never skipped for sure


class SkipState(NamedTuple):
    """GRESO's per-prompt visit streaks (over all ``num_keys`` dataset prompts) and its two adaptive bases.

    ``easy_streak`` / ``hard_streak``: int32 ``(num_keys,)``, the number of trailing visits whose group was all
    correct (K = n) / all wrong (K = 0): GRESO's ``z_e`` / ``z_h`` read off its per-prompt trace. At most one of
    the two is > 0 (a visit ends the other streak). ``p_easy`` / ``p_hard``: float32 scalars, start 0.5.
    """

    easy_streak: Array
    hard_streak: Array
    p_easy: Array
    p_hard: Array


def skip_state_init(num_keys: int) -> SkipState:
    """No visits yet (every streak 0, so nothing is skipped) and ``p_e = p_h = 0.5``."""
    num_keys = validation.check_int(num_keys, "num_keys", minimum=1)
    zeros = jnp.zeros((num_keys,), jnp.int32)
    start = jnp.asarray(GRESO_INITIAL_P, jnp.float32)
    return SkipState(zeros, zeros, start, start)


def _skip_probability(state: SkipState, keys_C: Array) -> Array:
    easy_C = state.easy_streak[keys_C]
    hard_C = state.hard_streak[keys_C]
    dtype = state.p_easy.dtype
    skip_easy_C = 1.0 - jnp.maximum(state.p_easy ** easy_C.astype(dtype), GRESO_MIN_KEEP)
    skip_hard_C = 1.0 - jnp.maximum(state.p_hard ** hard_C.astype(dtype), GRESO_MIN_KEEP)
    # The hard rule only applies when the last visit was hard; then there is no easy streak (the easy rule wins
    # in a hand-made state with both, as the published code tries it first).
    return jnp.where(easy_C > 0, skip_easy_C, jnp.where(hard_C > 0, skip_hard_C, 0.0)).astype(dtype)


def greso_skip_probability(state: SkipState, keys_C: Array) -> Array:
    """GRESO's probability of skipping each candidate before rollout (arXiv 2506.02177, docs/allocators.md §4).

    Published rule (Infini-AI-Lab/GRESO @ b2778431 ``verl/trainer/ttis/presampling_selector.py``
    ``DataProfiler.easy_probabilistic_skip``, ``hard_probabilistic_skip``, ``filter_examples_all_probabilistic``):
    with ``z_e`` the number of trailing visits with group-mean reward >= 0.98, skip with probability
    ``1 - max(p_e^z_e, 0.01)`` (never when z_e = 0); if not skipped as easy and the last visit's mean is <= 0.11,
    with ``z_h`` the number of trailing visits <= 0.11, skip with probability ``1 - max(p_h^z_h, 0.01)``.

    Adaptation (binary rewards, the doc's recommendation): easy <=> K = n, hard <=> K = 0, so the trace is
    summarised by the two streaks of :class:`SkipState`, at most one of which is > 0. The combined probability is
    then the easy one when ``z_e > 0``, the hard one when ``z_h > 0``, else 0. Example (§4.5): p_e = 0.5 and
    z_e = 2 give 0.75; p_h = 0.5 and z_h = 3 give 0.875; a last visit that was mixed gives 0.

    Returns ``prob_C`` in the state's float dtype (float32).
    """
    keys_C = _check_keys(keys_C, state.easy_streak.shape[0], "keys_C")
    return _skip_probability(state, keys_C)


def _skip_coins(key_or_uniforms, num_candidates: int, dtype) -> Array:
    """The C skip coins: given uniforms (a float array of shape (C,) in [0, 1]) or drawn from a PRNG key."""
    x = key_or_uniforms
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.uniform(x, (num_candidates,), dtype)
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):  # a raw key, e.g. jax.random.PRNGKey(0)
        return jax.random.uniform(x, (num_candidates,), dtype)
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.shape != (num_candidates,):
        raise ValueError(f"key_or_uniforms must be a PRNG key or a float array of C = {num_candidates} uniforms, "
                         f"got dtype {x.dtype} and shape {x.shape}")
    validation.check_probabilities_any(x, "key_or_uniforms")
    return x.astype(dtype)


@functools.partial(jax.jit, static_argnames=("num_select",))
def _greso_select_impl(state, keys_C, uniforms_C, num_select):
    skipped_C = uniforms_C < _skip_probability(state, keys_C)
    # Survivors first, then the skipped ones, each in candidate order (a stable sort on the skip flag): the
    # first num_select are the walk's survivors, filled with the earliest skipped candidates if too few survive.
    walk_order_C = jnp.argsort(skipped_C.astype(jnp.int32), stable=True)
    return jnp.sort(walk_order_C[:num_select]).astype(jnp.int32)


def greso_select(state: SkipState, keys_C: Array, num_select: int, key_or_uniforms) -> Array:
    """GRESO's pre-rollout selection from a window of C candidates (arXiv 2506.02177, docs/allocators.md §4).

    Published (Infini-AI-Lab/GRESO @ b2778431 ``filter_examples_all_probabilistic``; ``verl/trainer/ppo/
    ray_trainer.py`` ``fit``): walk the shuffled prompt stream, skip each prompt with its probability
    (:func:`greso_skip_probability`; skips cost nothing) and roll out the survivors, in sampling batches, until
    the step's groups are filled.

    Here: walk the C candidates in order; candidate i is skipped iff ``u_i < prob_i``; keep the first
    ``num_select`` survivors. Fixed-window adaptation: the published code walks an unbounded stream, so it never
    runs short; a window can, and then it is filled with the skipped candidates in candidate order (the earliest
    first), so exactly ``num_select`` prompts are rolled out every step. (With ``C`` large enough for the skip
    rates this rarely triggers.)

    ``key_or_uniforms``: a PRNG key (coins ``jax.random.uniform(key, (C,))``) or the C coins themselves.
    Returns int32 ``idx`` of shape ``(num_select,)``: distinct window indices in candidate (ascending) order.
    """
    keys_C = _check_keys(keys_C, state.easy_streak.shape[0], "keys_C")
    num_select = _check_num_select(num_select, keys_C.shape[0])
    uniforms_C = _skip_coins(key_or_uniforms, keys_C.shape[0], state.p_easy.dtype)
    return _greso_select_impl(state, keys_C, uniforms_C, num_select=num_select)


def _fewest_reaching(num_groups: int, target: float) -> int:
    """The smallest count c with ``c / num_groups >= target`` in float64 (the published ratio comparison), so the
    traced decision is an exact integer one (1/12 vs 0.25/3 is a tie, not float32 noise); num_groups + 1 if none."""
    c = max(0, math.ceil(target * num_groups) - 1)
    while c <= num_groups and not c / num_groups >= target:
        c += 1
    while c > 0 and (c - 1) / num_groups >= target:
        c -= 1
    return c


@functools.partial(jax.jit, static_argnames=("easy_min", "hard_min", "step_size", "p_min", "p_max"))
def _greso_update_impl(state, keys_P, successes_P, counts_P, epoch_started, easy_min, hard_min, step_size, p_min,
                       p_max):
    all_correct_P = successes_P == counts_P
    all_wrong_P = successes_P == 0
    # A visit extends its own streak and ends the other; a mixed group ends both.
    easy_streak = state.easy_streak.at[keys_P].set(jnp.where(all_correct_P, state.easy_streak[keys_P] + 1, 0))
    hard_streak = state.hard_streak.at[keys_P].set(jnp.where(all_wrong_P, state.hard_streak[keys_P] + 1, 0))

    def adapt(p, at_target):  # at or above the target zero-variance share: skip more (lower p), else less
        moved = jnp.clip(p + jnp.where(at_target, -step_size, step_size), p_min, p_max).astype(p.dtype)
        return jnp.where(epoch_started, moved, p)

    p_easy = adapt(state.p_easy, jnp.sum(all_correct_P) >= easy_min)
    p_hard = adapt(state.p_hard, jnp.sum(all_wrong_P) >= hard_min)
    return SkipState(easy_streak.astype(jnp.int32), hard_streak.astype(jnp.int32), p_easy, p_hard)


def greso_update(state: SkipState, keys_P: Array, successes_P: Array, counts_P: Array, *, epoch_started,
                 target_zero_variance: float = 0.25, step_size: float = 0.01, p_min: float = 0.05,
                 p_max: float = 0.95) -> SkipState:
    """GRESO's update after a step's rollouts (arXiv 2506.02177, docs/allocators.md §4).

    ``keys_P`` are the prompts rolled out this step (distinct), with ``successes_P`` out of ``counts_P``.

    * Traces -> streaks: an all-correct group (K = n) adds 1 to the prompt's easy streak and resets its hard
      streak; all-wrong (K = 0): hard + 1, easy 0; mixed: both 0. (Published: a (epoch, group-mean) entry per
      visit, thresholds 0.98 / 0.11; with binary rewards easy <=> K = n, hard <=> K = 0, the doc's recommendation.
      The code counts a hard group as rewards all exactly 0.1, always false for binary rewards, which would push
      p_h to p_max; we count K = 0 instead.)
    * Adaptation (``ray_trainer.py`` ``fit``, ``__init__`` targets): with ``alpha = target_zero_variance``, the
      fraction of this step's groups that are all correct is compared with ``alpha / 3``, the all-wrong fraction
      with ``2 alpha / 3``; at or above its target a p is lowered by ``step_size`` (skip more), else raised; then
      clipped to ``[p_min, p_max]``. Applied only when ``epoch_started`` (a Python or traced bool): the published
      code adapts once epoch > 0. The comparison is the float64 ``count / P >= target``, made an exact integer
      test. Example (§4.5): an easy fraction of 0.10 >= 1/12 takes p_e 0.5 -> 0.49; a hard fraction 0.10 < 1/6
      takes p_h 0.5 -> 0.51.

    Returns the new :class:`SkipState` (streaks of the other prompts unchanged).
    """
    num_keys = state.easy_streak.shape[0]
    keys_P = _check_keys(keys_P, num_keys, "keys_P", distinct=True)
    num_groups = keys_P.shape[0]
    successes_P, counts_P = jnp.asarray(successes_P), jnp.asarray(counts_P)
    for name, x in (("successes_P", successes_P), ("counts_P", counts_P)):
        if x.shape != (num_groups,):
            raise ValueError(f"{name} must have shape (P,) = ({num_groups},) like keys_P, got {x.shape}")
    if not validation.is_traced(successes_P, counts_P):
        s, n = np.asarray(successes_P), np.asarray(counts_P)
        if np.any(n < 1) or np.any(n != np.round(n)):
            raise ValueError("counts_P must be integers >= 1 (rollouts per visited prompt)")
        if np.any(s < 0) or np.any(s > n) or np.any(s != np.round(s)):
            raise ValueError("successes_P must be integers in [0, counts_P]")
    alpha = _check_real(target_zero_variance, "target_zero_variance", 0.0, 1.5)
    step_size = _check_real(step_size, "step_size", 0.0, 1.0)
    p_min = _check_real(p_min, "p_min", 0.0, 1.0)
    p_max = _check_real(p_max, "p_max", 0.0, 1.0)
    if p_min > p_max:
        raise ValueError(f"p_min ({p_min}) must be <= p_max ({p_max})")
    return _greso_update_impl(state, keys_P, successes_P, counts_P, jnp.asarray(epoch_started, jnp.bool_),
                              easy_min=_fewest_reaching(num_groups, alpha / 3),
                              hard_min=_fewest_reaching(num_groups, 2 * alpha / 3),
                              step_size=step_size, p_min=p_min, p_max=p_max)
