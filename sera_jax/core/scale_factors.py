"""Finite-rollout scale factors ``s(p, N)`` of group estimators (docs/method.md §2).

For any group estimator with advantage ``f(r, K, N)`` and binary rewards,
``E[g_i] = s_f(p_i, N_i) * grad log p_i`` with

    s_f(p, N) = sum_{k=0..N} Binom(k; N, p) [ (k/N) f(1,k,N) - ((N-k)/N) (p/(1-p)) f(0,k,N) ].

Closed forms: ``maxrl`` 1 - (1-p)^(N-1); ``maxrl_no_baseline`` 1 - (1-p)^N; ``rloo`` and ``reinforce`` p.

No rollouts, no gradient: ``s_f(p, 0) = 0`` for every estimator (a prompt with ``N = 0`` has no row in the loss;
the sum above is empty). The continuous relaxation of the closed forms is defined on ``{0} U [1, inf)``: real
``N >= 1`` interpolates between group sizes, and ``0 < N < 1`` is refused, since there is no group of fewer than
one rollout to estimate from (maxrl's closed form would go negative there: ``1 - (1-p)^(N-1) < 0``). On that set
s never decreases in N; it is continuous at 0 for ``maxrl_no_baseline`` and jumps from 0 to p at ``N = 1`` for
``rloo`` and ``reinforce``, whose single rollout already carries the whole factor.

``s_f(p, N)`` is a polynomial in p for every estimator (the failure term's ``p/(1-p)`` cancels one factor
``(1-p)`` of the binomial pmf), so its expectation under a Beta(a, b) belief about p is exact
(:func:`posterior_scale_factor`): that is the factor a diagnostic should report when p is only estimated.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import betaln, gammaln, xlog1py, xlogy

from sera_jax.core import validation
from sera_jax.core.estimators import get_estimator

Array = jnp.ndarray


def _float_dtype(*xs) -> jnp.dtype:
    dtype = jnp.result_type(*xs)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(float)


def binomial_scale_factor(p: Array, n: Array, advantage: Callable, max_n: int) -> Array:
    """The general binomial-sum ``s_f(p, N)`` for an elementwise advantage ``f(r, k, n)``.

    Computed in log space: the failure term uses ``(p/(1-p)) Binom(k; N, p) = C(N,k) p^(k+1) (1-p)^(N-k-1)``
    so p = 1 needs no division, and ``xlogy``/``xlog1py`` make 0 * log 0 = 0 (exact at p = 0 and p = 1).
    Integer-valued ``n`` in [1, max_n]; broadcasts over ``p`` and ``n``; cost O(size * max_n).
    """
    dtype = _float_dtype(p)
    p, n = jnp.broadcast_arrays(jnp.asarray(p, dtype), jnp.asarray(n, dtype))
    k = jnp.arange(max_n + 1, dtype=dtype)
    pk, nk = p[..., None], n[..., None]
    has_success = k <= nk
    has_failure = k < nk
    safe_nk = jnp.maximum(nk, k)  # keeps gammaln's argument positive where the term is masked out
    log_choose = gammaln(safe_nk + 1) - gammaln(k + 1) - gammaln(safe_nk - k + 1)
    log_pmf = log_choose + xlogy(k, pk) + xlog1py(safe_nk - k, -pk)
    log_fail = log_choose + xlogy(k + 1, pk) + xlog1py(jnp.maximum(safe_nk - k - 1, 0), -pk)
    success = jnp.exp(log_pmf) * (k / nk) * advantage(jnp.ones_like(k), k, nk)
    failure = jnp.exp(log_fail) * ((nk - k) / nk) * advantage(jnp.zeros_like(k), k, nk)
    terms = jnp.where(has_success, success, 0.0) - jnp.where(has_failure, failure, 0.0)
    return jnp.sum(terms, axis=-1)


def _binomial_max_n(n: Any, max_n: Optional[int], estimator: str, check: bool) -> int:
    """The static bound (>= 1) of a binomial sum over rollout counts ``n`` (given, or read from a concrete ``n``),
    after checking that the counts are integers."""
    if max_n is None:
        if validation.is_traced(n):
            raise ValueError(f"estimator {estimator!r} has no closed form: pass a static max_n when n is traced")
        max_n = int(np.max(n))
    validation.require(n, lambda x: x != x // 1, f"estimator {estimator!r} needs integer rollout counts n",
                       check=check)
    return max(max_n, 1)


def _check_counts(n, check: bool):
    """Rollout counts in ``{0} U [1, inf)`` (module docstring); returns them as an array."""
    validation.require(n, validation.is_bad_count, validation.COUNTS_MESSAGE, check=check)
    return n


def _at_least_one(n: Array) -> Array:
    """``n`` with 0 replaced by 1: the formulas run on a group, and :func:`_zero_where_empty` puts 0 back. Keeps
    the masked branch finite (maxrl's ``1 - (1-p)^-1`` is -inf at p = 1), so its gradient is not NaN either."""
    return jnp.where(n == 0, 1.0, n).astype(n.dtype)


def _zero_where_empty(s: Array, n: Array) -> Array:
    return jnp.where(n == 0, 0.0, s).astype(s.dtype)


def scale_factor(
    p,
    n,
    estimator: str = "maxrl",
    *,
    max_n: Optional[int] = None,
    check: bool = True,
) -> Array:
    """Exact finite-rollout scale factor ``s(p, N)`` of ``estimator`` (docs/method.md §2).

    Args:
      p: success probabilities in [0, 1] (any shape, float32 or float64).
      n: rollout counts, broadcastable with ``p``: 0 (no rollouts: ``s = 0`` for every estimator) or >= 1.
        Closed forms (``maxrl``, ``maxrl_no_baseline``, ``rloo``, ``reinforce``) also accept non-integer
        ``n >= 1`` (the continuous relaxation; ``0 < n < 1`` is refused: module docstring).
      estimator: a name registered in ``sera_jax.core.estimators.ESTIMATORS``.
      max_n: static upper bound on n, needed only by the binomial sum (``grpo``) when n is traced.
      check: validate p and n (eagerly a ValueError; traced, inside ``checkify.checkify``: ``core.validation``).

    Returns:
      ``s`` with the broadcast shape of p and n, in p's float dtype.
    """
    est = get_estimator(estimator)
    validation.check_probabilities_any(p, "p", check)
    p = jnp.asarray(p)
    p = p.astype(_float_dtype(p))
    n = _check_counts(n, check)
    if est.closed_form is not None:
        return _closed_form_impl(p, jnp.asarray(n, dtype=p.dtype), estimator=estimator)
    max_n = _binomial_max_n(n, max_n, estimator, check)
    return _binomial_impl(p, jnp.asarray(n, dtype=p.dtype), estimator=estimator, max_n=max_n)


# Jitted once per (estimator, shapes): eager callers then run one fused program instead of dozens of ops.
@functools.partial(jax.jit, static_argnames=("estimator",))
def _closed_form_impl(p, n, estimator):
    return _zero_where_empty(get_estimator(estimator).closed_form(p, _at_least_one(n)), n)


@functools.partial(jax.jit, static_argnames=("estimator", "max_n"))
def _binomial_impl(p, n, estimator, max_n):
    return _zero_where_empty(binomial_scale_factor(p, _at_least_one(n), get_estimator(estimator).advantage, max_n), n)


def beta_binomial_scale_factor(alpha: Array, beta: Array, n: Array, advantage: Callable, max_n: int) -> Array:
    """``E[s_f(p, N)]`` for ``p ~ Beta(alpha, beta)``: the binomial sum with Beta moments for the powers of p.

    With ``E[p^j (1-p)^l] = B(a+j, b+l) / B(a, b)`` term by term,

        E[s_f] = sum_k C(N,k) [ B(a+k, b+N-k) (k/N) f(1,k,N) - B(a+k+1, b+N-k-1) ((N-k)/N) f(0,k,N) ] / B(a, b)

    (the failure term exists for k < N only, so ``b + N - k - 1 >= b > 0``). Computed in log space;
    integer-valued ``n`` in [1, max_n]; broadcasts over alpha, beta and n; cost O(size * max_n).
    """
    dtype = _float_dtype(alpha, beta)
    a, b, n = jnp.broadcast_arrays(jnp.asarray(alpha, dtype), jnp.asarray(beta, dtype), jnp.asarray(n, dtype))
    k = jnp.arange(max_n + 1, dtype=dtype)
    ak, bk, nk = a[..., None], b[..., None], n[..., None]
    has_success = k <= nk
    has_failure = k < nk
    safe_nk = jnp.maximum(nk, k)  # keeps every gammaln / betaln argument positive where masked out
    log_choose = gammaln(safe_nk + 1) - gammaln(k + 1) - gammaln(safe_nk - k + 1)
    log_norm = betaln(ak, bk)
    log_pmf = log_choose + betaln(ak + k, bk + safe_nk - k) - log_norm
    log_fail = log_choose + betaln(ak + k + 1, bk + jnp.maximum(safe_nk - k - 1, 0)) - log_norm
    success = jnp.exp(log_pmf) * (k / nk) * advantage(jnp.ones_like(k), k, nk)
    failure = jnp.exp(log_fail) * ((nk - k) / nk) * advantage(jnp.zeros_like(k), k, nk)
    terms = jnp.where(has_success, success, 0.0) - jnp.where(has_failure, failure, 0.0)
    return jnp.sum(terms, axis=-1)


def posterior_scale_factor(
    posterior,
    n,
    estimator: str = "maxrl",
    *,
    max_n: Optional[int] = None,
    check: bool = True,
) -> Array:
    """Posterior-expected scale factor ``E[s(p, N) | data]`` for ``p ~ Beta(alpha, beta)`` (docs/method.md §5, §7).

    What a diagnostic should report when p is estimated: ``s(p_hat, N)`` at the posterior mean overstates
    the factor of a hard prompt (0 of 4 pilot successes reads as p ~ 0.1 whatever p is), while the expectation
    averages s over what p may be. Exact for every estimator:

      * power law (``maxrl``, ``maxrl_no_baseline``): ``1 - B(a, b + N - c) / B(a, b)``
        (``E[(1-p)^m] = B(a, b + m) / B(a, b)``, c the power offset; any real N);
      * otherwise the Beta-binomial sum of :func:`beta_binomial_scale_factor` (``rloo``/``reinforce``: a/(a+b)).

    Args:
      posterior: anything with Beta parameters ``alpha`` and ``beta`` (> 0), e.g. ``core.BetaPosterior``.
      n: rollout counts, broadcastable with the posterior's arrays: 0 (``E[s] = 0``) or >= 1, as in
        :func:`scale_factor`.
      estimator: a registered estimator name.
      max_n: static upper bound on n, needed by the Beta-binomial sum when n is traced.
      check: validate inputs (alpha, beta finite and > 0; n in {0} U [1, inf)), as in :func:`scale_factor`.
    """
    est = get_estimator(estimator)
    alpha, beta = jnp.asarray(posterior.alpha), jnp.asarray(posterior.beta)
    dtype = _float_dtype(alpha, beta)
    alpha, beta = alpha.astype(dtype), beta.astype(dtype)
    check_beta(alpha, beta, check)
    n = _check_counts(n, check)
    if est.power_offset is not None:
        return _posterior_power_impl(alpha, beta, jnp.asarray(n, dtype), offset=est.power_offset)
    max_n = _binomial_max_n(n, max_n, estimator, check)
    return _posterior_binomial_impl(alpha, beta, jnp.asarray(n, dtype), estimator=estimator, max_n=max_n)


def check_beta(alpha, beta, check: bool = True) -> None:
    """Beta parameters finite and > 0 (NaN fails ``x > 0``)."""
    for x in (alpha, beta):
        validation.require(x, lambda v: ~((v > 0) & (abs(v) != np.inf)),
                           "posterior alpha and beta must be finite and > 0", check=check)


def power_posterior_factor(alpha: Array, beta: Array, n: Array, offset: int) -> Array:
    """``E[1 - (1-p)^(n-b)] = 1 - B(a, b'+n-b) / B(a, b')`` for ``p ~ Beta(a, b')``, and 0 at ``n = 0``."""
    m = _at_least_one(n) - offset
    return _zero_where_empty(-jnp.expm1(betaln(alpha, beta + m) - betaln(alpha, beta)) + 0.0, n)


@functools.partial(jax.jit, static_argnames=("offset",))
def _posterior_power_impl(alpha, beta, n, offset):
    return power_posterior_factor(alpha, beta, n, offset)


@functools.partial(jax.jit, static_argnames=("estimator", "max_n"))
def _posterior_binomial_impl(alpha, beta, n, estimator, max_n):
    return _zero_where_empty(
        beta_binomial_scale_factor(alpha, beta, _at_least_one(n), get_estimator(estimator).advantage, max_n), n)


def scale_factor_stats(scales) -> dict[str, Array]:
    """Dispersion of per-prompt scale factors: min, max, mean and coefficient of variation (std / mean)."""
    scales = jnp.asarray(scales)
    if scales.size == 0:
        raise ValueError(f"scales must hold at least one factor (one a prompt), got shape {scales.shape}")
    mean = jnp.mean(scales)
    std = jnp.std(scales)
    cv = jnp.where(mean > 0, std / jnp.where(mean > 0, mean, 1.0), 0.0)
    return {"min": jnp.min(scales), "max": jnp.max(scales), "mean": mean, "cv": cv}
