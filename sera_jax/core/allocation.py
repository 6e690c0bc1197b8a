"""SERA's fixed-budget max–min rollout allocation (docs/method.md §3).

Problem: given success-rate estimates ``p_hat_i``, a budget ``B = sum_i N_i`` and bounds
``n_min <= N_i <= n_max``, maximise ``min_i s(p_hat_i, N_i)``.

* :func:`waterline` solves the continuous relaxation of the power-law family ``s = 1 - (1-p)^(N-b)``:
  ``N_i(tau) = clip(b + tau / lambda_i, n_min, n_max)`` with ``lambda_i = -log(1 - p_hat_i)``, and the
  waterline ``tau`` found by bisection in log tau followed by one exact linear solve.
* :func:`all_active_counts` returns integer counts attaining the **exact discrete** max–min over every prompt (the
  registry's ``sera_all_active``; ``sera_jax.allocate`` calls it by that name). Think of the
  ``B - P n_min`` extra rollouts as "steps": step (i, n) takes prompt i from n to n + 1 rollouts and
  has key ``s(p_hat_i, n)`` (any increasing transform of it). The one-rollout-at-a-time greedy that always
  feeds the prompt with the smallest current factor is optimal for a max–min of increasing functions,
  and it takes exactly the ``B - P n_min`` smallest steps in the order (key, n, i) — ties go to the prompt
  with fewer rollouts, then the lower index. We find the (B - P n_min)-th smallest key by bisection over
  the bit patterns of non-negative floats (exact, no sort), take every step below it, and share the tied
  steps by (n, i).
  Cost: O(P) per iteration, 31 iterations in float32 (63 in float64).
* Token budgets (``costs_P``: ``l_i`` tokens per rollout of prompt i, e.g. its expected response length; with
  slot refill the sampler costs ``sum_i l_i N_i``): maximise the same minimum subject to
  ``sum_i l_i N_i <= budget``. :func:`waterline` weights its budget by ``l_i`` (equal factors still mean
  ``N_i = b + tau / lambda_i``); :func:`all_active_counts` returns the costed greedy's counts: the same steps in the same
  (key, n, i) order, each taken if its cost fits what is left. Its value is the exact discrete max–min (proof in
  :func:`all_active_counts`); it runs as a few rounds of the bisection above, a new one each time a step that does not fit freezes a prompt.

Keys (all >= 0, non-decreasing in n):
  * power law (``maxrl``, ``maxrl_no_baseline``): ``-log(1 - s) = (n - b) lambda_i``, counted in closed form;
  * Beta posterior (uncertainty-aware, pass a :class:`BetaPosterior`):
    ``-log(1 - E[s]) = log B(a, b') - log B(a, b' + n - b)`` since ``E[(1-p)^m] = B(a, b'+m) / B(a, b')``
    (power law); for other estimators ``E[s]`` itself, the exact Beta-binomial sum, tabulated;
  * any other estimator whose factor depends on N (``grpo``): ``s`` itself, tabulated for
    n in [n_min, n_max) (O(P (n_max - n_min)) memory).

Shape letters: P prompts, N rollouts per prompt (``N_i``), B the budget (rows of the flat layout),
M = n_max - n_min steps per prompt (the columns of a key table).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.scipy.special import betaln

from sera_jax.core import validation
from sera_jax.core.estimators import Estimator, get_estimator
from sera_jax.core.scale_factors import (beta_binomial_scale_factor, binomial_scale_factor, check_beta,
                                         power_posterior_factor)

Array = jnp.ndarray


class BetaPosterior(NamedTuple):
    """Per-prompt Beta(alpha, beta) beliefs about the success rate; allocate on the expected factor."""

    alpha: Array
    beta: Array

    @property
    def mean(self) -> Array:
        return self.alpha / (self.alpha + self.beta)


# The all-active rules of :func:`all_active_counts`, by their registry names (``core.allocators``).
ALL_ACTIVE_METHODS = ("sera_all_active", "uniform")


# ---------------------------------------------------------------------------------------------------------
# Validation of the static problem description.


def check_problem(num_prompts: int, budget, n_min, n_max, est: Estimator) -> tuple[int, int, int]:
    """Validates the static part of an allocation problem; returns (budget, n_min, n_max) as ints."""
    budget = validation.check_int(budget, "budget")
    n_min, n_max = _check_bounds(num_prompts, n_min, n_max, est)
    if budget < num_prompts * n_min or budget > num_prompts * n_max:
        raise ValueError(
            f"infeasible budget {budget}: with {num_prompts} prompts and {n_min} <= N_i <= {n_max} it must lie in "
            f"[{num_prompts * n_min}, {num_prompts * n_max}]")
    return budget, n_min, n_max


def check_costed_problem(num_prompts: int, budget, n_min, n_max, est: Estimator) -> tuple[float, int, int]:
    """:func:`check_problem` for a token budget: ``budget`` is any finite real > 0 (a static Python number).

    Whether ``sum_i n_min l_i <= budget`` needs the costs: :func:`_check_costs` checks it. A budget above
    ``sum_i n_max l_i`` is allowed (under costs the budget is an upper bound, not spent exactly).
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)):
        raise ValueError(f"budget must be a static Python number (a token budget) when costs_P is given, "
                         f"got {budget!r}")
    budget = float(budget)
    if not np.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be finite and > 0 when costs_P is given, got {budget}")
    n_min, n_max = _check_bounds(num_prompts, n_min, n_max, est)
    return budget, n_min, n_max


