"""SERA's allocation rule as its authors released it (``dynamic_active_equalized``), exact to the integer count.

Source: ChenZihao0121/SERA @ 3252ed5, ``verl/trainer/ppo/SERA.py`` (``allocate_rollouts_from_probabilities`` with
its default mode; the trainer's use is in ``ray_trainer.py``). Restated here in ``jax.numpy``, jittable, with the
budget and bounds as traced scalars (one compilation per number of prompts and dtype).

With point estimates ``p_i`` strictly inside (0, 1), a budget B (the authors': ``B = P N0``) and bounds
``n_min <= N_i <= n_max`` for the prompts that are sampled at all:

1. **Score.** ``u_i = 1 - (1-p_i)^n_max - p_i^n_max``: the chance of a mixed group (some successes, some failures)
   at the cap, the most signal the prompt can give. Prompts with ``u_i >= threshold`` (0.05) are *eligible*.
2. **Active set.** Rank the prompts by ``u`` (descending, ties by index). The active set is the top ``k`` of that
   ranking, ``k`` found by binary search over ``[ceil((B - P f) / (n_max - f)), #eligible]`` (``f`` the floor
   below): the largest ``k`` the search meets whose *allocated* counts (steps 3-4 on the top k alone) keep every
   active prompt's mixed-group chance ``1 - (1-p)^N - p^N`` at or above the threshold. Rounding makes that test
   non-monotone in ``k``, so this is the search's answer, not always the largest passing ``k``; when no ``k`` it
   tries passes, or fewer prompts are eligible than the budget needs under ``n_max``, ``k`` is the lower end.
3. **Waterline** on the active prompts with their budget: MaxRL's centred factor ``1 - (1-p)^(N-b)`` (b = 1) is
   equal across prompts when ``N_i = b + tau / lambda_i``, ``lambda_i = -log(1 - p_i)``; with the bounds
   ``N_i(tau) = clip(b + tau / lambda_i, n_min, n_max)``, and ``tau`` is the lower end of a 100-step bisection
   in ``log tau`` on ``sum_i N_i(tau) > budget``, bracketed by ``[(n_min - b) min lambda, (n_max - b) max lambda]``.
4. **Floor and refill.** ``N_i = floor(N_i(tau))``; the rollouts left go one each to the prompts below
   ``n_max`` whose squared distance of ``1 - (1-p)^(N-b)`` to the target ``1 - exp(-tau)`` grows least with one
   more rollout (ties by index).
5. **Inactive prompts** get ``f`` rollouts: 0 (the authors' default: never sampled, weight 0 in the loss) or the
   rollouts a pilot already spent on every prompt (their ``inactive_floor = n_min`` mode).

The loss then weighs active prompt i's rollouts by ``N0 / N_i`` inside a batch mean over all ``B = P N0`` rows,
which is the multiplicity correction ``1 / (P N_i)`` of ``core.weights`` (inactive prompts have no rows).

How this relates to ``sera_all_active`` (``core.allocation.all_active_counts``, the exact discrete max–min of
``min_i s(p_i, N_i)`` over every prompt): the authors' all-active mode ``bias_equalized`` is steps 3-4 over all
prompts; its continuous counts are the same waterline, and its rounding minimises the squared distance to the
level rather than raising the minimum, so the two agree up to one rollout per prompt. The released rule differs
where it matters: prompts with little chance of a mixed group even at the cap get no rollouts at all.

Bisections stop early once their bracket no longer moves (each step is a function of the bracket alone, so the
rest of the 100 steps would change nothing): the counts are the 100-step ones, at a fraction of the cost.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import validation

Array = jnp.ndarray

DEFAULT_THRESHOLD = 0.05  # activation_useful_threshold in the authors' ppo_trainer.yaml
BISECTION_STEPS = 100  # _continuous_waterline's max_iterations
USEFUL_TOLERANCE = 1e-12  # the authors' slack on the threshold when testing allocated counts


class ReleasedAllocation(NamedTuple):
    """The released rule's decision for one step's prompts."""

    counts_P: Array  # int32 rollouts per prompt: 0 (or the floor) for inactive prompts
    active_P: Array  # bool: the prompts the rule equalises (sampled beyond the floor, weighted in the loss)
    tau: Array  # the waterline level: the active prompts' target factor is 1 - exp(-tau)
    score_P: Array  # u_i = 1 - (1-p_i)^n_max - p_i^n_max, the chance of a mixed group at the cap


def mixed_group_chance(p_P: Array, counts_P: Array) -> Array:
    """``P(0 < K < N) = 1 - (1-p)^N - p^N`` for ``K ~ Binomial(N, p)``, clipped to [0, 1]; 0 where N = 0.
    ``p_P`` probabilities, ``counts_P >= 0`` (broadcastable)."""
    p_P = jnp.asarray(p_P)
    validation.check_probabilities_any(p_P, "p_P")
    validation.require(counts_P, lambda n: ~(n >= 0), "counts_P must be >= 0 (rollouts per prompt)")
    n = jnp.asarray(counts_P, p_P.dtype)
    chance = 1.0 - jnp.power(1.0 - p_P, n) - jnp.power(p_P, n)
    return jnp.where(counts_P > 0, jnp.clip(chance, 0.0, 1.0), 0.0)


def _sortable(x: Array) -> Array:
    """An integer key with the float order of ``x`` (-0.0 folded into +0.0), for exact k-th smallest searches."""
    int_type = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.zeros_like(x), x), int_type)
    flip = jnp.asarray(np.iinfo(np.dtype(int_type)).max, int_type)
    return jnp.where(bits < 0, bits ^ flip, bits)


def _first_by_int_key(int_key: Array, eligible_P: Array, num: Array) -> Array:
    """Mask of the ``num`` eligible entries with the smallest integer keys, ties by index (a stable sort's first
    ``num``): the ``num``-th smallest key by bisection over the integers (O(P) a step, no sort: XLA's CPU sort
    of a million keys costs more than the whole rest of the rule)."""
    info = np.iinfo(np.dtype(int_key.dtype))

    def body(_, bracket):
        lo, hi = bracket  # fewer than num keys <= lo (or lo is the smallest integer); at least num keys <= hi
        mid = (lo & hi) + ((lo ^ hi) >> 1)  # floor((lo + hi) / 2) without overflowing
        enough = jnp.sum(eligible_P & (int_key <= mid)) >= num
        return jnp.where(enough, lo, mid), jnp.where(enough, mid, hi)

    bits = int_key.dtype.itemsize * 8
    _, t = jax.lax.fori_loop(0, bits, body, (jnp.asarray(info.min, int_key.dtype),
                                             jnp.asarray(info.max, int_key.dtype)))
    below = eligible_P & (int_key < t)
    tied = eligible_P & (int_key == t)
    take = below | (tied & (jnp.cumsum(tied) <= num - jnp.sum(below)))
    return take & (num > 0)


def _smallest_by_key(key_P: Array, eligible_P: Array, num: Array) -> Array:
    """Mask of the ``num`` eligible entries with the smallest float keys, ties by index."""
    return _first_by_int_key(_sortable(key_P), eligible_P, num)


def _waterline(lam_P: Array, active_P: Array, budget: Array, n_min: Array, n_max: Array, offset: int):
    """Continuous counts ``clip(b + tau / lambda, n_min, n_max)`` of the active prompts and tau (see step 3)."""
    dtype = lam_P.dtype
    big = jnp.asarray(jnp.finfo(dtype).max, dtype)
    lam_lo = jnp.min(jnp.where(active_P, lam_P, big))
    lam_hi = jnp.max(jnp.where(active_P, lam_P, 0.0))
    eff_min, eff_max = (n_min - offset).astype(dtype), (n_max - offset).astype(dtype)
    smallest = jnp.asarray(np.finfo(np.dtype(dtype)).smallest_subnormal, dtype)
    tau_lo = jnp.where(eff_min > 0, eff_min * lam_lo, smallest)
    # XLA may flush a subnormal to zero: keep the bracket's lower end finite in log space.
    log_lo = jnp.where(tau_lo > 0, jnp.log(tau_lo), jnp.log(jnp.asarray(np.finfo(np.dtype(dtype)).tiny, dtype)))
    log_hi = jnp.log(eff_max * lam_hi)
    n_min_f, n_max_f = n_min.astype(dtype), n_max.astype(dtype)
    budget_f = budget.astype(dtype)

    def continuous(tau):
        return jnp.clip(offset + tau / lam_P, n_min_f, n_max_f)

    def step(state):
        i, lo, hi, _ = state
        mid = 0.5 * (lo + hi)
        over = jnp.sum(jnp.where(active_P, continuous(jnp.exp(mid)), 0.0)) > budget_f
        new_lo, new_hi = jnp.where(over, lo, mid), jnp.where(over, mid, hi)
        return i + 1, new_lo, new_hi, (new_lo != lo) | (new_hi != hi)

    _, lo, _, _ = jax.lax.while_loop(lambda s: (s[0] < BISECTION_STEPS) & s[3], step,
                                     (jnp.int32(0), log_lo, log_hi, jnp.bool_(True)))
    tau = jnp.exp(lo)
    # At B = k n_min every active prompt sits at n_min; the authors report the level of the easiest one.
    at_floor = budget == jnp.sum(active_P) * n_min
    tau = jnp.where(at_floor, eff_min * lam_lo, tau)
    cont_P = jnp.where(at_floor, n_min_f, continuous(tau))
    return cont_P, tau


def _growth(p_P: Array, m_P: Array, tau: Array) -> Array:
    """How much one more rollout moves a prompt's factor ``s = 1 - q^m`` (q = 1 - p, m = N - b) away from the
    target ``t = 1 - e^-tau``: ``(s(m+1) - t)^2 - (s(m) - t)^2``, computed as the authors' float64 code does.

    Near 1 the factors differ from 1 by less than float64 resolves, and the authors' squares then round to 0
    (at tau > ~37 every prompt ties and the index decides). Float64 inputs use their expression as written. In
    float32 we hold the defects ``d = 1 - s`` instead, each rounded to float64's grid below 1 (multiples of
    2^-53), and use ``(d(m+1) - d(m)) (d(m+1) + d(m) - 2 d_t)``, which equals their difference of squares:
    float32 alone would keep nothing of those squares at tau ~ 17, and would break ties where theirs do not."""
    dtype = p_P.dtype
    log_q = jnp.log1p(-p_P)
    m = m_P.astype(dtype)
    if dtype == jnp.float64:
        target = -jnp.expm1(-tau)
        now, after = -jnp.expm1(log_q * m), -jnp.expm1(log_q * (m + 1))
        return (after - target) ** 2 - (now - target) ** 2
    grid = jnp.asarray(2.0**53, dtype)

    def defect(x):  # 1 - s of s = 1 - x as a float64 holds it (on [0.5, 1) its spacing is 2^-53)
        return jnp.round(x * grid) / grid

    d_now, d_after, d_target = defect(jnp.exp(log_q * m)), defect(jnp.exp(log_q * (m + 1))), defect(jnp.exp(-tau))
    return (d_after - d_now) * (d_after + d_now - 2.0 * d_target)


def _round(p_P: Array, active_P: Array, cont_P: Array, tau: Array, budget: Array, n_min: Array, n_max: Array,
           offset: int) -> Array:
    """Floor the continuous counts, then refill by the smallest growth of the squared distance (step 4)."""
    counts_P = jnp.where(active_P, jnp.clip(jnp.floor(cont_P).astype(jnp.int32), n_min, n_max), 0)
    remaining = budget - jnp.sum(counts_P)
    growth = _growth(p_P, counts_P - offset, tau)
    candidates = active_P & (counts_P < n_max)
    return counts_P + _smallest_by_key(growth, candidates, remaining).astype(jnp.int32)


def _active_waterline(active_P: Array, lam_P: Array, budget: Array, floor: Array, n_min: Array, n_max: Array,
                      offset: int):
    """Step 3 over the ``active_P`` prompts: (their budget, continuous counts, tau). Every prompt already holds
    ``floor`` rollouts: the active ones share the rest of the budget on top of theirs."""
    active_budget = budget - (active_P.shape[0] - jnp.sum(active_P)) * floor
    cont_P, tau = _waterline(lam_P, active_P, active_budget, n_min, n_max, offset)
    return active_budget, cont_P, tau


@functools.partial(jax.jit, static_argnames=("offset",))
def _released_impl(p_P, budget, n_min, n_max, floor, threshold, offset):
    num_prompts = p_P.shape[0]
    lam_P = -jnp.log1p(-p_P)
    score_P = mixed_group_chance(p_P, jnp.full((num_prompts,), n_max, jnp.int32))
    log_q_P, log_p_P = jnp.log1p(-p_P), jnp.log(p_P)

    def below_threshold(counts_P):
        # mixed_group_chance < threshold, from the logs taken once (pow is exp(n log x) here too): the search
        # asks this of every prompt several times per candidate k, and the two powers were its costliest part.
        n = counts_P.astype(p_P.dtype)
        chance = jnp.clip(1.0 - jnp.exp(n * log_q_P) - jnp.exp(n * log_p_P), 0.0, 1.0)
        return (counts_P > 0) & (chance < threshold - USEFUL_TOLERANCE)
    # The ranking: descending score, ties by index. The top k are the k smallest of these keys.
    rank_key_P = _sortable(-score_P)
    everyone_P = jnp.ones(num_prompts, bool)

    def top(k):
        return _first_by_int_key(rank_key_P, everyone_P, k)
    eligible = jnp.sum(score_P >= threshold).astype(jnp.int32)
    required = (budget - num_prompts * floor + (n_max - floor) - 1) // (n_max - floor)  # ceil, >= 1

    def useful(k):
        """Whether k active prompts all keep a mixed-group chance >= threshold at their allocated counts. The
        chance grows with N, and the refill adds at most one rollout a prompt: the floored counts decide unless
        some prompt fails at its floor but passes with one more, and only then is the refill computed."""
        active_P = top(k)
        active_budget, cont_P, tau = _active_waterline(active_P, lam_P, budget, floor, n_min, n_max, offset)
        floored_P = jnp.where(active_P, jnp.clip(jnp.floor(cont_P).astype(jnp.int32), n_min, n_max), 0)
        low_P = active_P & below_threshold(floored_P)
        raised_P = jnp.minimum(floored_P + 1, n_max)
        hopeless_P = active_P & below_threshold(raised_P)

        def with_refill():
            counts_P = _round(p_P, active_P, cont_P, tau, active_budget, n_min, n_max, offset)
            return ~jnp.any(active_P & below_threshold(counts_P))

        return jax.lax.cond(~jnp.any(low_P), lambda: True,
                            lambda: jax.lax.cond(jnp.any(hopeless_P), lambda: False, with_refill))

    def search(state):
        low, high, best = state
        middle = (low + high) // 2
        ok = useful(middle)
        return jnp.where(ok, middle + 1, low), jnp.where(ok, high, middle - 1), jnp.where(ok, middle, best)

    _, _, best = jax.lax.while_loop(lambda s: s[0] <= s[1], search, (required, eligible, required))
    active_P = top(best)
    active_budget, cont_P, tau = _active_waterline(active_P, lam_P, budget, floor, n_min, n_max, offset)
    counts_P = jnp.where(active_P, _round(p_P, active_P, cont_P, tau, active_budget, n_min, n_max, offset), floor)
    return ReleasedAllocation(counts_P.astype(jnp.int32), active_P, tau, score_P)


def check_released_problem(num_prompts: int, budget, n_min, n_max, floor, threshold) -> None:
    """ValueError naming the argument for a problem the released rule cannot solve (static arguments)."""
    for name, value in (("budget", budget), ("n_min", n_min), ("n_max", n_max), ("floor", floor)):
        validation.check_int(value, name, minimum=0)
    if n_min < 1 or n_min > n_max:
        raise ValueError(f"n_min ({n_min}) must be >= 1 and <= n_max ({n_max})")
    if n_max < 2:
        raise ValueError(f"n_max ({n_max}) must be >= 2: the waterline spreads rollouts above one a prompt")
    if floor >= n_max:
        raise ValueError(f"floor ({floor}) must be < n_max ({n_max}): 0 (inactive prompts unsampled) or the rollouts "
                         "a pilot already spent on every prompt")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or not (
            0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold (the activation threshold on the mixed-group chance) must be in [0, 1], "
                         f"got {threshold!r}")
    if num_prompts < 1:
        raise ValueError("p_P must contain at least one prompt")
    # Any k active prompts between ceil((B - P f) / (n_max - f)) and P must fit n_min each on top of the others'
    # floors. At B = P f (a pilot that spent the whole budget) every prompt keeps its floor.
    low = max(num_prompts * n_min, num_prompts * floor)
    if not low <= budget <= num_prompts * n_max:
        raise ValueError(f"infeasible budget {budget}: with {num_prompts} prompts, n_min={n_min}, n_max={n_max} and "
                         f"floor={floor} it must lie in [{low}, {num_prompts * n_max}]")


def released_allocation(p_P, budget: int, *, n_min: int = 2, n_max: int, floor: int = 0,
                        threshold: float = DEFAULT_THRESHOLD, offset: int = 1, check: bool = True
                        ) -> ReleasedAllocation:
    """The released rule's counts, active set, waterline and scores (module docstring).

    ``p_P``: estimates, shape (P,), in [0, 1] (the authors require (0, 1); 0 and 1 score 0 and are never active
    unless the budget forces them: the waterline then gives p = 0 n_max and p = 1 n_min). ``floor``: rollouts every
    prompt already has (0, or a pilot's n0). ``offset``: the factor's b in ``1 - (1-p)^(N-b)`` (1: MaxRL's
    centred estimator, the authors'). Jittable; ``budget``, bounds, floor and threshold are static Python numbers
    checked here, passed to one compiled program per (P, dtype). Bad input raises ValueError (traced ``p_P``: at
    run time, unless ``check=False``).
    """
    p_P = jnp.asarray(p_P)
    if p_P.ndim != 1:
        raise ValueError(f"p_P must have shape (P,), got {p_P.shape}")
    if not jnp.issubdtype(p_P.dtype, jnp.floating):
        raise ValueError(f"p_P must be a floating-point array, got dtype {p_P.dtype}")
    check_released_problem(p_P.shape[0], budget, n_min, n_max, floor, threshold)
    validation.check_probabilities_any(p_P, "p_P", check)
    # The p = 1 limit: lambda = inf gives N = b, clipped to n_min; p = 0: lambda = 0 gives n_max.
    i32 = np.int32
    return _released_impl(p_P, i32(budget), i32(n_min), i32(n_max), i32(floor), np.dtype(p_P.dtype).type(threshold),
                          offset=offset)
