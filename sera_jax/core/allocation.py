"""SERA's fixed-budget max–min rollout allocation (SERA.md §3).

Problem: given success-rate estimates ``p_hat_i``, a budget ``B = sum_i N_i`` and bounds
``n_min <= N_i <= n_max``, maximise ``min_i s(p_hat_i, N_i)``.

* :func:`waterline` solves the continuous relaxation of the power-law family ``s = 1 - (1-p)^(N-b)``:
  ``N_i(tau) = clip(b + tau / lambda_i, n_min, n_max)`` with ``lambda_i = -log(1 - p_hat_i)``, and the
  waterline ``tau`` found by bisection in log tau followed by one exact linear solve.
* :func:`allocate` returns integer counts attaining the **exact discrete** max–min. Think of the
  ``B - P n_min`` extra rollouts as "steps": step (i, n) takes prompt i from n to n + 1 rollouts and
  has key ``s(p_hat_i, n)`` (any increasing transform of it). The one-rollout-at-a-time greedy that always
  feeds the prompt with the smallest current factor is optimal for a max–min of increasing functions,
  and it takes exactly the ``B - P n_min`` smallest steps in the order (key, n, i) — ties go to the prompt
  with fewer rollouts, then the lower index. We find the (B - P n_min)-th smallest key by bisection over
  the bit patterns of non-negative floats (exact, no sort), take every step below it, and share the tied
  steps by (n, i).
  Cost: O(P) per iteration, 31 iterations in float32 (63 in float64).

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
from jax.scipy.special import betaln

from sera_jax.core import validation
from sera_jax.core.estimators import Estimator, get_estimator
from sera_jax.core.scale_factors import beta_binomial_scale_factor, binomial_scale_factor

Array = jnp.ndarray


class BetaPosterior(NamedTuple):
    """Per-prompt Beta(alpha, beta) beliefs about the success rate; allocate on the expected factor."""

    alpha: Array
    beta: Array

    @property
    def mean(self) -> Array:
        return self.alpha / (self.alpha + self.beta)


ALLOCATION_METHODS = ("sera", "uniform")


# ---------------------------------------------------------------------------------------------------------
# Validation of the static problem description.


def check_problem(num_prompts: int, budget, n_min, n_max, est: Estimator, method: str) -> tuple[int, int, int]:
    """Validates the static part of an allocation problem; returns (budget, n_min, n_max) as ints."""
    if method not in ALLOCATION_METHODS:
        raise ValueError(f"unknown allocation method {method!r}; known methods: {list(ALLOCATION_METHODS)}")
    budget = validation.check_int(budget, "budget")
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
    if budget < num_prompts * n_min or budget > num_prompts * n_max:
        raise ValueError(
            f"infeasible budget {budget}: with {num_prompts} prompts and {n_min} <= N_i <= {n_max} it must lie in "
            f"[{num_prompts * n_min}, {num_prompts * n_max}]")
    if method == "sera" and not est.depends_on_n:
        raise ValueError(
            f"estimator {est.name!r} has a scale factor that does not depend on N, so SERA's allocation is "
            "undefined for it; use method='uniform'")
    return budget, n_min, n_max


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
    if check and not validation.is_traced(alpha, beta):
        a, b = np.asarray(alpha), np.asarray(beta)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
            raise ValueError("posterior alpha and beta must be finite and > 0")
    return BetaPosterior(alpha, beta)


# ---------------------------------------------------------------------------------------------------------
# Continuous waterline.


def _rates(p_hat: Array) -> Array:
    """lambda = -log(1 - p): 0 at p = 0, inf at p = 1."""
    return -jnp.log1p(-p_hat)


def _counts_at(tau: Array, lam: Array, offset: int, n_min: int, n_max: int) -> Array:
    """N_i(tau) = clip(b + tau / lambda_i, n_min, n_max), with tau / 0 = inf and tau / inf = 0."""
    ratio = jnp.where(lam > 0, tau / jnp.where(lam > 0, lam, 1.0), jnp.inf)
    return jnp.clip(offset + ratio, n_min, n_max)


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "offset", "iterations"))
def _waterline_impl(p_hat, budget, n_min, n_max, offset, iterations=64):
    dtype = p_hat.dtype
    lam = _rates(p_hat)
    zero, inf = lam == 0, jnp.isinf(lam)
    finite = ~zero & ~inf
    num_zero, num_inf = jnp.sum(zero), jnp.sum(inf)
    num_prompts = p_hat.shape[0]
    # Sums just above tau = 0 and just below tau = inf (the p = 0 / p = 1 prompts jump there).
    sum_at_zero = n_min * (num_prompts - num_zero) + n_max * num_zero
    sum_at_inf = n_min * num_inf + n_max * (num_prompts - num_inf)

    big = jnp.asarray(jnp.finfo(dtype).max, dtype)
    lam_f_lo = jnp.where(finite, lam, big)
    lam_f_hi = jnp.where(finite, lam, 0.0)
    log_lo = jnp.log(jnp.min(lam_f_lo) * (n_min - offset)) - 1.0
    log_hi = jnp.log(jnp.max(lam_f_hi) * (n_max - offset)) + 1.0

    def total(log_tau):
        return jnp.sum(_counts_at(jnp.exp(log_tau), lam, offset, n_min, n_max))

    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        above = total(mid) >= budget
        return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

    lo, hi = jax.lax.fori_loop(0, iterations, body, (log_lo, log_hi))
    # Exact solve on the free set (prompts strictly between the bounds): sum is linear in tau there.
    counts_mid = _counts_at(jnp.exp(0.5 * (lo + hi)), lam, offset, n_min, n_max)
    free = finite & (counts_mid > n_min) & (counts_mid < n_max)
    clipped_sum = jnp.sum(jnp.where(free, 0.0, counts_mid))
    inv_lam_free = jnp.sum(jnp.where(free, 1.0 / jnp.where(free, lam, 1.0), 0.0))
    tau_exact = (budget - clipped_sum - offset * jnp.sum(free)) / jnp.where(inv_lam_free > 0, inv_lam_free, 1.0)
    tau = jnp.where(inv_lam_free > 0, tau_exact, jnp.exp(0.5 * (lo + hi)))
    interior = _counts_at(tau, lam, offset, n_min, n_max)

    # Budget below the tau -> 0+ sum: the p = 0 prompts share what the others leave at n_min.
    share_zero = (budget - n_min * (num_prompts - num_zero)) / jnp.maximum(num_zero, 1)
    low = jnp.where(zero, share_zero, n_min).astype(dtype)
    # Budget above the tau -> inf sum: the p = 1 prompts share what the others leave at n_max.
    share_inf = (budget - n_max * (num_prompts - num_inf)) / jnp.maximum(num_inf, 1)
    high = jnp.where(inf, share_inf, n_max).astype(dtype)
    return jnp.where(budget <= sum_at_zero, low, jnp.where(budget >= sum_at_inf, high, interior))


def waterline(p_hat, budget: int, *, n_min: int, n_max: int, estimator: str = "maxrl", check: bool = True) -> Array:
    """Continuous SERA counts: ``N_i = clip(b + tau / lambda_i, n_min, n_max)`` with ``sum_i N_i = budget``.

    The leximin (water-filling) optimum of the continuous relaxation for the power-law estimators
    (``s = 1 - (1-p)^(N-b)``: ``maxrl`` b = 1, ``maxrl_no_baseline`` b = 0). p_hat = 0 gives n_max and
    p_hat = 1 gives n_min; when the budget cannot reach that, those prompts share what is left equally.

    Returns:
      float counts of shape (P,) in p_hat's dtype, summing to ``budget`` up to float rounding.
    """
    est = get_estimator(estimator)
    if est.power_offset is None:
        raise ValueError(
            f"the continuous waterline is defined for the power-law estimators "
            f"(maxrl, maxrl_no_baseline), not {estimator!r}; use allocate() for integer counts")
    p_hat = _check_p_hat(p_hat, check)
    budget, n_min, n_max = check_problem(p_hat.shape[0], budget, n_min, n_max, est, "sera")
    return _waterline_impl(p_hat, budget=budget, n_min=n_min, n_max=n_max, offset=est.power_offset)


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


def _power_law_allocation(p_hat, budget, n_min, n_max, offset):
    count_le = _power_law_count_le(p_hat, offset, n_min, n_max)
    return _fill(count_le, p_hat.shape[0], budget, n_min, n_max, p_hat.dtype)


def _table_allocation(table_PxM, budget, n_min, n_max):
    count_le = _table_count_le(table_PxM)
    return _fill(count_le, table_PxM.shape[0], budget, n_min, n_max, table_PxM.dtype)


def posterior_key_table(post: BetaPosterior, offset: int, n_min: int, n_max: int) -> Array:
    """``-log(1 - E[1 - (1-p)^(n-b)]) = log B(a, b') - log B(a, b' + n - b)`` for n in [n_min, n_max)."""
    n = jnp.arange(n_min, n_max, dtype=post.alpha.dtype)
    m = (n - offset)[None, :]
    a, b = post.alpha[:, None], post.beta[:, None]
    return betaln(a, b) - betaln(a, b + m)


def expected_scale_factor(post: BetaPosterior, n, offset: int = 1) -> Array:
    """Posterior-expected power-law factor ``E[1 - (1-p)^(n-b)] = 1 - B(a, b'+n-b) / B(a, b')``."""
    m = jnp.asarray(n, post.alpha.dtype) - offset
    return -jnp.expm1(betaln(post.alpha, post.beta + m) - betaln(post.alpha, post.beta))


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "estimator", "method"))
def _allocate_impl(p_or_post, budget, n_min, n_max, estimator, method):
    est = get_estimator(estimator)
    if method == "uniform":
        num_prompts = jax.tree.leaves(p_or_post)[0].shape[0]
        return uniform_counts(num_prompts, budget)
    if isinstance(p_or_post, BetaPosterior) and est.power_offset is not None:
        table = posterior_key_table(p_or_post, est.power_offset, n_min, n_max)
        return _table_allocation(table, budget, n_min, n_max)
    if isinstance(p_or_post, BetaPosterior):
        n = jnp.arange(n_min, n_max, dtype=p_or_post.alpha.dtype)
        table = beta_binomial_scale_factor(p_or_post.alpha[:, None], p_or_post.beta[:, None], n[None, :],
                                           est.advantage, max(n_max - 1, 1))
        return _table_allocation(table, budget, n_min, n_max)
    if est.power_offset is not None:
        return _power_law_allocation(p_or_post, budget, n_min, n_max, est.power_offset)
    n = jnp.arange(n_min, n_max, dtype=p_or_post.dtype)
    table = binomial_scale_factor(p_or_post[:, None], n[None, :], est.advantage, max(n_max - 1, 1))
    return _table_allocation(table, budget, n_min, n_max)


def uniform_counts(num_prompts: int, budget: int) -> Array:
    """MaxRL's uniform allocation: ``budget // P`` each, the remainder to the first prompts (deterministic)."""
    base, remainder = divmod(budget, num_prompts)
    return (base + (jnp.arange(num_prompts) < remainder)).astype(jnp.int32)