def _check_bounds(num_prompts: int, n_min, n_max, est: Estimator) -> tuple[int, int]:
    n_min = validation.check_int(n_min, "n_min", minimum=0)
    n_max = validation.check_int(n_max, "n_max", minimum=1)
    if n_min > n_max:
        raise ValueError(f"n_min ({n_min}) must be <= n_max ({n_max})")
    if n_min < est.min_rollouts:
        raise ValueError(
            f"n_min={n_min} is too small for estimator {est.name!r}: it needs at least "
            f"{est.min_rollouts} rollouts per prompt to give a gradient")
    if num_prompts < 1:
        raise ValueError("p_hat must contain at least one prompt")
    return n_min, n_max


def check_depends_on_n(est: Estimator, method: str = "sera_all_active") -> None:
    """A rule that equalises ``s(p, N)`` across prompts is undefined when s does not move with N."""
    if not est.depends_on_n:
        raise ValueError(
            f"method {method!r} equalises the scale factor s(p, N) across prompts, but estimator {est.name!r} has "
            "one that does not depend on N, so the rule is undefined for it; use method='uniform'")


def _check_p_hat(p_hat, check: bool) -> Array:
    p_hat = jnp.asarray(p_hat)
    if p_hat.ndim != 1:
        raise ValueError(f"p_hat must have shape (P,), got {p_hat.shape}; use jax.vmap for batches of problems")
    if not jnp.issubdtype(p_hat.dtype, jnp.floating):
        raise ValueError(f"p_hat must be a floating-point array, got dtype {p_hat.dtype}")
    validation.check_probabilities_any(p_hat, "p_hat", check)
    return p_hat


def _check_posterior(post: BetaPosterior, check: bool) -> BetaPosterior:
    alpha, beta = jnp.asarray(post.alpha), jnp.asarray(post.beta)
    if alpha.ndim != 1 or alpha.shape != beta.shape:
        raise ValueError(f"posterior alpha and beta must both have shape (P,), got {alpha.shape} and {beta.shape}")
    check_beta(alpha, beta, check)
    return BetaPosterior(alpha, beta)


# Error codes of a cost vector (bit flags, so several problems are reported together).
_COST_NONFINITE, _COST_NONPOSITIVE, _COST_INFEASIBLE = 1, 2, 4


def _total_cost(costs_P: Array, counts_P: Array) -> Array:
    """``sum_i l_i N_i`` in the costs' dtype: the one expression the budget is checked with, everywhere."""
    return jnp.sum(costs_P * counts_P.astype(costs_P.dtype))


def _cost_error_code(costs_P: Array, budget: float, n_min: int) -> Array:
    nonfinite = jnp.any(~jnp.isfinite(costs_P))
    nonpositive = jnp.any(costs_P <= 0)
    infeasible = ~(_total_cost(costs_P, jnp.full(costs_P.shape, n_min, jnp.int32)) <= budget)
    return (nonfinite * _COST_NONFINITE + nonpositive * _COST_NONPOSITIVE
            + (infeasible & ~nonfinite & ~nonpositive) * _COST_INFEASIBLE).astype(jnp.int32)


def _describe_cost_error(code: int, budget: float, n_min: int) -> str:
    problems = []
    if code & _COST_NONFINITE:
        problems.append("costs_P must be finite (expected response lengths); found NaN or infinite values")
    if code & _COST_NONPOSITIVE:
        problems.append("costs_P must be > 0 (expected response lengths); found values <= 0")
    if code & _COST_INFEASIBLE:
        problems.append(f"infeasible budget {budget}: n_min * sum_i costs_P[i] exceeds it (every prompt needs at "
                        f"least n_min={n_min} rollouts)")
    return "; ".join(problems)


def _check_costs(costs_P, num_prompts: int, dtype, budget: float, n_min: int, check: bool) -> Array:
    """Shape (P,), real; finite, > 0 and ``sum_i n_min l_i <= budget`` (eagerly, or at run time when traced)."""
    costs_P = jnp.asarray(costs_P)
    if costs_P.shape != (num_prompts,):
        raise ValueError(f"costs_P must have shape (P,) = ({num_prompts},) like p_hat, got {costs_P.shape}")
    if costs_P.dtype == jnp.bool_ or not (jnp.issubdtype(costs_P.dtype, jnp.floating)
                                         or jnp.issubdtype(costs_P.dtype, jnp.integer)):
        raise ValueError(f"costs_P must be a real (floating-point or integer) array, got dtype {costs_P.dtype}")
    costs_P = costs_P.astype(dtype)
    if not check:
        return costs_P
    code = _cost_error_code(costs_P, budget, n_min)
    if validation.is_traced(costs_P):  # one check a problem: checkify names the first that fails
        for bit in (_COST_NONFINITE, _COST_NONPOSITIVE, _COST_INFEASIBLE):
            checkify.debug_check(code & bit == 0, _describe_cost_error(bit, budget, n_min))
    elif int(code):
        raise ValueError(_describe_cost_error(int(code), budget, n_min))
    return costs_P


