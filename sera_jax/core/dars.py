"""DARS's second-phase rollouts (arXiv 2508.13755, docs/allocators.md §8), at a fixed budget.

DARS (Difficulty-Adaptive Rollout Sampling) samples a pilot of n rollouts per prompt, then gives each prompt
with pilot accuracy below 1/2 extra rollouts Δn: :func:`dars_extra_weights` is the published Δn, and
:func:`dars_counts` spends a fixed budget in proportion to it. (Which combined groups then train, and the P_kept
normalisation, are the trainer's.) Pure jax.numpy, jittable; all arithmetic on counts is exact integer arithmetic.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import validation

Array = jnp.ndarray

DARS_VARIANTS = ("et", "hw")  # Equal Treatment, Hardness-Weighted
_MAX_PILOT = 1024  # n (n - 1)^2 and friends stay below 2^31 in int32
_INT32_MAX = 2**31 - 1


def _check_variant(variant) -> str:
    if variant not in DARS_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known variants: {list(DARS_VARIANTS)} (Equal Treatment, "
                         "Hardness-Weighted)")
    return variant


class PilotFractions(NamedTuple):
    """A pilot's raw success fractions ``acc_P = K_P / n0`` with its size ``n0`` (a static int): what DARS's schedule
    reads, the published N being the pilot's size. Hand :func:`dars_counts` one of these when its lower bound
    ``n_pilot`` lies above the pilot (a caller's n_min > n0)."""

    acc_P: Array
    n0: int


def _check_acc(acc_P, n_pilot: int, check: bool) -> Array:
    acc_P = jnp.asarray(acc_P)
    if acc_P.ndim != 1 or acc_P.shape[0] < 1:
        raise ValueError(f"acc_P must have shape (P,) with P >= 1, got {acc_P.shape}")
    if not jnp.issubdtype(acc_P.dtype, jnp.floating):
        raise ValueError(f"acc_P must be a floating-point array (pilot success fractions), got dtype {acc_P.dtype}")
    validation.check_probabilities_any(acc_P, "acc_P", check)
    if check and not validation.is_traced(acc_P):
        successes = np.asarray(acc_P, np.float64) * n_pilot
        if np.any(np.abs(successes - np.round(successes)) > 1e-3):
            raise ValueError(f"acc_P must be raw pilot success fractions K / n0 (pilot size n0 = {n_pilot}); got "
                             f"values that are not multiples of 1/{n_pilot}")
    return acc_P


def _ceil_div(num, den):
    return -((-num) // den)


@functools.partial(jax.jit, static_argnames=("variant",))
def _extra_weights_impl(acc_P, n_pilot, cap, variant):
    # n_pilot and cap are traced int32 scalars: one compile per shape and variant, whatever the counts.
    n = n_pilot
    successes_P = jnp.round(acc_P * n).astype(jnp.int32)
    # acc = h / (2n) in half-successes h = 2K; the published acc = 0 -> 0.5 / n is h = 1.
    half_P = jnp.where(successes_P == 0, 1, 2 * successes_P)
    hard_P = half_P < n  # acc < 1/2; at acc >= 1/2 the published Δn is 0
    h = jnp.where(hard_P, half_P, 1)  # keeps the divisions below defined
    if variant == "et":  # n (1 - 2acc)^2 / (4 acc (1 - acc)) = n (n - h)^2 / (h (2n - h))
        num, den = n * (n - h) ** 2, h * (2 * n - h)
    else:  # n (1 - 2acc) / (2 acc) = n (n - h) / h
        num, den = n * (n - h), h
    return jnp.where(hard_P, jnp.minimum(_ceil_div(num, den), cap), 0).astype(jnp.int32)


def _check_pilot(n_pilot, name: str = "n_pilot") -> int:
    n_pilot = validation.check_int(n_pilot, name, minimum=1)
    if n_pilot > _MAX_PILOT:
        raise ValueError(f"{name} must be <= {_MAX_PILOT} (exact int32 arithmetic), got {n_pilot}")
    return n_pilot


def check_sizes(num_prompts: int, budget: int, *, n0: int, n_pilot: int, n_max: int) -> None:
    """The sizes :func:`dars_counts` refuses besides an infeasible budget or bounds out of order (ValueError naming
    the argument): a pilot ``n0`` above 1024 (the schedule's exact int32 arithmetic), ``n_max >= 2^31`` (int32
    counts), or ``B2 (n_max - n_pilot) >= 2^31`` with ``B2 = budget - P n_pilot`` (the shares' exact int32
    arithmetic). The config validation calls it (``rl.config``) to refuse them before a run."""
    _check_pilot(n0, "the pilot size n0")
    n_pilot, n_max = validation.check_int(n_pilot, "n_pilot"), validation.check_int(n_max, "n_max")
    budget = validation.check_int(budget, "budget")
    if n_max > _INT32_MAX:
        raise ValueError(f"n_max must be < 2^31 (int32 counts), got {n_max}")
    second_phase = budget - num_prompts * n_pilot
    if second_phase * max(n_max - n_pilot, 1) > _INT32_MAX:
        raise ValueError(f"budget {budget} is too large for exact int32 shares (B2 (n_max - n_pilot) = "
                         f"{second_phase} x {n_max - n_pilot} must stay below 2^31)")


def dars_extra_weights(acc_P: Array, n_pilot: int, *, variant: str = "et", n_max_total: int,
                       check: bool = True) -> Array:
    """DARS's published extra rollouts Δn per prompt (arXiv 2508.13755), from its pilot accuracy.

    Source: yangzhch6/DARS @ 9b21b714 ``verl/verl/trainer/ppo/ray_dars_trainer.py`` ``schedule_ET``,
    ``schedule_HW``; docs/allocators.md §8. With ``n = n_pilot`` pilot rollouts and ``acc`` their success
    fraction: acc = 0 is replaced by 0.5 / n; acc >= 0.5 gives Δn = 0; else, with ``S = 2 acc (1 - acc)``
    (``grpo_use_std`` False),

        Equal Treatment (ET):      Δn = ceil(n (0.5 / S - 1)),
        Hardness-Weighted (HW):    Δn = ceil(n (1 - 2 acc) / (2 acc)),

    capped at ``n_max_total - n`` (published N_max: 32 for ET, 64 for HW). Example (§8.5), n = 8, acc =
    [0, 1/8, 1/4, 3/8, 1/2]: ET (N_max 32) [24, 11, 3, 1, 0], HW (N_max 64) [56, 24, 8, 3, 0].

    ``acc_P`` is the raw pilot success fraction K / n (not a smoothed posterior mean; other values raise).

    The ceil's argument is an exact integer at some accuracies (HW at 1/8 and 1/4: 24 and 8), where floating-point
    noise above the integer would add a rollout; the doc recommends subtracting 1e-9 before the ceil. That guard
    works in float64 but not in float32 (24 - 1e-9 == 24 in float32, and float32 lands above the integer in 36
    (n, K) cases with n <= 128, e.g. ET at n = 12, K = 3: 4.0000005 -> 5 instead of 4). So we evaluate the same
    formulas exactly, in integers: with ``h = 2K`` half-successes (h = 1 for K = 0, i.e. acc = 0.5 / n),
    ``ET = ceil(n (n - h)^2 / (h (2n - h)))`` and ``HW = ceil(n (n - h) / h)`` (``0.5 / S - 1 = (1 - 2acc)^2 /
    (4 acc (1 - acc))``). This equals the float64 formula with the 1e-9 guard wherever that guard suffices (the
    tests check every n <= 64), i.e. the rule the guard is there to implement.

    Returns int32 ``delta_n_P >= 0``. Jittable (``n_pilot``, ``variant``, ``n_max_total`` static); ``check``
    validates concrete inputs (traced ones get a run-time probability check, and are rounded to K / n).
    """
    variant = _check_variant(variant)
    n_pilot = _check_pilot(n_pilot)
    n_max_total = validation.check_int(n_max_total, "n_max_total")
    if n_max_total < n_pilot:
        raise ValueError(f"n_max_total ({n_max_total}) must be >= n_pilot ({n_pilot})")
    acc_P = _check_acc(acc_P, n_pilot, check)
    return _extra_weights_impl(acc_P, jnp.int32(n_pilot), jnp.int32(n_max_total - n_pilot), variant=variant)


@jax.jit
def _proportional_fill(weights_P, amount, cap):
    """``amount`` extra rollouts in proportion to integer ``weights_P``, each prompt's extra capped at ``cap``.

    A pass over the open prompts E (extra < cap, weight > 0): ``floor(left w_i / sum_E w)`` each, +1 for the
    ``left - sum floor`` largest remainders (ties by index), each addition capped at what the prompt has left;
    repeated on what the caps leave. In exact integers (``left w_i`` divided with remainder by ``sum_E w``). With
    no weight left below its cap (every Δn = 0, or every weighted prompt full), the open prompts get equal
    weights: round-robin by index. A pass that caps nothing spends everything, so at most P + 1 passes.
    """
    num_prompts = weights_P.shape[0]
    index_P = jnp.arange(num_prompts, dtype=jnp.int32)

    def one_pass(state):
        extra_P, left, passes = state
        open_P = extra_P < cap
        weighted_P = open_P & (weights_P > 0)
        w_P = jnp.where(jnp.any(weighted_P), jnp.where(weighted_P, weights_P, 0), open_P.astype(jnp.int32))
        total = jnp.maximum(jnp.sum(w_P), 1)
        share_P = left * w_P
        floor_P = share_P // total
        remainder_P = jnp.where(w_P > 0, share_P % total, -1)
        # +1 to the `bonus` largest remainders, ties by index (stable sort of the negated remainders).
        bonus = left - jnp.sum(floor_P)
        order_P = jnp.argsort(-remainder_P, stable=True)
        rank_P = jnp.zeros(num_prompts, jnp.int32).at[order_P].set(index_P)
        add_P = jnp.where(w_P > 0, jnp.minimum(floor_P + (rank_P < bonus), cap - extra_P), 0)
        return extra_P + add_P, left - jnp.sum(add_P), passes + 1

    start = (jnp.zeros(num_prompts, jnp.int32), jnp.asarray(amount, jnp.int32), jnp.int32(0))
    extra_P, _, _ = jax.lax.while_loop(lambda s: (s[1] > 0) & (s[2] <= num_prompts), one_pass, start)
    return extra_P


def dars_counts(acc_P: Union[Array, PilotFractions], budget: int, *, n_pilot: int, n_max: int, variant: str = "et",
                check: bool = True) -> Array:
    """DARS's rollout counts per prompt at a fixed budget (pilot included): docs/allocators.md §8.4.

    Published (yangzhch6/DARS @ 9b21b714 ``ray_dars_trainer.py`` ``fit``): phase 1 samples ``n_pilot`` rollouts per
    prompt; phase 2 samples each prompt's Δn (:func:`dars_extra_weights`, N_max = ``n_max``) more, so the total
    spent varies with the accuracies.

    Fixed-budget adaptation (the doc's): the pilot ``P n_pilot`` is inside the budget, and ``B2 = budget - P
    n_pilot`` is given in proportion to the published Δn as weights: floor, +1 to the largest remainders (ties by
    index), each prompt's extra capped at ``n_max - n_pilot``, and what the caps leave water-filled over the
    uncapped prompts by the same rule until spent (:func:`_proportional_fill`, exact integers). If
    ``sum Δn = 0`` (every acc >= 0.5), B2 goes round-robin by index; likewise whatever B2 is left once every
    prompt with Δn > 0 is full (our choice: the doc does not say). This keeps the ET / HW shape. Example (§8.5):
    P = 4, B = 64, n = 8, ET weights [24, 11, 3, 0] give B2 = 32 as extras [20, 9, 3, 0] (counts [28, 17, 11, 8]).
    The published N_max (32 for ET, 64 for HW) is replaced by ``n_max``.

    A lower bound above the pilot (a caller's n_min > n0; our bound, not DARS's): pass
    ``PilotFractions(K / n0, n0)`` and ``n_pilot`` = the bound. The schedule stays the published one at the pilot's
    size, Δn at N = n0 with N_max = ``n_max`` (the published N is the number of pilot rollouts, the denominator of
    acc), and the bound only lifts the counts: every prompt first gets ``n_pilot``, then ``budget - P n_pilot`` goes
    in proportion to those Δn as above, capped at ``n_max - n_pilot``. Example: K = [0, 1, 4, 4], n0 = 4, bound
    8, n_max 32, B = 59: ET Δn [6, 2, 0, 0] share 27 as [20, 7], counts [28, 15, 8, 8] (reading the schedule at
    N = 8 instead would give Δn [24, 3, 0, 0] and [32, 11, 8, 8], and refuses acc that are not multiples of 1/8).

    Returns int32 ``counts_P`` with ``sum = budget`` and ``n_pilot <= N_i <= n_max``; prompt i gets
    ``N_i - n0`` second-phase rollouts. ``budget`` outside ``[P n_pilot, P n_max]`` raises ValueError, and so do the
    sizes of :func:`check_sizes`. Jittable with ``budget``, ``n_pilot``, ``n_max``, ``variant`` (and n0) static.
    """
    variant = _check_variant(variant)
    if isinstance(acc_P, PilotFractions):
        acc_P, n0 = acc_P.acc_P, _check_pilot(acc_P.n0, "the pilot size n0")
    else:
        n0 = _check_pilot(n_pilot)
    n_pilot = validation.check_int(n_pilot, "n_pilot")
    if n_pilot < n0:
        raise ValueError(f"n_pilot ({n_pilot}) must be >= the pilot size n0 ({n0}): the pilot is spent")
    n_max = validation.check_int(n_max, "n_max")
    if n_max < n_pilot:
        raise ValueError(f"n_max ({n_max}) must be >= n_pilot ({n_pilot})")
    acc_P = _check_acc(acc_P, n0, check)
    num_prompts = acc_P.shape[0]
    budget = validation.check_int(budget, "budget")
    if budget < num_prompts * n_pilot or budget > num_prompts * n_max:
        raise ValueError(f"infeasible budget {budget}: with {num_prompts} prompts, n_pilot = {n_pilot} and "
                         f"n_max = {n_max} it must lie in [{num_prompts * n_pilot}, {num_prompts * n_max}]")
    check_sizes(num_prompts, budget, n0=n0, n_pilot=n_pilot, n_max=n_max)
    # Δn at the pilot's N = n0 (capped at N_max - N, as published); the shares above the bound n_pilot.
    weights_P = _extra_weights_impl(acc_P, jnp.int32(n0), jnp.int32(n_max - n0), variant=variant)
    second_phase, cap = budget - num_prompts * n_pilot, n_max - n_pilot
    return (n_pilot + _proportional_fill(weights_P, jnp.int32(second_phase), jnp.int32(cap))).astype(jnp.int32)