def allocate(
    p_hat: Union[Array, BetaPosterior],
    budget: int,
    *,
    n_min: int = 2,
    n_max: int,
    estimator: str = "maxrl",
    method: str = "sera",
    check: bool = True,
) -> Array:
    """Integer rollout counts ``N_P`` (int32) with ``sum = budget`` and ``n_min <= N_i <= n_max``.

    ``method="sera"`` attains the exact discrete max–min of ``min_i s(p_hat_i, N_i)`` (the value of the
    one-rollout-at-a-time greedy; ties go to fewer rollouts, then lower index); ``method="uniform"`` is the
    MaxRL baseline. Pass a :class:`BetaPosterior` instead of point estimates to equalise the
    posterior-expected factor ``E[s(p, N)]`` (power law: ``1 - B(a, b'+N-b) / B(a, b')``; other estimators:
    the Beta-binomial sum, tabulated like their point factors).

    Jittable (``budget``, bounds, estimator and method are static): one trace per p_hat shape; vmap over a
    batch of problems. Bad inputs raise ValueError eagerly; with traced p_hat a run-time check raises when
    the program runs (``check=False`` drops it).
    """
    est = get_estimator(estimator)
    if isinstance(p_hat, BetaPosterior):
        p_or_post = _check_posterior(p_hat, check)
        num_prompts = p_or_post.alpha.shape[0]
    else:
        p_or_post = _check_p_hat(p_hat, check)
        num_prompts = p_or_post.shape[0]
    budget, n_min, n_max = check_problem(num_prompts, budget, n_min, n_max, est, method)
    return _allocate_impl(p_or_post, budget=budget, n_min=n_min, n_max=n_max, estimator=estimator, method=method)