# ---------------------------------------------------------------------------------------------------------
# Continuous waterline.


def _rates(p_hat: Array) -> Array:
    """lambda = -log(1 - p): 0 at p = 0, inf at p = 1."""
    return -jnp.log1p(-p_hat)


def _counts_at(tau: Array, lam: Array, offset: int, n_min: int, n_max: int) -> Array:
    """N_i(tau) = clip(b + tau / lambda_i, n_min, n_max), with tau / 0 = inf and tau / inf = 0."""
    ratio = jnp.where(lam > 0, tau / jnp.where(lam > 0, lam, 1.0), jnp.inf)
    return jnp.clip(offset + ratio, n_min, n_max)


def _positive_or_one(x: Array) -> Array:
    return jnp.where(x > 0, x, 1)


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "offset", "iterations"))
def _waterline_impl(p_hat, budget, n_min, n_max, offset, iterations=64, costs_P=None):
    """Solves ``sum_i l_i N_i(tau) = budget``; ``costs_P=None`` means ``l_i = 1`` (the rollout budget), and then
    every sum below is the plain one (the uncosted program is unchanged)."""
    dtype = p_hat.dtype
    lam = _rates(p_hat)
    zero, inf = lam == 0, jnp.isinf(lam)
    finite = ~zero & ~inf

    def weighted_sum(x):
        return jnp.sum(x) if costs_P is None else jnp.sum(costs_P * x)

    num_zero, num_inf = weighted_sum(zero), weighted_sum(inf)  # counts (or costs) of the p = 0 / p = 1 prompts
    num_prompts = p_hat.shape[0] if costs_P is None else jnp.sum(costs_P)
    # Sums just above tau = 0 and just below tau = inf (the p = 0 / p = 1 prompts jump there).
    sum_at_zero = n_min * (num_prompts - num_zero) + n_max * num_zero
    sum_at_inf = n_min * num_inf + n_max * (num_prompts - num_inf)

    big = jnp.asarray(jnp.finfo(dtype).max, dtype)
    lam_f_lo = jnp.where(finite, lam, big)
    lam_f_hi = jnp.where(finite, lam, 0.0)
    log_lo = jnp.log(jnp.min(lam_f_lo) * (n_min - offset)) - 1.0
    log_hi = jnp.log(jnp.max(lam_f_hi) * (n_max - offset)) + 1.0

    def total(log_tau):
        return weighted_sum(_counts_at(jnp.exp(log_tau), lam, offset, n_min, n_max))

    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        above = total(mid) >= budget
        return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

    lo, hi = jax.lax.fori_loop(0, iterations, body, (log_lo, log_hi))
    # Exact solve on the free set (prompts strictly between the bounds): sum is linear in tau there.
    counts_mid = _counts_at(jnp.exp(0.5 * (lo + hi)), lam, offset, n_min, n_max)
    free = finite & (counts_mid > n_min) & (counts_mid < n_max)
    # tau = rest / sum_free l_i / lambda_i, with the sum scaled by the smallest free lambda: 1 / lambda alone
    # overflows float32 for p near the smallest normal (1 / 1.2e-38 = 8.5e37, and a few of them make inf).
    clipped_sum = weighted_sum(jnp.where(free, 0.0, counts_mid))
    lam_ref = jnp.min(jnp.where(free, lam, big))
    scaled_inv_lam = weighted_sum(jnp.where(free, lam_ref / jnp.where(free, lam, 1.0), 0.0))  # lam_ref sum l / lam
    rest = budget - clipped_sum - offset * weighted_sum(free)
    tau_exact = lam_ref * rest / jnp.where(scaled_inv_lam > 0, scaled_inv_lam, 1.0)
    tau = jnp.where(scaled_inv_lam > 0, tau_exact, jnp.exp(0.5 * (lo + hi)))
    interior = _counts_at(tau, lam, offset, n_min, n_max)

    # Budget below the tau -> 0+ sum: the p = 0 prompts share what the others leave at n_min.
    share_zero = (budget - n_min * (num_prompts - num_zero)) / _positive_or_one(num_zero)
    low = jnp.where(zero, share_zero, n_min).astype(dtype)
    # Budget above the tau -> inf sum: the p = 1 prompts share what the others leave at n_max (with costs the
    # budget may exceed sum_i l_i n_max: nothing can spend the rest, and they stop at n_max).
    share_inf = jnp.minimum((budget - n_max * (num_prompts - num_inf)) / _positive_or_one(num_inf), n_max)
    high = jnp.where(inf, share_inf, n_max).astype(dtype)
    return jnp.where(budget <= sum_at_zero, low, jnp.where(budget >= sum_at_inf, high, interior))


