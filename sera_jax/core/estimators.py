"""Group advantage estimators and their registry.

A group estimator gives rollout j of prompt i the advantage ``A_ij = f(r_ij, K_i, N_i)`` (docs/method.md §2),
where ``K_i`` is the number of successes among the ``N_i`` rollouts of prompt i. Each estimator here is
one elementwise function ``f(r, k, n)``; the flat-layout advantages and the general scale-factor formula
are both computed from it, so the registry is the single definition of every estimator.

Adding an estimator: write ``f(r, k, n)`` (broadcasting jnp, float inputs) and register an
``Estimator`` in ``ESTIMATORS``. Give ``power_offset`` only when its scale factor has the power-law form
``1 - (1 - p)^(N - power_offset)``, which unlocks the closed-form waterline.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax.numpy as jnp

Array = jnp.ndarray

GRPO_EPS = 1e-6


def _safe_divide(num: Array, den: Array) -> Array:
    """num / den where den > 0, else 0 (zero-success groups get zero advantage, as in MaxRL's code)."""
    positive = den > 0
    return jnp.where(positive, num / jnp.where(positive, den, 1.0), 0.0)


def maxrl_advantage(r: Array, k: Array, n: Array) -> Array:
    """MaxRL's released estimator: ``A = (r - rbar) / rbar`` with ``rbar = K/N``; all zero when K = 0."""
    rbar = k / n
    return _safe_divide(r - rbar, rbar)


def maxrl_no_baseline_advantage(r: Array, k: Array, n: Array) -> Array:
    """MaxRL's Theorem form: ``A = r / rbar = N r / K``; zero when K = 0."""
    return _safe_divide(r, k / n)


def grpo_advantage(r: Array, k: Array, n: Array) -> Array:
    """GRPO: ``A = (r - rbar) / (std + eps)`` with the unbiased (ddof=1) group std, as in verl.

    With binary rewards the group variance is ``K (N - K) / (N (N - 1))``; a group of one rollout (or an
    all-equal group) has zero numerator, hence zero advantage.
    """
    rbar = k / n
    var = _safe_divide(k * (n - k), n * (n - 1.0))
    return (r - rbar) / (jnp.sqrt(var) + GRPO_EPS)


def rloo_advantage(r: Array, k: Array, n: Array) -> Array:
    """REINFORCE with a leave-one-out baseline: ``A = r - (K - r) / (N - 1)``; needs N >= 2."""
    return r - _safe_divide(k - r, n - 1.0)


def reinforce_advantage(r: Array, k: Array, n: Array) -> Array:
    """Plain REINFORCE, no baseline: ``A = r``."""
    del k, n
    return r


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An advantage estimator and the facts about its scale factor that allocation needs.

    Attributes:
      name: registry key.
      advantage: elementwise ``f(r, k, n)``.
      min_rollouts: smallest N for which the estimator gives a non-degenerate gradient (allocation lower bound).
      power_offset: b if ``s(p, N) = 1 - (1-p)^(N-b)``, else None.
      closed_form: ``s(p, n)`` in closed form, or None to use the general binomial sum.
      depends_on_n: False if s does not depend on N (then equalising by allocation is meaningless).
    """

    name: str
    advantage: Callable[[Array, Array, Array], Array]
    min_rollouts: int
    power_offset: Optional[int] = None
    closed_form: Optional[Callable[[Array, Array], Array]] = None
    depends_on_n: bool = True


def one_minus_power(p: Array, m: Array) -> Array:
    """``1 - (1 - p)^m`` computed as ``-expm1(m log1p(-p))``; exact 0 at m = 0 and exact 1 at p = 1, m > 0."""
    m = jnp.asarray(m, dtype=p.dtype)
    log_q = jnp.log1p(-p)  # -inf at p = 1
    exponent = jnp.where(m == 0, 0.0, m * log_q)  # avoid 0 * -inf
    return -jnp.expm1(exponent) + 0.0  # + 0.0 turns -0.0 into 0.0


ESTIMATORS: dict[str, Estimator] = {
    "maxrl": Estimator(
        "maxrl", maxrl_advantage, min_rollouts=2, power_offset=1,
        closed_form=lambda p, n: one_minus_power(p, n - 1)),
    "maxrl_no_baseline": Estimator(
        "maxrl_no_baseline", maxrl_no_baseline_advantage, min_rollouts=1, power_offset=0,
        closed_form=lambda p, n: one_minus_power(p, n)),
    "grpo": Estimator("grpo", grpo_advantage, min_rollouts=2),
    "rloo": Estimator(
        "rloo", rloo_advantage, min_rollouts=2,
        closed_form=lambda p, n: jnp.broadcast_to(p, jnp.broadcast_shapes(p.shape, jnp.shape(n))),
        depends_on_n=False),
    "reinforce": Estimator(
        "reinforce", reinforce_advantage, min_rollouts=1,
        closed_form=lambda p, n: jnp.broadcast_to(p, jnp.broadcast_shapes(p.shape, jnp.shape(n))),
        depends_on_n=False),
}


def get_estimator(name: str) -> Estimator:
    """Looks up an estimator by name; a ValueError lists the known ones."""
    try:
        return ESTIMATORS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown estimator {name!r}; known estimators: {sorted(ESTIMATORS)}") from None
