"""The registry of rollout allocators: every way of spending a step's rollout budget, by name (``sera.method``).

An entry (:class:`Allocator`) says what it needs from the step and is one pure function::

    counts_fn(target, budget, *, n_min, n_max, estimator, check) -> counts_P   (int32, sum = budget, in bounds)

``target`` is the step's success-rate estimate when ``needs_estimate`` (point estimates ``p_hat_P`` or a
:class:`BetaPosterior`, from a pilot inside the budget, the history tracker or an oracle), else None. The trainer,
the config validation and the memory planner ask the registry (``get_allocator``) what a method needs instead of
comparing names. Adding an allocator is one function, one ``register`` line and its test.

Entries:
  * ``uniform``: MaxRL's ``B // P`` each (the remainder to the first prompts); needs nothing.
  * ``sera``: SERA's exact discrete max–min of ``min_i s(p_i, N_i)`` (``allocation.allocate``).
  * ``sera_sum``: the ablation of SERA's objective, ``max sum_i s(p_i, N_i)``: the greedy marginal rule, one
    rollout at a time to the largest gain ``s(p_i, N_i + 1) - s(p_i, N_i)``. For the power-law factors
    ``s = 1 - (1-p)^(N-b)`` the gain ``p (1-p)^(N-b)`` decreases in N (s is concave), so the greedy is optimal for
    the separable concave sum and takes the ``B - P n_min`` largest gains; under a Beta posterior the expected
    gain ``B(a+1, b'+N-b) / B(a, b')`` decreases too. (The marginal ``p (1-p)^N`` rule of
    linjiw/curriculum-maxrl's THEORY.md, here with MaxRL's offset b = 1.)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln

from sera_jax.core import allocation
from sera_jax.core.allocation import BetaPosterior
from sera_jax.core.estimators import Estimator, get_estimator

Array = jnp.ndarray
Target = Optional[Union[Array, BetaPosterior]]


@dataclasses.dataclass(frozen=True)
class Allocator:
    """A registered allocator: its name, what it needs, and its counts function (see the module docstring).

    ``needs_estimate``: the counts depend on the step's success rates (so the trainer estimates them, by
    ``sera.p_estimate``). ``check_estimator(est)`` raises ValueError when the allocator is undefined for an
    estimator (e.g. SERA's max–min for a factor that does not depend on N). ``source``: where the rule comes from.
    """

    name: str
    counts_fn: Callable[..., Array]
    needs_estimate: bool
    source: str
    check_estimator: Callable[[Estimator], None] = lambda est: None

    def counts(self, target: Target, budget: int, *, n_min: int, n_max: int, estimator: str = "maxrl",
               num_prompts: Optional[int] = None, check: bool = True) -> Array:
        """Integer counts of ``budget`` rollouts over the step's prompts (``num_prompts`` when ``target`` is
        None). Bad inputs raise ValueError; with a traced target a run-time check raises when the program runs
        (``check=False`` drops it)."""
        if target is None:
            if self.needs_estimate:
                raise ValueError(f"allocator {self.name!r} needs the step's success-rate estimates")
            target = jnp.full((num_prompts,), 0.5, jnp.float32)  # a placeholder it does not read
        return self.counts_fn(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check)


ALLOCATORS: dict[str, Allocator] = {}


def register(allocator: Allocator) -> Allocator:
    if allocator.name in ALLOCATORS:
        raise ValueError(f"an allocator named {allocator.name!r} is already registered")
    ALLOCATORS[allocator.name] = allocator
    return allocator


def get_allocator(name: str) -> Allocator:
    """The registered allocator ``name``; ValueError listing the known ones."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocation method {name!r}; known methods: {sorted(ALLOCATORS)}")
    return ALLOCATORS[name]


# ---------------------------------------------------------------------------------------------------------
# uniform and sera