def waterline(p_hat, budget, *, n_min: int, n_max: int, estimator: str = "maxrl", check: bool = True,
              costs_P=None) -> Array:
    """Continuous SERA counts: ``N_i = clip(b + tau / lambda_i, n_min, n_max)`` with ``sum_i N_i = budget``.

    The leximin (water-filling) optimum of the continuous relaxation for the power-law estimators
    (``s = 1 - (1-p)^(N-b)``: ``maxrl`` b = 1, ``maxrl_no_baseline`` b = 0). p_hat = 0 gives n_max and
    p_hat = 1 gives n_min; when the budget cannot reach that, those prompts share what is left equally.

    Token budget (``costs_P`` given: ``l_i > 0``, each prompt's expected response length; ``budget`` a real):
    the same waterline with the budget weighted by the costs, ``sum_i l_i N_i(tau) = budget``. Equal factors
    still mean ``N_i = b + tau / lambda_i`` (the costs move only the level tau), and ``sum_i l_i N_i(tau)`` is
    still continuous, non-decreasing and piecewise linear in tau, so the same bisection plus one exact linear
    solve on the free set finds it. The p = 0 (p = 1) prompts share the leftover at equal counts, as above. The
    budget must be at least ``sum_i n_min l_i``; above ``sum_i n_max l_i`` it cannot be spent and every count is
    n_max. With all ``l_i = 1`` and an integer budget this is the rollout-budget waterline.

    Returns:
      float counts of shape (P,) in p_hat's dtype, with ``sum_i N_i`` (``sum_i l_i N_i``) equal to ``budget`` up
      to float rounding.
    """
    est = get_estimator(estimator)
    if est.power_offset is None:
        raise ValueError(
            f"the continuous waterline is defined for the power-law estimators "
            f"(maxrl, maxrl_no_baseline), not {estimator!r}; use sera_jax.allocate() for integer counts")
    p_hat = _check_p_hat(p_hat, check)
    if costs_P is None:
        budget, n_min, n_max = check_problem(p_hat.shape[0], budget, n_min, n_max, est)
        return _waterline_impl(p_hat, budget=budget, n_min=n_min, n_max=n_max, offset=est.power_offset)
    budget, n_min, n_max = check_costed_problem(p_hat.shape[0], budget, n_min, n_max, est)
    costs_P = _check_costs(costs_P, p_hat.shape[0], p_hat.dtype, budget, n_min, check)
    return _waterline_impl(p_hat, budget=budget, n_min=n_min, n_max=n_max, offset=est.power_offset,
                           costs_P=costs_P)


# ---------------------------------------------------------------------------------------------------------
# Discrete waterline: exact max–min integer counts.


def _int_type(dtype):
    return jnp.int64 if jnp.dtype(dtype).itemsize == 8 else jnp.int32


def _to_bits(x: Array) -> Array:
    return jax.lax.bitcast_convert_type(x, _int_type(x.dtype))


def _from_bits(bits: Array, dtype) -> Array:
    return jax.lax.bitcast_convert_type(bits, dtype)


# A step (i, n), n in [n_min, n_max), takes prompt i from n to n + 1 rollouts. A key set is described by
# ``count_le(t)[i] = #{n in [n_min, n_max) : key_i(n) <= t}``, with keys >= +0.0 and non-decreasing in n.


def _power_law_count_le(p_hat: Array, offset: int, n_min: int, n_max: int) -> Callable[[Array], Array]:
    """Keys ``(n - b) lambda_i``: step (i, n) is <= t iff ``n - b <= floor(t / lambda_i)``.

    ``1 / lambda`` is clamped to [2^-100, 2^100] so that no product is NaN: p = 0 steps get keys just above
    zero (increasing in n, so ties among them still go to fewer rollouts first) and p = 1 steps get huge
    finite keys. Keys are thus defined through the one multiplication below, and bisection, ties and the
    final counts all use it: the order of steps is exactly consistent.
    """
    dtype = p_hat.dtype
    tiny, huge = jnp.asarray(2.0**-100, dtype), jnp.asarray(2.0**100, dtype)
    inv_lam = jnp.clip(1.0 / _rates(p_hat), tiny, huge)
    shift = offset - n_min + 1
    num_steps = n_max - n_min

    def count_le(t):
        return jnp.clip(jnp.floor(t * inv_lam) + shift, 0, num_steps).astype(jnp.int32)

    return count_le


