"""The registry of rollout allocators: every way of spending a step's rollout budget, by name (``sera.method``).

An entry (:class:`Allocator`) says what it needs from the step and is one pure function::

    counts_fn(target, budget, *, n_min, n_max, estimator, check) -> counts_P   (int32, sum = budget, in bounds)

Users call an entry by name: ``sera_jax.allocate(p_hat, B, n_min=, n_max=, method=NAME)`` (every entry whose counts
need nothing but the step's estimates), or ``get_allocator(NAME).counts(...)``.

``target`` is the step's success-rate estimate when ``needs_estimate`` (point estimates ``p_hat_P`` or a
:class:`BetaPosterior`, from a pilot inside the budget, the history tracker or an oracle), else None. The trainer,
the config validation and the memory planner ask the registry (``get_allocator``) what a method needs instead of
comparing names. Adding an allocator is one function, one ``register`` line and its test.

Entries:
  * ``uniform``: MaxRL's ``B // P`` each (the remainder to the first prompts); needs nothing.
  * ``sera``: SERA as its authors released it (``released_rule``): an active set of the prompts that can still give
    a mixed group, zero rollouts for the rest, the centred waterline with floor-and-refill over the active ones.
  * ``sera_all_active``: the exact discrete max–min of ``min_i s(p_i, N_i)`` over every prompt
    (``allocation.all_active_counts``), reconstructed before the code was published; its token-budget and posterior
    forms.
  * ``sera_sum``: the ablation of SERA's objective, ``max sum_i s(p_i, N_i)``: the greedy marginal rule, one
    rollout at a time to the largest gain ``s(p_i, N_i + 1) - s(p_i, N_i)``. For the power-law factors
    ``s = 1 - (1-p)^(N-b)`` the gain ``p (1-p)^(N-b)`` decreases in N (s is concave), so the greedy is optimal for
    the separable concave sum and takes the ``B - P n_min`` largest gains; under a Beta posterior the expected
    gain ``B(a+1, b'+N-b) / B(a, b')`` decreases too. (The marginal ``p (1-p)^N`` rule of
    linjiw/curriculum-maxrl's THEORY.md, here with MaxRL's offset b = 1.)
  * ``dynamo``: DynaMO's (arXiv 2602.19208) rollout counts: n_min each, the rest water-filled in proportion to
    the priority ``max(4 p (1-p), 0.01)`` (0.01 once p >= 0.85), capped at n_max (:func:`dynamo_counts`).
  * ``knapsack``: Knapsack RL's (arXiv 2509.25849) counts: the exact maximiser of
    ``sum_i (1 - p_i^N_i - (1-p_i)^N_i) p_i (1-p_i)^2``, with its p = 0 / p = 1 fallback (:func:`knapsack_counts`).
  * ``dars_et`` / ``dars_hw``: DARS's (arXiv 2508.13755) extra rollouts after a pilot, in proportion to its
    Equal-Treatment / Hardness-Weighted schedules (``core.dars``), then DAPO's filter.
  * ``dapo``, ``pods``: uniform rollouts, then a train mask (DAPO's mixed groups; PODS's max-variance subset).
  * ``reinforce_ada``: sampling in rounds until each prompt has enough successes and failures, a balanced subset
    trains (``core.keep``).
  * ``mopps``, ``greso``: prompt selection among ``sera.candidate_ratio`` x P candidates of the stream (MoPPS's
    Thompson-sampled posteriors; GRESO's skips from reward streaks, then DAPO's filter; ``core.selection``).

Beyond counts, an entry may give a train mask (``keep_fn``), online rounds (``round_fn``) or a prompt selection
(``select_fn``); the trainer runs each kind (``Allocator.kind``), and every rollout sampled counts toward B.

docs/allocators.md specifies the published rules (repository, commit, function) and how each is run at our
fixed budget; the docstrings below list every adaptation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln

from sera_jax.core import allocation
from sera_jax.core import dars as dars_lib
from sera_jax.core import keep as keep_lib
from sera_jax.core import released_rule
from sera_jax.core import selection as selection_lib
from sera_jax.core.allocation import BetaPosterior
from sera_jax.core.estimators import Estimator, get_estimator
from sera_jax.core.success_rates import pilot_posterior

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
    # What a method decides besides counts made before sampling (docs/allocators.md §0); each is optional and
    # reads its settings from the config's ``sera`` section (``settings``):
    #   keep_fn(rewards_B, prompt_ids_B, num_prompts, settings) -> train_B: which sampled rollouts train (0/1 on
    #     the flat layout; the others count toward the budget and, unless ``advantages_from_kept``, toward their
    #     prompt's K_i and N_i);
    #   round_fn(counts_P, successes_P, remaining, settings) -> extra_P: online sampling in rounds, each round's
    #     rollouts per prompt from what the earlier rounds drew (the trainer calls it until the budget is spent);
    #   select_fn(history, keys_C, num_select, key, settings) -> idx_P: which of C candidate prompts of the
    #     step's stream enter it (``history``: the trainer's PromptHistory of earlier steps).
    keep_fn: Optional[Callable[..., Array]] = None
    advantages_from_kept: bool = False
    round_fn: Optional[Callable[..., Array]] = None
    select_fn: Optional[Callable[..., Array]] = None
    # The ``sera.p_estimate`` values it is defined for, and whether a pilot hands it the raw success fraction
    # K/n0 (the rule is written for it: DARS) rather than the pilot's posterior.
    p_estimates: tuple[str, ...] = ("pilot", "history", "epoch_history", "oracle")
    pilot_fraction: bool = False
    accepts_costs: bool = False  # has a token-budget form (``sera.budget="tokens"``: ``allocation.allocate_tokens``)
    accepts_posterior: bool = True  # allocates on a BetaPosterior itself (``sera.use_posterior``), not only its mean
    # Gives some prompts no rollouts of their own (``counts`` then returns ``floor`` for them: 0, or the rollouts a
    # pilot already spent). Such prompts are not sampled and weigh nothing in the loss.
    may_skip_prompts: bool = False
    # The level the rule equalises, for the step's metrics: waterline_fn(target, budget, n_min, n_max, estimator,
    # floor, threshold) -> tau (the factors' common value is 1 - exp(-tau)); None where a rule has none.
    waterline_fn: Optional[Callable[..., Array]] = None

    @property
    def kind(self) -> str:
        """``counts`` (before sampling), ``rounds`` (online) or ``selection`` (of prompts): how the trainer runs it."""
        return "rounds" if self.round_fn else "selection" if self.select_fn else "counts"

    def counts(self, target: Target, budget: int, *, n_min: int, n_max: int, estimator: str = "maxrl",
               num_prompts: Optional[int] = None, check: bool = True, floor: int = 0,
               threshold: Optional[float] = None, costs_P: Optional[Array] = None) -> Array:
        """Integer counts ``N_P`` (int32) of ``budget`` rollouts over the step's prompts, in ``[n_min, n_max]``
        (0, or ``floor``, for the prompts a rule skips).

        Args:
          target: the step's estimates: point estimates ``p_hat_P`` in [0, 1] or a :class:`BetaPosterior` (where
            ``accepts_posterior``); None for a rule that reads none (``needs_estimate`` False), with
            ``num_prompts``.
          budget: the rollouts to spend (a static int; with ``costs_P`` a token budget, a static real).
          n_min, n_max: static bounds on a sampled prompt's rollouts.
          estimator: the advantage estimator the counts are for; a rule undefined for it raises ValueError
            naming both (``check_estimator``).
          floor: rollouts every prompt already has (a pilot's), the least a skipped prompt keeps
            (``may_skip_prompts``; the others give every prompt at least n_min).
          threshold: the least mixed-group chance of an active prompt (``sera.activation_threshold``; None: the
            rule's default).
          costs_P: tokens per rollout of each prompt (``accepts_costs``: ``sum_i l_i N_i <= budget``).
          check: value checks (eagerly a ValueError; traced, inside ``checkify.checkify``: ``core.validation``).
        """
        self.check_estimator(get_estimator(estimator))
        if costs_P is not None and not self.accepts_costs:
            raise ValueError(f"method {self.name!r} has no token-budget form (costs_P); those that do: "
                             f"{sorted(n for n, a in ALLOCATORS.items() if a.accepts_costs)}")
        if target is None:
            if self.needs_estimate:
                raise ValueError(f"allocator {self.name!r} needs the step's success-rate estimates")
            target = jnp.full((num_prompts,), 0.5, jnp.float32)  # a placeholder it does not read
        if isinstance(target, BetaPosterior) and not self.accepts_posterior:
            raise ValueError(f"allocator {self.name!r} allocates on point estimates, not a Beta posterior: pass its "
                             f"mean (config.sera.use_posterior=False), or use sera_all_active, which allocates on "
                             f"the posterior's expected factor")
        extra = {}
        if self.may_skip_prompts:
            extra = {"floor": floor} if threshold is None else {"floor": floor, "threshold": threshold}
        if costs_P is not None:
            extra["costs_P"] = costs_P
        return self.counts_fn(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check, **extra)


ALLOCATORS: dict[str, Allocator] = {}


def register(allocator: Allocator) -> Allocator:
    if allocator.name in ALLOCATORS:
        raise ValueError(f"an allocator named {allocator.name!r} is already registered")
    ALLOCATORS[allocator.name] = allocator
    return allocator


def get_allocator(name: str) -> Allocator:
    """The registered allocator ``name`` (an :class:`Allocator`); ValueError listing the known ones.

    What it says about itself: ``needs_estimate`` (its counts read the step's success rates), ``kind``
    (``"counts"`` chosen before sampling, ``"rounds"`` sampled online, ``"selection"`` of prompts),
    ``accepts_posterior``, ``accepts_costs`` (a token budget), ``may_skip_prompts`` (0 rollouts for some),
    ``check_estimator(est)`` and ``source`` (the published code it follows). Its counts::

        sera_jax.get_allocator("sera").counts(p_hat_P, 32, n_min=2, n_max=16)   # int32 (P,), sums to 32

    ``sera_jax.allocate(p_hat_P, 32, n_min=2, n_max=16, method=name)`` is the same call by name, for every entry
    whose counts need nothing but the step's estimates (:func:`allocate` lists them). ``ALLOCATORS`` holds them
    all.
    """
    if not isinstance(name, str) or name not in ALLOCATORS:
        raise ValueError(f"unknown allocation method {name!r}; known methods: {sorted(ALLOCATORS)}")
    return ALLOCATORS[name]


def pilot_allocate(successes_P: Array, n0: int, budget: int, *, n_min: int = 2, n_max: int,
                   estimator: str = "maxrl", use_posterior: bool = False, check: bool = True,
                   method: Union[str, Allocator] = "sera", threshold=None) -> Array:
    """Total counts (pilot included) after ``n0`` pilot rollouts per prompt: ``N_i >= max(n_min, n0)``.

    The pilot's successes give a posterior (``success_rates.pilot_posterior``); the budget (which includes the
    ``P n0`` pilot rollouts) is allocated by the allocator ``method`` (a registered name, or the ``Allocator``
    itself when the caller has already looked it up) on its mean, or on the posterior itself with
    ``use_posterior`` (on the fraction ``K_i / n0`` for an allocator whose rule is written for it,
    ``Allocator.pilot_fraction``). Prompt i then gets ``N_i - n0`` more rollouts.
    """
    allocator = method if isinstance(method, Allocator) else get_allocator(method)
    posterior = pilot_posterior(successes_P, n0, check=check)
    if allocator.pilot_fraction:  # a rule written for the pilot's raw success fraction (DARS)
        target = dars_lib.PilotFractions(jnp.asarray(successes_P, jnp.float32) / n0, n0)
    else:
        target = posterior if use_posterior else posterior.mean
    # A rule that skips prompts keeps them at the pilot's n0 (the authors' inactive_floor mode).
    return allocator.counts(target, budget, n_min=max(n_min, n0), n_max=n_max, estimator=estimator, check=check,
                            floor=n0, threshold=threshold)


# ---------------------------------------------------------------------------------------------------------
# uniform and sera


def _uniform(target, budget, *, n_min, n_max, estimator, check):
    return allocation.all_active_counts(target, budget, n_min=n_min, n_max=n_max, estimator=estimator,
                                        method="uniform", check=False)  # the target is not read


def _sera(target, budget, *, n_min, n_max, estimator, check, floor=0,
          threshold=released_rule.DEFAULT_THRESHOLD):
    """The released rule (``released_rule.released_allocation``) with the authors' threshold, on the estimator's
    power law (b = 1 for maxrl: theirs). With a pilot (``floor`` = n0) the inactive prompts keep the pilot's
    rollouts (the authors' ``inactive_floor`` mode); they are then trained like the rest (they were paid for)."""
    target = allocation._check_p_hat(target, check)  # named as allocate names it; checked once
    return released_rule.released_allocation(target, budget, n_min=n_min, n_max=n_max, floor=floor,
                                             threshold=threshold, offset=get_estimator(estimator).power_offset,
                                             check=False).counts_P


def _sera_waterline(target, budget, *, n_min, n_max, estimator, floor=0, threshold=released_rule.DEFAULT_THRESHOLD):
    return released_rule.released_allocation(target, budget, n_min=n_min, n_max=n_max, floor=floor,
                                             threshold=threshold, offset=get_estimator(estimator).power_offset,
                                             check=False).tau


def _sera_all_active(target, budget, *, n_min, n_max, estimator, check, costs_P=None):
    return allocation.all_active_counts(target, budget, n_min=n_min, n_max=n_max, estimator=estimator,
                                        method="sera_all_active", check=check, costs_P=costs_P)


def _needs_n_dependence(est: Estimator) -> None:
    allocation.check_depends_on_n(est, "sera_all_active")


# ---------------------------------------------------------------------------------------------------------
# sera_sum: the greedy marginal rule on the sum of the factors


def _needs_power_law_for(method: str, why: str = "") -> Callable[[Estimator], None]:
    def check(est: Estimator) -> None:
        if est.power_offset is None:
            raise ValueError(f"method {method!r} needs a power-law factor s = 1 - (1-p)^(N-b){why}; estimator "
                             f"{est.name!r} has none: use maxrl or maxrl_no_baseline")
    return check


_needs_power_law = _needs_power_law_for("sera_sum", " (concave in N, so the greedy is optimal)")


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
    budget, n_min, n_max = allocation.check_problem(num_prompts, budget, n_min, n_max, est)
    return _sum_impl(target, budget=budget, n_min=n_min, n_max=n_max, estimator=estimator)


# ---------------------------------------------------------------------------------------------------------
# Published count allocators (docs/allocators.md §2-3): counts chosen before sampling from a point estimate.


def _point_estimate(target: Union[Array, BetaPosterior], budget, n_min, n_max, estimator: str,
                    check: bool) -> tuple[Array, int, int, int]:
    """The validated step estimate as points ``p_P`` (a posterior's mean) and the static (budget, n_min, n_max).

    The bounds and budget are checked as for every allocator (an infeasible budget is a ValueError; the estimator
    only sets the smallest n_min); these rules do not read the estimator otherwise."""
    if isinstance(target, BetaPosterior):
        target = allocation._check_posterior(target, check)
        p_P = target.mean
    else:
        p_P = allocation._check_p_hat(target, check)
    budget, n_min, n_max = allocation.check_problem(p_P.shape[0], budget, n_min, n_max, get_estimator(estimator))
    return p_P, budget, n_min, n_max


DYNAMO_MASTERY, DYNAMO_MIN_PRIORITY = 0.85, 0.01  # update_rank(mastery_threshold=0.85, min_priority=0.01)


def dynamo_priority(p_P: Array) -> Array:
    """DynaMO's priority (``update_rank``): ``w = 0.01`` if ``p >= 0.85``, else ``max(4 p (1-p), 0.01)``."""
    learnability = jnp.maximum(4.0 * p_P * (1.0 - p_P), DYNAMO_MIN_PRIORITY)
    return jnp.where(p_P >= DYNAMO_MASTERY, jnp.asarray(DYNAMO_MIN_PRIORITY, p_P.dtype), learnability)


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max"))
def _dynamo_impl(p_P, budget, n_min, n_max):
    num_prompts = p_P.shape[0]
    w_P = dynamo_priority(p_P)
    index_P = jnp.arange(num_prompts)

    def one_pass(state):
        counts_P, left, passes = state
        eligible_P = counts_P < n_max  # the code's `priority > 1e-8` always holds: w >= 0.01
        w_eligible_P = jnp.where(eligible_P, w_P, 0.0)
        ideal_P = left.astype(w_P.dtype) * (w_eligible_P / jnp.sum(w_eligible_P))  # the code's order
        floor_P = jnp.floor(ideal_P).astype(jnp.int32)
        remainder = jnp.maximum(left - jnp.sum(floor_P), 0)
        # +1 to the `remainder` largest fractional parts among the eligible prompts, ties by index (stable sort).
        fraction_P = jnp.where(eligible_P, ideal_P - floor_P.astype(w_P.dtype), -jnp.inf)
        order_P = jnp.argsort(-fraction_P, stable=True)
        rank_P = jnp.zeros(num_prompts, jnp.int32).at[order_P].set(index_P.astype(jnp.int32))
        bonus_P = eligible_P & (rank_P < remainder)
        add_P = jnp.where(eligible_P, jnp.minimum(floor_P + bonus_P, n_max - counts_P), 0)
        return counts_P + add_P, left - jnp.sum(add_P), passes + 1

    start = (jnp.full((num_prompts,), n_min, jnp.int32), jnp.int32(budget - num_prompts * n_min), jnp.int32(0))
    counts_P, left, _ = jax.lax.while_loop(lambda state: (state[1] > 0) & (state[2] <= num_prompts), one_pass,
                                           start)
    # Guard against float rounding only (in exact arithmetic every pass but the last fills a prompt to n_max, so
    # at most P passes spend everything): whatever is left goes to the first prompts below n_max, by index.
    room_P = n_max - counts_P
    before_P = jnp.cumsum(room_P) - room_P
    return (counts_P + jnp.clip(left - before_P, 0, room_P)).astype(jnp.int32)


def dynamo_counts(target: Union[Array, BetaPosterior], budget: int, *, n_min: int, n_max: int,
                  estimator: str = "maxrl", check: bool = True) -> Array:
    """DynaMO's rollout counts (Dynamic rollout allocation, arXiv 2602.19208), at a fixed budget.

    Source: GithubX-F/DynaMO-RL @ 63e5ec9afb3a32673fc83a8dc8acf63eea8e0774, ``recipe/dynamo/dynamo_ray_trainer.py``
    ``get_rollout_n_per_prompt`` (the counts) and ``recipe/dynamo/rl_dataset.py`` ``update_rank`` (the priority);
    docs/allocators.md §2. The README's variance-minimising ``n_i* = B sigma_i / sum_k sigma_k`` is run in the code
    as follows, and we implement the code:

      priority ``w_i = 0.01`` if ``p_i >= 0.85`` (mastered), else ``max(4 p_i (1 - p_i), 0.01)``;
      ``N_i = n_min``, ``R = B - P n_min``; then, while R > 0, one pass over the eligible prompts E (``N_i < n_max``):
      ``a_i = floor(R w_i / sum_E w)``, plus 1 for the ``R - sum_E floor(.)`` largest fractional parts of
      ``R w_i / sum_E w`` (ties by index); ``N_i += min(a_i, n_max - N_i)``; ``R -=`` what was added.

    So the counts are n_min plus a share of ``B - P n_min`` proportional to the priority, capped at n_max (not
    ``N ∝ w``). Jittable (budget and bounds static): a ``lax.while_loop`` of at most P + 1 passes (each pass but
    the last fills at least one prompt to n_max), O(P log P) each.

    Adaptations to our fixed budget, bounds and estimates:
      * The priority is computed from the step's estimate ``target`` (p_hat, or a :class:`BetaPosterior`'s mean),
        not from the code's cumulative history ``acc = positives / sample_count`` (a positive: a reward above the
        step batch's mean) refreshed once per epoch. A never-sampled prompt has priority 1.0 in the code; an
        estimate cannot tell it apart, so we always use the estimate's priority.
      * ``n_min`` / ``n_max`` (config) replace the paper's ``n_low`` / ``n_high`` (defaults 4 / 24).
      * The budget is B itself: an infeasible budget raises ValueError instead of the code's silent clip to
        ``[P n_min, P n_max]``.
      * The code's exploration step (``max(0, initial_budget - sample_count)`` rollouts first, with
        ``initial_budget = 4`` from ``fit``) is dropped: we have no sample counts, and with ``initial_budget <=
        n_min`` (4 <= 4 in the paper) it is undone by raising every prompt to n_min.
      * Ties among fractional parts go to the lower index (the code's ``np.argsort`` is not stable).
      * The code's round-robin branch for "no eligible prompt" is unreachable (every priority is >= 0.01 and a
        feasible budget leaves a prompt below n_max while R > 0); a final guard, which only float rounding could
        reach, gives any remainder to the first prompts below n_max so the sum is exactly B.
      * The arithmetic is in p's dtype (float32 in the trainer), not float64: shares within rounding of a tie
        may resolve differently.

    Returns int32 counts ``counts_P`` with ``sum = budget`` and ``n_min <= N_i <= n_max``.
    """
    p_P, budget, n_min, n_max = _point_estimate(target, budget, n_min, n_max, estimator, check)
    return _dynamo_impl(p_P, budget=budget, n_min=n_min, n_max=n_max)


def _dynamo(target, budget, *, n_min, n_max, estimator, check):
    return dynamo_counts(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check)


KNAPSACK_ALPHA = 0.9  # sampling_budget_by_knapsack(alpha=0.9): the cost's confidence level


def knapsack_increment_keys(p_P: Array, n_min: int, n_max: int) -> Array:
    """``-log(V(p_i, n + 1) - V(p_i, n))`` for n in [n_min, n_max), with Knapsack RL's value
    ``V(p, N) = (1 - p^N - (1-p)^N) p (1-p)^2`` (the probability of a non-zero GRPO gradient times "InfoGain").

    The increment ``(p^n (1-p) + p (1-p)^n) p (1-p)^2`` decreases in n (V is concave in N); it is computed in logs,
    so the key is finite and > 0 for 0 < p < 1 and non-decreasing in n (a running max makes that exact under
    rounding). p = 0 and p = 1 gain nothing: key +inf."""
    interior_P = (p_P > 0) & (p_P < 1)
    p = jnp.where(interior_P, p_P, 0.5)[:, None]
    n = jnp.arange(n_min, n_max, dtype=p_P.dtype)[None, :]
    log_p, log_q = jnp.log(p), jnp.log1p(-p)
    log_gain = log_p + 2.0 * log_q + jnp.logaddexp(n * log_p + log_q, log_p + n * log_q)
    keys_PxM = jax.lax.cummax(jnp.maximum(-log_gain, 0.0), axis=1)
    return jnp.where(interior_P[:, None], keys_PxM, jnp.inf)


def knapsack_costs(p_P: Array) -> Array:
    """Knapsack RL's cost ``c = ln(1 - alpha) / ln(max(p, 1 - p))``: the n at which a group is all one outcome with
    probability <= 1 - alpha (``sampling_budget_by_knapsack``, alpha 0.9), for 0 < p < 1 (other entries: any).

    ``ln(max(p, 1 - p))`` is taken as ``log1p(-min(p, 1 - p))``: for p below 2^-25, ``1 - p`` rounds to 1 in float32,
    so ``log(1 - p)`` gives 0 and c = -inf, while c is really about ``2.3 / p``. A log that is still 0 (q within
    rounding of 1) means an unbounded cost: +inf."""
    log_q_P = jnp.log1p(-jnp.minimum(p_P, 1.0 - p_P))  # 1 - p is exact for p >= 1/2 (Sterbenz)
    log_alpha = jnp.log(jnp.asarray(1.0 - KNAPSACK_ALPHA, p_P.dtype))
    return jnp.where(log_q_P < 0, log_alpha / log_q_P, jnp.inf)


def _even_share(amount, mask_P: Array, cap: int) -> Array:
    """``amount`` split evenly over the prompts in ``mask_P`` (the remainder +1 each to the first by index), each
    share capped at ``cap``: round-robin in index order from equal counts."""
    k = jnp.sum(mask_P)
    safe_k = jnp.maximum(k, 1)
    rank_P = jnp.cumsum(mask_P) - 1
    share_P = amount // safe_k + (rank_P < amount % safe_k)
    return jnp.where(mask_P & (k > 0), jnp.minimum(share_P, cap), 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("budget", "n_min", "n_max"))
def _knapsack_impl(p_P, budget, n_min, n_max):
    num_steps = n_max - n_min
    left = budget - p_P.shape[0] * n_min  # R: what the base counts (n_min each) leave
    effective_P = (p_P > 0) & (p_P < 1)
    zero_P = p_P == 0
    any_effective, any_zero = jnp.any(effective_P), jnp.any(zero_P)
    # The effective prompts' costs (knapsack_costs: finite, or +inf, for every 0 < p < 1); C = sum floor(min(n_max, c)).
    cost_P = knapsack_costs(jnp.where(effective_P, p_P, 0.5))
    capacity = jnp.sum(jnp.where(effective_P, jnp.floor(jnp.minimum(cost_P, n_max)), 0.0)).astype(jnp.int32)
    # Forced rollouts: with no effective prompt all of R goes evenly to the p = 0 prompts (or to every prompt
    # when there is none); with the fallback, the excess R - C goes to the p = 0 prompts (or, with none, to the
    # other non-effective ones, the p = 1 prompts). Capped at n_max, the rest round-robin to the others.
    fallback = any_effective & (capacity < left) & ~jnp.all(effective_P)
    excess = jnp.where(any_effective, jnp.where(fallback, left - capacity, 0), left)
    targets_P = jnp.where(any_zero, zero_P, jnp.where(any_effective, ~effective_P, True))
    forced_P = _even_share(excess, targets_P, num_steps)
    forced_P = forced_P + _even_share(excess - jnp.sum(forced_P), ~targets_P, num_steps)
    # Then the largest increments of V over the effective prompts (the knapsack); what they cannot take goes to
    # the rest by (count, index). Steps: forced ones key 0, then the effective prompts' -log increments (> 0),
    # the others +inf; the budget's B - P n_min smallest in (key, n, i) order.
    step_M = jnp.arange(num_steps)[None, :]
    keys_PxM = jnp.where(step_M < forced_P[:, None], 0.0, knapsack_increment_keys(p_P, n_min, n_max))
    return allocation._table_allocation(keys_PxM, budget, n_min, n_max)


def knapsack_counts(target: Union[Array, BetaPosterior], budget: int, *, n_min: int, n_max: int,
                    estimator: str = "maxrl", check: bool = True) -> Array:
    """Knapsack RL's rollout counts (arXiv 2509.25849), at a fixed budget.

    Source: liziniu/KnapsackRL @ ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5, ``verl/trainer/ppo/exploration_utils.py``
    ``sampling_budget_by_knapsack`` and ``solve_by_dp`` (``verl/trainer/ppo/ray_trainer.py`` ``budget_allocation``
    calls them; the estimates come from ``verl/utils/dataset/rl_dataset.py`` ``update_sample_state`` /
    ``get_sample_state``); docs/allocators.md §3. The published rule (alpha 0.9, min_n = negative_n = positive_n
    = 2, max_n 128, ``examples/knapsack_trainer/run_knapsack_grpo_7b.sh``):

      * estimate: a prompt is valid iff at least 8 of its rollouts have been seen; p_hat is its last visit's
        success rate, or the mean of its 16 most recent rollouts when that visit had fewer than 16. Invalid
        prompts get n.
      * base counts: min_n for an *effective* prompt (0 < p_hat < 1), negative_n for p_hat = 0, positive_n for
        p_hat = 1; R = B - sum(base).
      * no effective prompt (R > 0): R evenly to the p_hat = 0 prompts (remainder to the first by index);
        without any, every prompt gets n.
      * fallback: with costs ``c_i = ln(1 - alpha) / ln(max(p_i, 1 - p_i))`` (the n at which a group is all one
        outcome with probability <= 1 - alpha) and ``C = sum_eff floor(min(max_n, c_i))``: if C < R, the excess
        R - C goes evenly (uncapped) to the p_hat = 0 prompts, or to all non-effective prompts if there are none,
        and R <- C.
      * knapsack: R over the effective prompts, ``extra_i in [0, max_n - min_n]``, maximising
        ``sum_i V(p_i, min_n + extra_i)``, ``V(p, N) = (1 - p^N - (1-p)^N) p (1-p)^2``, by dynamic programming;
        what exceeds the capacity is spread evenly over the effective prompts, uncapped.

    Here: ``N_i = n_min`` for every prompt, R = B - P n_min, the p = 0 / p = 1 rules as published (capped, see
    below), then the ``R`` (or C) largest increments ``V(p_i, n + 1) - V(p_i, n)`` over the effective prompts
    (:func:`knapsack_increment_keys`): the increments decrease in n, so this greedy is the exact maximiser of
    ``sum_i V(p_i, N_i)`` under the sum and the bounds (docs/allocators.md §0), and it is jittable
    (``allocation._table_allocation``, keys ``-log increment``). Costs and keys are computed in logs with
    ``log1p`` (:func:`knapsack_costs`), so they stay finite and right for a tiny p, where ``1 - p`` rounds to 1.

    Adaptations to our fixed budget, bounds and estimates:
      * Every prompt is valid: ``target`` is the step's estimate (p_hat, or a :class:`BetaPosterior`'s mean), so the
        published validity rule and the invalid prompts' n do not apply.
      * ``n_min`` replaces min_n, negative_n and positive_n (all 2 in the paper) and ``n_max`` replaces max_n
        (128), both in the bounds and in C. Every share the code leaves uncapped (the p = 0 prompts' even split,
        the fallback's excess, the knapsack's overflow) stops at n_max; what the caps leave goes to the other
        prompts: the fallback's by index from equal counts (round-robin), the knapsack's overflow by
        (count, index) over the non-effective prompts (docs/allocators.md §0's tie order).
      * With no effective prompt and no p = 0 prompt, "every prompt gets n" becomes the uniform counts
        ``B // P`` (remainder to the first prompts).
      * The fallback is skipped when every prompt is effective (the code divides by zero candidates there): the
        greedy then spends all of R on the effective prompts.
      * The p = 0 / p = 1 cases are exactly defined only for estimates that are exactly 0 or 1 (e.g. oracle
        estimates, or a pilot's raw rate); a Beta posterior's mean is never 0 or 1 (up to float rounding), so
        with posteriors every prompt is effective and there is no fallback.
      * The code's DP scores ``extra = 0`` as 0 instead of ``V(p, min_n)`` (leaving a prompt at min_n forfeits its
        value); that quirk is NOT reproduced: we maximise the stated objective.
      * Ties among equal increments go by (count, index) (the DP's are by its scan order). V is GRPO's; it is kept
        unchanged whatever the estimator.

    Returns int32 counts ``counts_P`` with ``sum = budget`` and ``n_min <= N_i <= n_max``.
    """
    p_P, budget, n_min, n_max = _point_estimate(target, budget, n_min, n_max, estimator, check)
    return _knapsack_impl(p_P, budget=budget, n_min=n_min, n_max=n_max)


def _knapsack(target, budget, *, n_min, n_max, estimator, check):
    return knapsack_counts(target, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check)


register(Allocator("uniform", _uniform, needs_estimate=False, source="MaxRL (arXiv 2602.02710): N = B / P"))
register(Allocator("sera", _sera, needs_estimate=True, check_estimator=_needs_power_law_for("sera"),
                   accepts_posterior=False, may_skip_prompts=True, waterline_fn=_sera_waterline,
                   source="SERA (arXiv 2609.36552), ChenZihao0121/SERA @ 3252ed5 allocate_rollouts_from_probabilities "
                          "(dynamic_active_equalized): active set, centred waterline, floor and refill"))
register(Allocator("sera_all_active", _sera_all_active, needs_estimate=True, check_estimator=_needs_n_dependence,
                   accepts_costs=True,
                   source="SERA reconstructed from its abstract: the exact discrete max–min of min_i s(p_i, N_i) "
                          "over every prompt (close to the authors' all-active mode bias_equalized)"))
register(Allocator("sera_sum", _sera_sum, needs_estimate=True, check_estimator=_needs_power_law,
                   source="SERA's sum-objective ablation: greedy marginal gains p (1-p)^(N-b) (THEORY.md of "
                          "linjiw/curriculum-maxrl, with b = 1)"))
register(Allocator("dynamo", _dynamo, needs_estimate=True,
                   source="DynaMO (arXiv 2602.19208), GithubX-F/DynaMO-RL @ 63e5ec9 get_rollout_n_per_prompt: n_min "
                          "each, the rest water-filled by priority max(4 p (1-p), 0.01) (0.01 at p >= 0.85)"))
register(Allocator("knapsack", _knapsack, needs_estimate=True,
                   source="Knapsack RL (arXiv 2509.25849), liziniu/KnapsackRL @ ca5d5f5 sampling_budget_by_knapsack: "
                          "max sum_i (1 - p^N - (1-p)^N) p (1-p)^2 by the largest increments, p = 0 / 1 fallback"))


# ---------------------------------------------------------------------------------------------------------
# The peers that choose which rollouts train, sample online in rounds, or select prompts (docs/allocators.md
# §0: a 0/1 train mask on the fixed flat layout, rounds as successive sampler calls, selection from C candidates
# of the prompt stream every method reads). Every rollout sampled counts toward the step's budget B, discarded
# or not; what each adapted to spend exactly B is in its docstring and in docs/allocators.md.


def _online(target, budget, *, n_min, n_max, estimator, check):
    raise ValueError("this allocator chooses its counts online, round by round (Allocator.round_fn): the trainer "
                     "runs its rounds; it has no counts before sampling")


def _dapo_keep(rewards_B, prompt_ids_B, num_prompts, settings):
    """DAPO's dynamic sampling (arXiv 2503.14476; docs §1) at a fixed budget: uniform rollouts, then only the
    mixed groups (0 < K_i < N_i) train, the loss averaged over them (``loss_weights(train_B=...)``). The published
    refill (sample more prompts until the batch holds enough mixed groups) stops when the budget is spent, which
    at a fixed budget is what uniform sampling of B/P a prompt already is."""
    return keep_lib.mixed_groups(rewards_B, prompt_ids_B, num_prompts)


def _pods_keep(rewards_B, prompt_ids_B, num_prompts, settings):
    """PODS (arXiv 2504.13818; docs §7): of the B/P rollouts a prompt, the ``sera.keep_per_prompt`` with the
    largest reward variance train; their advantages are computed on them alone (``advantages_from_kept``)."""
    return keep_lib.max_variance_subset(rewards_B, prompt_ids_B, num_prompts, settings.keep_per_prompt)


def _reinforce_ada_round(counts_P, successes_P, remaining, settings):
    return keep_lib.reinforce_ada_round(counts_P, successes_P, remaining, round_size=settings.round_size,
                                        keep=settings.keep_per_prompt)


def _reinforce_ada_keep(rewards_B, prompt_ids_B, num_prompts, settings):
    """Reinforce-Ada (arXiv 2510.04996; docs §6), balanced: rounds of ``sera.round_size`` rollouts for the prompts
    without enough successes and failures yet, until the budget is spent (the published round cap replaced by
    the budget; what a finished step leaves goes round-robin to every prompt and only feeds the baselines);
    ``sera.keep_per_prompt`` rollouts a prompt train, half successes where there are, with the baseline of every
    rollout sampled for the prompt (its ``global_stat_est``)."""
    return keep_lib.balanced_subset(rewards_B, prompt_ids_B, num_prompts, settings.keep_per_prompt)


def _dars(variant: str):
    def counts(target, budget, *, n_min, n_max, estimator, check):
        return dars_lib.dars_counts(_point_estimate_only(target, "dars"), budget, n_pilot=n_min, n_max=n_max,
                                    variant=variant)
    return counts


def _point_estimate_only(target, name: str):
    if isinstance(target, BetaPosterior):
        raise ValueError(f"allocator {name!r} is defined on the pilot's success fractions, not a posterior")
    return target


def _mopps_select(history, keys_C, num_select, key, settings):
    """MoPPS (arXiv 2507.04632; docs §5): Thompson draws from each candidate's Beta(1 + successes, 1 + failures)
    of the decayed tracker (decay ``sera.history_decay``: MoPPS's lambda), the ``num_select`` closest to
    ``sera.target_rate`` enter the step."""
    posterior = selection_lib.mopps_posterior(history.tracker, keys_C)
    return selection_lib.mopps_select(posterior, num_select, key, target_rate=settings.target_rate)


def _greso_select(history, keys_C, num_select, key, settings):
    """GRESO (arXiv 2506.02177; docs §4): candidates skipped before rollout with probabilities from their streaks
    of all-correct / all-wrong visits; the first ``num_select`` survivors of the window enter the step."""
    return selection_lib.greso_select(history.skips, keys_C, num_select, key)


register(Allocator("dapo", _uniform, needs_estimate=False, keep_fn=_dapo_keep,
                   source="DAPO (arXiv 2503.14476), verl-recipe @ 48ea0a7 dapo_ray_trainer.fit: keep groups whose "
                          "rewards are not all equal"))
register(Allocator("pods", _uniform, needs_estimate=False, keep_fn=_pods_keep, advantages_from_kept=True,
                   source="PODS (arXiv 2504.13818), YixuanEvenXu/pods @ 187f43b maxvargrpo_trainer._prepare_inputs: "
                          "max-variance down-sampling to m of n"))
register(Allocator("reinforce_ada", _online, needs_estimate=False, round_fn=_reinforce_ada_round,
                   keep_fn=_reinforce_ada_keep,
                   source="Reinforce-Ada (arXiv 2510.04996), RLHFlow/Reinforce-Ada @ 05be605 "
                          "_generate_multi_round_adaptive_downsampling: rounds until balanced, keep n balanced"))
for _variant in ("et", "hw"):
    register(Allocator(f"dars_{_variant}", _dars(_variant), needs_estimate=True, p_estimates=("pilot",),
                       pilot_fraction=True, keep_fn=_dapo_keep,
                       source=f"DARS (arXiv 2508.13755), yangzhch6/DARS @ 9b21b71 schedule_{_variant.upper()}: extra "
                              "rollouts for hard prompts after a pilot, in proportion to the published Δn"))
register(Allocator("mopps", _uniform, needs_estimate=False, select_fn=_mopps_select,
                   source="MoPPS (arXiv 2507.04632), thu-rllab/MoPPS @ a883f51 PosteriorSampler.sample_batch: "
                          "Thompson-sampled Beta posteriors, the candidates closest to the target rate"))
register(Allocator("greso", _uniform, needs_estimate=False, select_fn=_greso_select, keep_fn=_dapo_keep,
                   source="GRESO (arXiv 2506.02177), Infini-AI-Lab/GRESO @ b277843 filter_examples_all_probabilistic: "
                          "probabilistic skips of prompts from their reward history, then DAPO's filter"))


# ---------------------------------------------------------------------------------------------------------
# One entry point: the registry's rules by name.


def _why_not_by_name(allocator: Allocator) -> Optional[str]:
    """Why ``allocate`` cannot run an entry from the step's estimates alone, and what to use instead (None: it can)."""
    name = allocator.name
    if allocator.kind == "rounds":
        return (f"method {name!r} samples in rounds, each from what the earlier ones drew (Allocator.round_fn), so "
                f"it has no counts before sampling; the trainer runs it (config.sera.method={name!r})")
    if allocator.kind == "selection":
        return (f"method {name!r} selects the step's prompts from a history of earlier steps (Allocator.select_fn "
                f"and its state); on the prompts it selects its counts are uniform's: method='uniform'")
    if allocator.pilot_fraction:
        return (f"method {name!r} allocates from a pilot's success fractions K_i / n0, not from estimates: call "
                f"pilot_allocate(successes_P, n0, budget, n_min=..., n_max=..., method={name!r})")
    return None


def allocate(p_hat: Target, budget, *, n_min: int = 2, n_max: int, method: str = "sera", estimator: str = "maxrl",
             check: bool = True, costs_P: Optional[Array] = None) -> Array:
    """Integer rollout counts ``N_P`` (int32) for one step's prompts, by the registered allocator ``method``.

    The same rule as ``get_allocator(method).counts(p_hat, budget, n_min=n_min, n_max=n_max, ...)``, by name:

      * ``sera`` (default): SERA as its authors released it. Prompts whose chance of a mixed group even at
        ``n_max`` is below 5% get **0 rollouts** (not sampled, no weight in the loss); the others share the
        budget so that MaxRL's factor ``s(p_i, N_i) = 1 - (1-p_i)^(N_i-1)`` is as equal as the integers allow
        (``core.released_allocation`` gives the active set and the waterline as well).
      * ``sera_all_active``: the exact discrete max–min of ``min_i s(p_i, N_i)`` over every prompt, each
        ``N_i >= n_min``; also on a :class:`BetaPosterior` (its expected factor) and under a token budget
        (``costs_P``: ``l_i`` tokens a rollout, ``sum_i l_i N_i <= budget``).
      * ``uniform``: MaxRL's ``B // P`` each. ``sera_sum``: the sum of the factors instead of their minimum.
        ``dynamo``, ``knapsack``: DynaMO's and Knapsack RL's counts. ``dapo``, ``pods``: uniform's counts (what they
        decide comes after sampling: ``get_allocator(name).keep_fn``).
      * Refused with what to use instead: ``dars_et`` and ``dars_hw`` (they read a pilot: ``pilot_allocate``),
        ``reinforce_ada`` (it samples in rounds), ``mopps`` and ``greso`` (they select prompts from a history).

    Args:
      p_hat: the step's success-rate estimates, shape (P,), in [0, 1]; or a :class:`BetaPosterior` for the
        rules that take one (``Allocator.accepts_posterior``; ``sera`` does not).
      budget: rollouts to spend, a static int in ``[P n_min, P n_max]`` (a static real token budget with
        ``costs_P``).
      n_min, n_max: static bounds on a sampled prompt's rollouts.
      method: a name in ``ALLOCATORS`` (above); an unknown one is a ValueError listing them.
      estimator: the advantage estimator; a rule not defined for it is a ValueError naming both (``sera`` and
        ``sera_sum`` need a power law: ``maxrl``, ``maxrl_no_baseline``).
      check: value checks (eagerly a ValueError; traced, inside ``checkify.checkify``: ``core.validation``).
      costs_P: tokens per rollout of each prompt, for the rules with a token-budget form (``sera_all_active``).

    Jittable: ``budget``, bounds, method and estimator are static; the name is resolved at trace time.
    """
    allocator = get_allocator(method)
    why_not = _why_not_by_name(allocator)
    if why_not:
        raise ValueError(why_not)
    return allocator.counts(p_hat, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=check,
                            costs_P=costs_P)