def _uniform(target, budget, *, n_min, n_max, estimator, check):
    return allocation.allocate(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, method="uniform",
                               check=False)  # the target is not read


def _sera(target, budget, *, n_min, n_max, estimator, check):
    return allocation.allocate(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, method="sera",
                               check=check)


def _needs_n_dependence(est: Estimator) -> None:
    if not est.depends_on_n:
        raise ValueError(f"estimator {est.name!r} has a scale factor that does not depend on N, so SERA's allocation "
                         "is undefined for it; use method='uniform'")


# ---------------------------------------------------------------------------------------------------------
# sera_sum: the greedy marginal rule on the sum of the factors


def _needs_power_law(est: Estimator) -> None:
    if est.power_offset is None:
        raise ValueError(f"method 'sera_sum' needs a power-law factor s = 1 - (1-p)^(N-b) (concave in N, so the "
                         f"greedy is optimal); estimator {est.name!r} has none: use maxrl or maxrl_no_baseline")


def marginal_gain_keys(target: Union[Array, BetaPosterior], offset: int, n_min: int, n_max: int) -> Array:
    """``-log gain_i(n)`` for n in [n_min, n_max): the gain of a rollout taking prompt i from n to n + 1, as a key
    that is >= 0 and non-decreasing in n (the largest gains are the smallest keys; a zero gain is +inf).

    Point p: ``gain = p (1-p)^(n-b)``, so ``key = -log p + (n-b) lambda`` with ``lambda = -log(1-p)``; posterior:
    ``gain = B(a+1, b'+n-b) / B(a, b')``, so ``key = log B(a, b') - log B(a+1, b'+n-b)``."""
    if isinstance(target, BetaPosterior):
        m = jnp.arange(n_min, n_max, dtype=target.alpha.dtype)[None, :] - offset
        a, b = target.alpha[:, None], target.beta[:, None]
        return jnp.maximum(betaln(a, b) - betaln(a + 1.0, b + m), 0.0)
    p = target[:, None]
    m = jnp.arange(n_min, n_max, dtype=target.dtype)[None, :] - offset
    lam = -jnp.log1p(-p)  # inf at p = 1
    growth = jnp.where(m == 0, 0.0, m * lam)  # no 0 * inf at m = 0
    return jnp.maximum(-jnp.log(p) + growth, 0.0)  # -log 0 = inf: p = 0 gains nothing


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max", "estimator"))
def _sum_impl(target, budget, n_min, n_max, estimator):
    table_PxM = marginal_gain_keys(target, get_estimator(estimator).power_offset, n_min, n_max)
    return allocation._table_allocation(table_PxM, budget, n_min, n_max)


def _sera_sum(target, budget, *, n_min, n_max, estimator, check):
    est = get_estimator(estimator)
    _needs_power_law(est)
    # The same validation as the max–min (shapes, probabilities, bounds, budget).
    if isinstance(target, BetaPosterior):
        target = allocation._check_posterior(target, check)
        num_prompts = target.alpha.shape[0]
    else:
        target = allocation._check_p_hat(target, check)
        num_prompts = target.shape[0]
    budget, n_min, n_max = allocation.check_problem(num_prompts, budget, n_min, n_max, est, "sera")
    return _sum_impl(target, budget=budget, n_min=n_min, n_max=n_max, estimator=estimator)


register(Allocator("uniform", _uniform, needs_estimate=False, source="MaxRL (arXiv 2602.02710): N = B / P"))
register(Allocator("sera", _sera, needs_estimate=True, check_estimator=_needs_n_dependence,
                   source="SERA.md §3: the exact discrete max–min of min_i s(p_i, N_i)"))
register(Allocator("sera_sum", _sera_sum, needs_estimate=True, check_estimator=_needs_power_law,
                   source="SERA's sum-objective ablation: greedy marginal gains p (1-p)^(N-b) (THEORY.md of "
                          "linjiw/curriculum-maxrl, with b = 1)"))