def _table_count_le(table_PxM: Array) -> Callable[[Array], Array]:
    """Keys from an explicit table ``table_PxM[i, n - n_min]`` (M = n_max - n_min steps per prompt)."""
    table_PxM = jnp.maximum(table_PxM, 0.0) + 0.0  # keys must be >= +0.0 for the bit-pattern search

    def count_le(t):
        return jnp.sum(table_PxM <= t, axis=1).astype(jnp.int32)

    return count_le


def _kth_smallest_key(count_le: Callable[[Array], Array], num_steps_needed: int, dtype) -> Array:
    """Smallest t with ``sum_i count_le(t)_i >= k``: the k-th smallest key, exactly (bisection on bits)."""
    int_type = _int_type(dtype)
    inf_bits = int(np.array(np.inf, dtype=np.dtype(dtype)).view(np.dtype(int_type)))
    hi = jnp.asarray(inf_bits, int_type)
    lo = jnp.asarray(-1, int_type)
    iterations = int(np.ceil(np.log2(inf_bits + 2)))

    def body(_, bracket):
        lo, hi = bracket
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(count_le(_from_bits(mid, dtype))) >= num_steps_needed
        return jnp.where(enough, lo, mid), jnp.where(enough, mid, hi)

    _, hi = jax.lax.fori_loop(0, iterations, body, (lo, hi))
    return hi


def _fill(count_le: Callable[[Array], Array], num_prompts: int, budget: int, n_min: int, n_max: int, dtype) -> Array:
    """Integer counts taking the ``budget - P n_min`` smallest steps in (key, n, i) order."""
    num_needed = budget - num_prompts * n_min
    num_steps = n_max - n_min
    t_bits = _kth_smallest_key(count_le, num_needed, dtype)
    # Steps strictly below t are those <= the float just below it; nothing is below +0.0.
    below = jnp.where(t_bits > 0, count_le(_from_bits(jnp.maximum(t_bits - 1, 0), dtype)), 0)
    tied = count_le(_from_bits(t_bits, dtype)) - below
    remaining = num_needed - jnp.sum(below)

    # Tied steps of prompt i sit at offsets [below_i, below_i + tied_i); take them by offset, then index.
    def taken_before(level):
        return jnp.clip(level - below, 0, tied)

    def level_body(_, bracket):
        lo, hi = bracket  # invariant: sum(taken_before(lo)) <= remaining < sum(taken_before(hi)) or hi = M + 1
        mid = (lo + hi) // 2
        fits = jnp.sum(taken_before(mid)) <= remaining
        return jnp.where(fits, mid, lo), jnp.where(fits, hi, mid)

    level_iters = int(np.ceil(np.log2(num_steps + 2)))
    level, _ = jax.lax.fori_loop(0, level_iters, level_body, (jnp.int32(0), jnp.int32(num_steps + 1)))
    take = taken_before(level)
    left = remaining - jnp.sum(take)
    at_level = (below <= level) & (level < below + tied)
    # Usually nothing is left (ties are rare with real-valued p); skip the O(P) cumsum then.
    extra = jax.lax.cond(
        left > 0,
        lambda: at_level & (jnp.cumsum(at_level.astype(jnp.int32)) <= left),
        lambda: jnp.zeros_like(at_level))
    return (n_min + below + take + extra).astype(jnp.int32)


def _table_allocation(table_PxM, budget, n_min, n_max):
    count_le = _table_count_le(table_PxM)
    return _fill(count_le, table_PxM.shape[0], budget, n_min, n_max, table_PxM.dtype)


def posterior_key_table(post: BetaPosterior, offset: int, n_min: int, n_max: int) -> Array:
    """``-log(1 - E[1 - (1-p)^(n-b)]) = log B(a, b') - log B(a, b' + n - b)`` for n in [n_min, n_max)."""
    n = jnp.arange(n_min, n_max, dtype=post.alpha.dtype)
    m = (n - offset)[None, :]
    a, b = post.alpha[:, None], post.beta[:, None]
    return betaln(a, b) - betaln(a, b + m)


def expected_scale_factor(post: BetaPosterior, n, offset: int = 1, *, check: bool = True) -> Array:
    """Posterior-expected power-law factor ``E[1 - (1-p)^(n-b)] = 1 - B(a, b'+n-b) / B(a, b')``; 0 at n = 0 (no
    rollouts). ``n`` in ``{0} U [1, inf)`` and ``offset`` b in {0, 1}, as ``scale_factor`` takes them."""
    if isinstance(offset, bool) or offset not in (0, 1):
        raise ValueError(f"offset must be 0 (maxrl_no_baseline) or 1 (maxrl), got {offset!r}")
    alpha, beta = jnp.asarray(post.alpha), jnp.asarray(post.beta)
    check_beta(alpha, beta, check)
    validation.require(n, validation.is_bad_count, validation.COUNTS_MESSAGE, check=check)
    return power_posterior_factor(alpha, beta, jnp.asarray(n, alpha.dtype), offset)


def _step_count_le(p_or_post, n_min: int, n_max: int, est: Estimator) -> Callable[[Array], Array]:
    """The step keys of an allocation problem (module docstring), as their ``count_le``."""
    if isinstance(p_or_post, BetaPosterior) and est.power_offset is not None:
        return _table_count_le(posterior_key_table(p_or_post, est.power_offset, n_min, n_max))
    if isinstance(p_or_post, BetaPosterior):
        n = jnp.arange(n_min, n_max, dtype=p_or_post.alpha.dtype)
        return _table_count_le(beta_binomial_scale_factor(p_or_post.alpha[:, None], p_or_post.beta[:, None],
                                                          n[None, :], est.advantage, max(n_max - 1, 1)))
    if est.power_offset is not None:
        return _power_law_count_le(p_or_post, est.power_offset, n_min, n_max)
    n = jnp.arange(n_min, n_max, dtype=p_or_post.dtype)
    return _table_count_le(binomial_scale_factor(p_or_post[:, None], n[None, :], est.advantage, max(n_max - 1, 1)))


def _key_dtype(p_or_post):
    return p_or_post.alpha.dtype if isinstance(p_or_post, BetaPosterior) else p_or_post.dtype


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "estimator", "method"))
def _allocate_impl(p_or_post, budget, n_min, n_max, estimator, method):
    num_prompts = jax.tree.leaves(p_or_post)[0].shape[0]
    if method == "uniform":
        return uniform_counts(num_prompts, budget)
    count_le = _step_count_le(p_or_post, n_min, n_max, get_estimator(estimator))
    return _fill(count_le, num_prompts, budget, n_min, n_max, _key_dtype(p_or_post))


# ---------------------------------------------------------------------------------------------------------
# Token budgets: the exact discrete max–min under per-prompt costs (sum_i l_i N_i <= budget).


def _smallest_true_bits(predicate: Callable[[Array], Array], dtype) -> Array:
    """Bits of the smallest float t in [+0, inf] with ``predicate(t)`` (monotone); inf's bits + 1 if none."""
    int_type = _int_type(dtype)
    inf_bits = int(np.array(np.inf, dtype=np.dtype(dtype)).view(np.dtype(int_type)))
    iterations = int(np.ceil(np.log2(inf_bits + 2)))

    def body(_, bracket):
        lo, hi = bracket  # predicate false at lo (or lo = -1), true at hi (or hi = inf_bits + 1)
        mid = lo + (hi - lo) // 2
        true = predicate(_from_bits(mid, dtype))
        return jnp.where(true, lo, mid), jnp.where(true, mid, hi)

    bracket = (jnp.asarray(-1, int_type), jnp.asarray(inf_bits + 1, int_type))
    return jax.lax.fori_loop(0, iterations, body, bracket)[1]


def _largest_true(predicate: Callable[[Array], Array], lo, hi, iterations: int) -> Array:
    """Largest integer x in [lo, hi) with ``predicate(x)`` (monotone, true at lo, false at hi)."""

    def body(_, bracket):
        lo, hi = bracket
        mid = lo + (hi - lo) // 2  # = lo once hi - lo <= 1: the bracket stays put
        true = predicate(mid)
        return jnp.where(true, mid, lo), jnp.where(true, hi, mid)

    return jax.lax.fori_loop(0, iterations, body, (jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)))[0]


def _fill_with_costs(count_le: Callable[[Array], Array], costs_P: Array, budget: float, n_min: int,
                     n_max: int) -> Array:
    """The costed greedy's counts (see :func:`all_active_counts`): take steps in (key, n, i) order, each one whose cost
    still fits the budget left.

    Every step the greedy skips freezes its prompt (the budget left only shrinks), and so does every prompt
    whose cost exceeds the budget left. Between two such events the greedy takes, among the prompts still
    active (set A), a *prefix* of their steps in (key, n, i) order: the longest one whose total cost fits, found
    by bisection on the key's bits, then on the tied steps' n, then on their index (each test is one O(P) sum,
    ``sum_i l_i N_i <= budget``, the same expression everywhere, which is monotone in the counts). The first
    step after that prefix does not fit: its prompt j leaves A, with every prompt whose cost exceeds the budget
    left or that reached n_max, and the next phase continues along the same order. At most P phases (usually a
    few), each O(P (31 + log2 M + log2 P)) in float32.
    """
    dtype = costs_P.dtype
    num_prompts = costs_P.shape[0]
    num_steps = n_max - n_min
    budget = jnp.asarray(budget, dtype)
    inf_bits = int(np.array(np.inf, dtype=np.dtype(dtype)).view(np.dtype(_int_type(dtype))))
    level_iters = max(int(np.ceil(np.log2(num_steps))), 0) if num_steps > 0 else 0
    index_iters = int(np.ceil(np.log2(num_prompts + 1)))

    def fits(counts_P):
        return _total_cost(costs_P, counts_P) <= budget

    def phase(state):
        counts_P, active_P = state

        def extend(steps_P):  # active prompts at n_min + steps; the frozen ones keep their counts
            return jnp.where(active_P, n_min + steps_P, counts_P)

        # 1. The smallest key t such that taking all of A's steps with key <= t does not fit.
        t_bits = _smallest_true_bits(lambda t: ~fits(extend(count_le(t))), dtype)
        all_fit = t_bits > inf_bits
        t_bits = jnp.minimum(t_bits, inf_bits)
        below = jnp.where(t_bits > 0, count_le(_from_bits(jnp.maximum(t_bits - 1, 0), dtype)), 0)
        tied = count_le(_from_bits(t_bits, dtype)) - below

        # 2. Tied steps of prompt i sit at offsets [below_i, below_i + tied_i): the largest offset L such that
        #    all tied steps at offsets < L fit (L = 0 fits: it is the keys < t; L = M is all keys <= t: it does not).
        def upto(level):
            return below + jnp.clip(level - below, 0, tied)

        level = _largest_true(lambda lv: fits(extend(upto(lv))), 0, num_steps, level_iters)
        # 3. The tied steps at offset L, in index order: the longest prefix that fits (not all of them do).
        at_level = active_P & (below <= level) & (level < below + tied)
        rank = jnp.cumsum(at_level.astype(jnp.int32))
        base = upto(level)
        taken = _largest_true(lambda k: fits(extend(base + (at_level & (rank <= k)))), 0, rank[-1], index_iters)
        stepped = extend(base + (at_level & (rank <= taken)))
        blocked = at_level & (rank == taken + 1)  # the first step that does not fit: its prompt freezes

        new_counts = jnp.where(all_fit, jnp.where(active_P, n_max, counts_P), stepped).astype(jnp.int32)
        left = budget - _total_cost(costs_P, new_counts)
        new_active = active_P & ~blocked & ~all_fit & (new_counts < n_max) & (costs_P <= left)
        return new_counts, new_active

    counts = jnp.full((num_prompts,), n_min, jnp.int32)
    active = (counts < n_max) & (costs_P <= budget - _total_cost(costs_P, counts))
    counts, _ = jax.lax.while_loop(lambda state: jnp.any(state[1]), phase, (counts, active))
    return counts


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "estimator", "method"))
def _allocate_with_costs_impl(p_or_post, costs_P, budget, n_min, n_max, estimator, method):
    num_prompts = costs_P.shape[0]
    if method == "uniform":  # every key equal: the greedy's order is (n, i), i.e. round-robin
        def count_le(t):
            del t
            return jnp.full((num_prompts,), n_max - n_min, jnp.int32)
    else:
        count_le = _step_count_le(p_or_post, n_min, n_max, get_estimator(estimator))
    return _fill_with_costs(count_le, costs_P, budget, n_min, n_max)


def uniform_counts(num_prompts: int, budget: int) -> Array:
    """MaxRL's uniform allocation: ``budget // P`` each, the remainder to the first prompts (deterministic)."""
    num_prompts = validation.check_int(num_prompts, "num_prompts", minimum=1)
    budget = validation.check_int(budget, "budget", minimum=0)
    base, remainder = divmod(budget, num_prompts)
    return (base + (jnp.arange(num_prompts) < remainder)).astype(jnp.int32)


def all_active_counts(
    p_hat: Union[Array, BetaPosterior],
    budget: Union[int, float],
    *,
    n_min: int = 2,
    n_max: int,
    estimator: str = "maxrl",
    method: str = "sera_all_active",
    check: bool = True,
    costs_P=None,
) -> Array:
    """The allocations that give every prompt ``n_min <= N_i <= n_max`` rollouts: integer counts ``N_P`` (int32)
    with ``sum = budget`` (with ``costs_P``: ``sum_i l_i N_i <= budget``). Users reach them by name through
    ``sera_jax.allocate`` (``method="sera_all_active"`` or ``"uniform"``), which is where the released rule
    ``sera`` lives too.

    ``method="sera_all_active"`` attains the exact discrete max–min of ``min_i s(p_hat_i, N_i)`` (the value of the
    one-rollout-at-a-time greedy; ties go to fewer rollouts, then lower index); ``method="uniform"`` is the
    MaxRL baseline. Pass a :class:`BetaPosterior` instead of point estimates to equalise the
    posterior-expected factor ``E[s(p, N)]`` (power law: ``1 - B(a, b'+N-b) / B(a, b')``; other estimators:
    the Beta-binomial sum, tabulated like their point factors).

    Token budget (``costs_P``: ``l_i > 0`` per prompt, e.g. its expected response length in tokens, real-valued;
    ``budget`` then a static real): with slot refill the sampler costs ``sum_i l_i N_i``, so

        maximise  min_i s(p_hat_i, N_i)   subject to  sum_i l_i N_i <= budget,  n_min <= N_i <= n_max.

    The counts returned are those of the **costed greedy**: from ``N_i = n_min``, one rollout at a time to the
    prompt with the smallest current factor among those whose next rollout still fits the budget left (ties:
    fewer rollouts, then lower index), until no rollout fits. Equivalently: walk all steps (i, n) in (key, n, i)
    order and take each one whose cost ``l_i`` fits what is left.

    Why this is the max–min optimum: let step s = (j, n) be the first one the greedy skips (it found
    ``l_j > budget left``), with key t. Everything before s was taken, so every prompt ends with factor >= t
    (unless it reached n_max). Any allocation with ``min_i s_i > t`` must take every step with key <= t, s and
    all steps before it included, whose cost already exceeds the budget; so no allocation beats
    ``min(t, min_i s(p_i, n_max))``, and the greedy attains it. (If no step is skipped, every prompt reached
    n_max.) In words: the max–min value t* is the largest step key such that the cheapest allocation reaching
    ``s_i >= t*`` for all i (each prompt's steps with key < t*) fits the budget. What is left after that is
    spent by the same rule, on the lowest factors whose next rollout still fits, skipping those that do not;
    this is one max–min optimum, not in general the lexicographic one (which under costs is a knapsack search).
    The budget need not be spent exactly: on return every prompt below n_max has ``l_i > budget - sum_j l_j N_j``.
    With every ``l_i = 1`` and an integer budget the counts equal the rollout-budget ones exactly, ties included,
    for both methods (``uniform`` under costs is the same greedy with all keys equal: round-robin in index
    order, skipping the prompts that no longer fit).

    Jittable (``budget``, bounds, estimator and method are static): one trace per p_hat shape; vmap over a
    batch of problems. Bad inputs raise ValueError eagerly; values of a traced p_hat are checked inside
    ``checkify.checkify`` (``core.validation``; ``check=False`` drops the value checks). Under costs the same
    holds for ``costs_P`` (wrong shape, NaN or infinite, <= 0) and an infeasible budget
    (``sum_i n_min l_i > budget``); the budget is compared with ``sum_i l_i N_i`` in p_hat's dtype (float32: exact
    for integer token counts below 2^24, else to float rounding). Costs are cast to that dtype.
    """
    if method not in ALL_ACTIVE_METHODS:
        raise ValueError(f"unknown allocation method {method!r}; known methods of all_active_counts: "
                         f"{list(ALL_ACTIVE_METHODS)} (sera_jax.allocate knows every registered one)")
    est = get_estimator(estimator)
    if method == "sera_all_active":
        check_depends_on_n(est, method)
    if isinstance(p_hat, BetaPosterior):
        p_or_post = _check_posterior(p_hat, check)
        num_prompts = p_or_post.alpha.shape[0]
    else:
        p_or_post = _check_p_hat(p_hat, check)
        num_prompts = p_or_post.shape[0]
    if costs_P is None:
        budget, n_min, n_max = check_problem(num_prompts, budget, n_min, n_max, est)
        return _allocate_impl(p_or_post, budget=budget, n_min=n_min, n_max=n_max, estimator=estimator,
                              method=method)
    budget, n_min, n_max = check_costed_problem(num_prompts, budget, n_min, n_max, est)
    costs_P = _check_costs(costs_P, num_prompts, _key_dtype(p_or_post), budget, n_min, check)
    return _allocate_with_costs_impl(p_or_post, costs_P, budget=budget, n_min=n_min, n_max=n_max,
                                     estimator=estimator, method=method)


def allocate_tokens(p_hat: Union[Array, BetaPosterior], token_budget: float, costs_P: Array, max_rows: int, *,
                    n_min: int = 2, n_max: int, estimator: str = "maxrl", check: bool = True) -> Array:
    """SERA's max–min under a token budget and a row cap: ``sum_i l_i N_i <= token_budget`` and
    ``sum_i N_i <= max_rows`` (the flat layout's fixed rows), ``n_min <= N_i <= n_max``.

    The costed greedy of :func:`all_active_counts` (``costs_P``) is optimal for the token budget alone. When its counts
    also fit the rows they are returned; otherwise the elementwise minimum with the rollout-budget allocation of
    ``max_rows`` is. That is a max–min optimum of the joint problem: since ``s`` increases in N,
    ``min_i s(p_i, min(a_i, b_i)) = min(t_tokens, t_rows)``, the smaller of the two problems' optimal values, and
    no allocation feasible for both can beat either of them. (It may leave rows and tokens unspent.)
    """
    num_prompts = (p_hat.alpha if isinstance(p_hat, BetaPosterior) else jnp.asarray(p_hat)).shape[0]
    max_rows = validation.check_int(max_rows, "max_rows", minimum=0)
    by_tokens = all_active_counts(p_hat, token_budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check,
                                  costs_P=costs_P)
    if max_rows >= num_prompts * n_max:  # the rows cannot bind
        return by_tokens
    by_rows = all_active_counts(p_hat, max_rows, n_min=n_min, n_max=n_max, estimator=estimator, check=check)
    return jnp.where(jnp.sum(by_tokens) <= max_rows, by_tokens, jnp.minimum(by_tokens, by_rows))
