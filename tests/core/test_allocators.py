"""The allocator registry: lookup, what each entry needs, and each rule against brute force."""

import itertools
import math
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from sera_jax.core import BetaPosterior, allocate, get_estimator, uniform_counts
from sera_jax.core import allocators
from sera_jax.core.allocation import all_active_counts

P, N_MIN, N_MAX = 4, 2, 6
# P n_min = 8 .. P n_max = 24: few static budgets, few compiles. Derandomized hypothesis draws the first one in
# about half of the examples, so it is not the trivial P n_min.
BUDGETS = (17, 24, 11, 8)
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _power(p: float, n: int, b: int = 1) -> float:
    """s(p, n) = 1 - (1-p)^(n-b) in float64: independent of the code under test."""
    return 1.0 - (1.0 - p) ** (n - b)


def _posterior_power(a: float, b: float, n: int, offset: int = 1) -> float:
    """E[1 - (1-p)^(n-offset)] for p ~ Beta(a, b): 1 - B(a, b + n - offset) / B(a, b), with math.lgamma."""
    def log_beta(x, y):
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    return 1.0 - math.exp(log_beta(a, b + n - offset) - log_beta(a, b))


def _brute_force_max_sum(factor, num_prompts: int, budget: int) -> float:
    best = -np.inf
    for counts in itertools.product(range(N_MIN, N_MAX + 1), repeat=num_prompts):
        if sum(counts) == budget:
            best = max(best, sum(factor(i, c) for i, c in enumerate(counts)))
    return best


def test_lookup_names_the_known_methods_and_refuses_duplicates():
    assert {"uniform", "sera", "sera_sum", "dynamo", "knapsack"} <= set(allocators.ALLOCATORS)
    with pytest.raises(ValueError, match=r"unknown allocation method 'ppo'; known methods: \[.*'sera'.*\]"):
        allocators.get_allocator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        allocators.register(allocators.get_allocator("sera"))


def test_what_each_entry_needs():
    assert not allocators.get_allocator("uniform").needs_estimate
    for name in ("sera", "sera_sum", "dynamo", "knapsack"):
        assert allocators.get_allocator(name).needs_estimate, name
    for name in ("dynamo", "knapsack"):  # defined whatever the estimator (they do not read its factor)
        for est in ("maxrl", "grpo", "reinforce"):
            allocators.get_allocator(name).check_estimator(get_estimator(est))
    with pytest.raises(ValueError, match="does not depend on N"):
        allocators.get_allocator("sera_all_active").check_estimator(get_estimator("reinforce"))
    with pytest.raises(ValueError, match="method 'sera' needs a power-law factor"):
        allocators.get_allocator("sera").check_estimator(get_estimator("grpo"))
    with pytest.raises(ValueError, match="power-law factor"):
        allocators.get_allocator("sera_sum").check_estimator(get_estimator("grpo"))


def test_uniform_and_sera_all_active_are_the_core_allocations():
    p = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    uniform = allocators.get_allocator("uniform").counts(None, 17, n_min=2, n_max=6, num_prompts=4)
    np.testing.assert_array_equal(uniform, uniform_counts(4, 17))
    np.testing.assert_array_equal(allocators.get_allocator("sera_all_active").counts(p, 17, n_min=2, n_max=6),
                                  all_active_counts(p, 17, n_min=2, n_max=6))
    with pytest.raises(ValueError, match="needs the step's success-rate estimates"):
        allocators.get_allocator("sera").counts(None, 17, n_min=2, n_max=6, num_prompts=4)


# Interior p on a grid of sigmoids (where the greedy's choices are decided by the gains), and the edges 0 and 1.
p_vectors = st.lists(st.integers(-30, 30).map(lambda z: 1.0 / (1.0 + np.exp(-0.2 * z - 0.013)))
                     | st.sampled_from([0.0, 1.0]), min_size=P, max_size=P).map(lambda v: np.array(v, np.float32))


@SETTINGS
@given(p=p_vectors, budget=st.sampled_from(BUDGETS))
def test_sera_sum_attains_the_maximum_sum(p, budget):
    counts = np.asarray(allocators.get_allocator("sera_sum").counts(p, budget, n_min=N_MIN, n_max=N_MAX))
    assert counts.sum() == budget and counts.min() >= N_MIN and counts.max() <= N_MAX
    got = sum(_power(float(p[i]), int(c)) for i, c in enumerate(counts))
    np.testing.assert_allclose(got, _brute_force_max_sum(lambda i, n: _power(float(p[i]), n), P, budget),
                               rtol=1e-5, atol=1e-6)


@SETTINGS
@given(alpha=st.lists(st.floats(0.2, 8.0), min_size=P, max_size=P),
       beta=st.lists(st.floats(0.2, 8.0), min_size=P, max_size=P), budget=st.sampled_from(BUDGETS))
def test_sera_sum_on_a_posterior_attains_the_maximum_expected_sum(alpha, beta, budget):
    post = BetaPosterior(np.array(alpha, np.float32), np.array(beta, np.float32))
    counts = np.asarray(allocators.get_allocator("sera_sum").counts(post, budget, n_min=N_MIN, n_max=N_MAX))
    def factor(i, n):
        return _posterior_power(alpha[i], beta[i], n)
    got = sum(factor(i, int(c)) for i, c in enumerate(counts))
    np.testing.assert_allclose(got, _brute_force_max_sum(factor, P, budget), rtol=1e-4, atol=1e-5)


def test_sera_sum_differs_from_the_max_min_by_hand():
    """p = (0.01, 0.5), 2 extra rollouts: the max–min feeds the hard prompt (its factor is the minimum), the sum
    feeds the one with the larger gain: s(0.5, 2 -> 3) gains 0.25 > s(0.01, 2 -> 3) gains 0.0099."""
    p = np.array([0.01, 0.5], np.float32)
    np.testing.assert_array_equal(allocators.get_allocator("sera_all_active").counts(p, 6, n_min=2, n_max=4), [4, 2])
    np.testing.assert_array_equal(allocators.get_allocator("sera_sum").counts(p, 6, n_min=2, n_max=4), [2, 4])


def _assert_counts(counts, budget, n_min, n_max):
    counts = np.asarray(counts)
    assert counts.dtype == np.int32
    assert counts.sum() == budget and counts.min() >= n_min and counts.max() <= n_max, counts
    return counts


# ---------------------------------------------------------------------------------------------------------
# DynaMO (docs/allocators.md §2)

DYNAMO = allocators.get_allocator("dynamo")
DYN_P, DYN_N_MIN, DYN_N_MAX = 5, 2, 8
DYN_BUDGETS = (31, 22, 37, 13)  # within P n_min = 10 .. P n_max = 40 (the first one is drawn most)
TIE_TOL = 1e-4  # decisions of the float64 reference this close to a tie may go either way in float32


def _dynamo_reference(p, budget, n_min, n_max):
    """get_rollout_n_per_prompt's water-filling passes (DynaMO-RL @ 63e5ec9) in plain float64 loops, with the
    priority of update_rank; ties among fractional parts by index. Also says whether any decision was within
    TIE_TOL of a tie between prompts of different priority, or of an integer share."""
    w = [0.01 if x >= 0.85 else max(4.0 * x * (1.0 - x), 0.01) for x in map(float, p)]
    counts = [n_min] * len(p)
    left = budget - len(p) * n_min
    fragile = False
    while left > 0:
        eligible = [i for i in range(len(p)) if counts[i] < n_max and w[i] > 1e-8]
        total = sum(w[i] for i in eligible)
        ideal = {i: left * (w[i] / total) for i in eligible}
        add = {i: math.floor(ideal[i]) for i in eligible}
        frac = {i: ideal[i] - add[i] for i in eligible}
        for i in eligible:
            fragile |= min(frac[i], 1.0 - frac[i]) < TIE_TOL
            for j in eligible:
                gap = abs(frac[i] - frac[j])
                fragile |= w[i] != w[j] and min(gap, 1.0 - gap) < TIE_TOL
        remainder = left - sum(add.values())
        for i in sorted(eligible, key=lambda i: (-frac[i], i))[:remainder]:
            add[i] += 1
        for i in eligible:
            step = min(add[i], n_max - counts[i])
            counts[i] += step
            left -= step
    return counts, fragile


def test_dynamo_by_hand():
    """docs/allocators.md §2.5: acc = [0.5, 0.25, 0.9, 0.1] gives priorities [1, 0.75, 0.01, 0.36]; R = 24 shares
    [11.32, 8.49, 0.11, 4.08] -> [11, 8, 0, 4] + 1 to prompt 1; with n_max = 12 a second pass over {2, 3}."""
    acc = np.array([0.5, 0.25, 0.9, 0.1], np.float32)
    np.testing.assert_array_equal(DYNAMO.counts(acc, 40, n_min=4, n_max=24), [15, 13, 4, 8])
    np.testing.assert_array_equal(DYNAMO.counts(acc, 40, n_min=4, n_max=12), [12, 12, 4, 12])
    # A posterior is read through its mean (these means are exactly acc in float32).
    post = BetaPosterior(10 * acc, 10 * (1 - acc))
    np.testing.assert_array_equal(DYNAMO.counts(post, 40, n_min=4, n_max=24), [15, 13, 4, 8])
    # Mastered (p >= 0.85) and hopeless (p = 0) prompts share the floor priority 0.01: an even split.
    np.testing.assert_array_equal(DYNAMO.counts(np.array([0.85, 1.0, 0.0, 0.99], np.float32), 42, n_min=4,
                                                n_max=24), [11, 11, 10, 10])
    # Just below the threshold 4 p (1-p) counts: p = 0.84 has priority 0.5376, far above 0.85's 0.01.
    np.testing.assert_array_equal(DYNAMO.counts(np.array([0.84, 0.85], np.float32), 20, n_min=2, n_max=24),
                                  [18, 2])


@SETTINGS
@given(p=st.lists(st.integers(0, 1000).map(lambda k: k / 1000) | st.sampled_from([0.0, 0.85, 0.9, 1.0]),
                  min_size=DYN_P, max_size=DYN_P).map(lambda v: np.array(v, np.float32)),
       budget=st.sampled_from(DYN_BUDGETS))
def test_dynamo_matches_the_reference_passes(p, budget):
    want, fragile = _dynamo_reference(p, budget, DYN_N_MIN, DYN_N_MAX)
    assume(not fragile)
    counts = _assert_counts(DYNAMO.counts(p, budget, n_min=DYN_N_MIN, n_max=DYN_N_MAX), budget, DYN_N_MIN,
                            DYN_N_MAX)
    np.testing.assert_array_equal(counts, want)


# ---------------------------------------------------------------------------------------------------------
# Knapsack RL (docs/allocators.md §3)

KNAPSACK = allocators.get_allocator("knapsack")


def _knapsack_value(p: float, n: int) -> float:
    """V(p, N) = (1 - p^N - (1-p)^N) p (1-p)^2 in float64."""
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def _best_value(p_list, budget, lower, n_max):
    """max sum_i V(p_i, N_i) over integer N with sum = budget and lower_i <= N_i <= n_max (enumeration)."""
    best = -np.inf
    for counts in itertools.product(*[range(lo, n_max + 1) for lo in lower]):
        if sum(counts) == budget:
            best = max(best, sum(_knapsack_value(q, c) for q, c in zip(p_list, counts)))
    return best


def _knapsack_reference(p, budget, n_min, n_max):
    """The fixed-budget rule of docs/allocators.md §3 in plain loops, with the knapsack by enumeration.

    Returns (counts of the non-effective prompts, the effective prompts' total, their best value, fragile): the
    effective prompts' counts themselves are any maximiser (ties), so only their value is compared."""
    p = [float(x) for x in p]
    num = len(p)
    counts = [n_min] * num
    effective = [i for i in range(num) if 0.0 < p[i] < 1.0]
    zero = [i for i in range(num) if p[i] == 0.0]
    fragile = False

    def round_robin(amount, prompts):  # one at a time in index order, skipping those at n_max
        while amount > 0 and any(counts[i] < n_max for i in prompts):
            for i in prompts:
                if amount > 0 and counts[i] < n_max:
                    counts[i] += 1
                    amount -= 1
        return amount

    left = budget - num * n_min
    if not effective:
        targets = zero if zero else list(range(num))
        excess = left
    else:
        costs = [math.log(1 - 0.9) / math.log(max(p[i], 1 - p[i])) for i in effective]
        fragile |= any(abs(c - round(c)) < TIE_TOL and c < n_max + 1 for c in costs)
        capacity = sum(math.floor(min(n_max, c)) for c in costs)
        others = [i for i in range(num) if i not in effective]
        excess = left - capacity if capacity < left and others else 0
        targets = zero if zero else others
    excess_total = excess if effective else 0
    excess = round_robin(excess, targets)
    round_robin(excess, [i for i in range(num) if i not in targets])
    # The knapsack: what is left, to the effective prompts as far as they can take it (V's gains are > 0).
    rest = budget - sum(counts)
    room = sum(n_max - counts[i] for i in effective)
    knapsack_total = sum(counts[i] for i in effective) + min(rest, room)
    best = _best_value([p[i] for i in effective], knapsack_total, [counts[i] for i in effective], n_max)
    # What they cannot take: to the others by (count, index).
    for _ in range(rest - min(rest, room)):
        i = min((i for i in range(num) if i not in effective and counts[i] < n_max), key=lambda i: (counts[i], i))
        counts[i] += 1
    non_effective = {i: counts[i] for i in range(num) if i not in effective}
    event("no effective prompt" if not effective else "fallback" if excess_total else "no fallback")
    return non_effective, knapsack_total, best, fragile


def test_knapsack_by_hand():
    """docs/allocators.md §3.5 and the p = 0 / p = 1 rules, P = 4, bounds [2, 8] (few budgets, few compiles)."""
    def counts(p, budget=16):
        return np.asarray(KNAPSACK.counts(np.array(p, np.float32), budget, n_min=2, n_max=8))
    # Costs floor(3.32) = 3 and floor(min(8, 8.004)) = 8: C = 11 >= R = 8; the 8 largest gains.
    np.testing.assert_array_equal(counts([0.0, 0.5, 0.25, 1.0]), [2, 5, 7, 2])
    # Fallback: C = 3 + 3 = 6 < 8, the excess 2 to the p = 0 prompt, 6 to the knapsack.
    np.testing.assert_array_equal(counts([0.0, 0.5, 0.5, 1.0]), [4, 5, 5, 2])
    # Fallback without a p = 0 prompt: the excess evenly to the other non-effective ones (p = 1).
    np.testing.assert_array_equal(counts([1.0, 0.5, 0.5, 1.0]), [3, 5, 5, 3])
    # C counts min(n_max, c_i): floor(min(8, 21.85)) = 8 < R = 12 for p = 0.1, so the p = 0 prompt gets the excess 4;
    # the knapsack's 8 overflow p = 0.1's room 6 and the last 2 go to the lowest counts.
    np.testing.assert_array_equal(counts([0.0, 0.1, 1.0, 1.0], 20), [6, 8, 3, 3])
    # The fallback's share capped at n_max: the excess 7 gives the p = 0 prompt 6, the last one goes round-robin
    # to the others by index (the p = 1 prompt 1); the knapsack's C = 3 then go to p = 0.5.
    np.testing.assert_array_equal(counts([0.0, 1.0, 0.5, 1.0], 18), [8, 3, 5, 2])
    # Every prompt effective (C = 12 < R = 16): no candidate for the fallback, the knapsack spends all of R.
    np.testing.assert_array_equal(counts([0.5, 0.5, 0.5, 0.5], 24), [6, 6, 6, 6])
    # No effective prompt: R evenly to the p = 0 prompts, capped at n_max, the rest to the others.
    np.testing.assert_array_equal(counts([0.0, 1.0, 0.0, 1.0]), [6, 2, 6, 2])
    np.testing.assert_array_equal(counts([0.0, 1.0, 0.0, 1.0], 24), [8, 4, 8, 4])
    np.testing.assert_array_equal(counts([1.0, 1.0, 1.0, 1.0], 18), uniform_counts(4, 18))  # [5, 5, 4, 4]
    # C = floor(min(8, 8.004)) = 8 < R = 12: the excess 4 to the p = 1 prompts, [4, 3, 3]; the knapsack's 8
    # overflow the effective prompt's room 6, and the last 2 go by (count, index), not by index: [4, 4, 4].
    np.testing.assert_array_equal(counts([0.25, 1.0, 1.0, 1.0], 20), [8, 4, 4, 4])


def test_knapsack_does_not_reproduce_the_dp_quirk():
    """p = (0.5, 0.1) at n_min = 8, one extra rollout. Gains V(p, 9) - V(p, 8) = (p^8 (1-p) + p (1-p)^8) p (1-p)^2:
    0.00049 for p = 0.5, 0.00349 for p = 0.1, so the maximiser of sum_i V feeds p = 0.1. The code's DP scores
    extra = 0 as 0 and so compares V(0.5, 9) = 0.1248 with V(0.1, 9) = 0.0497: it would feed p = 0.5."""
    assert _knapsack_value(0.5, 9) - _knapsack_value(0.5, 8) < _knapsack_value(0.1, 9) - _knapsack_value(0.1, 8)
    assert _knapsack_value(0.5, 9) > _knapsack_value(0.1, 9)
    np.testing.assert_array_equal(KNAPSACK.counts(np.array([0.5, 0.1], np.float32), 17, n_min=8, n_max=12), [8, 9])


# Interior p on a grid of sigmoids, and the edges 0 and 1 (then the p = 0 / p = 1 rules apply).
interior_p = st.integers(-30, 30).map(lambda z: 1.0 / (1.0 + np.exp(-0.2 * z - 0.013)))
knapsack_p = st.lists(interior_p | st.sampled_from([0.0, 1.0]), min_size=P, max_size=P).map(
    lambda v: np.array(v, np.float32))


@SETTINGS
@given(p=st.lists(interior_p, min_size=P, max_size=P).map(lambda v: np.array(v, np.float32)),
       budget=st.sampled_from(BUDGETS))
def test_knapsack_attains_the_maximum_value(p, budget):
    """Every prompt effective: the counts maximise sum_i V(p_i, N_i) over all allocations (enumeration)."""
    counts = _assert_counts(KNAPSACK.counts(p, budget, n_min=N_MIN, n_max=N_MAX), budget, N_MIN, N_MAX)
    got = sum(_knapsack_value(float(q), int(c)) for q, c in zip(p, counts))
    np.testing.assert_allclose(got, _best_value([float(q) for q in p], budget, [N_MIN] * P, N_MAX),
                               rtol=1e-6, atol=1e-8)


@SETTINGS
@given(p=knapsack_p, budget=st.sampled_from(BUDGETS))
def test_knapsack_matches_the_fixed_budget_rule(p, budget):
    non_effective, knapsack_total, best, fragile = _knapsack_reference(p, budget, N_MIN, N_MAX)
    assume(not fragile)
    counts = _assert_counts(KNAPSACK.counts(p, budget, n_min=N_MIN, n_max=N_MAX), budget, N_MIN, N_MAX)
    for i, c in non_effective.items():
        assert counts[i] == c, (i, counts, non_effective)
    effective = [i for i in range(P) if i not in non_effective]
    assert sum(counts[i] for i in effective) == knapsack_total
    got = sum(_knapsack_value(float(p[i]), int(counts[i])) for i in effective)
    np.testing.assert_allclose(got, best if effective else 0.0, rtol=1e-6, atol=1e-8)


def _published_knapsack(p, budget, n, max_n, *, dp_scores_zero_extra=True):
    """Knapsack RL's rule as published (liziniu/KnapsackRL exploration_utils.py: sampling_budget_by_knapsack, then
    solve_by_dp), restated for prompts that are all valid with min_n = negative_n = positive_n = n. V in exact
    rationals, each cost ln(1 - alpha) / ln(max(p, 1 - p)) in float64 with log1p (the n at which a group is all
    one outcome with probability <= 1 - alpha: finite however small p is), the DP's maximiser by enumeration;
    shares uncapped, as published. ``dp_scores_zero_extra``: the DP scores a prompt left at n as 0 (its code);
    False scores it V(p, n) (our documented adaptation: the stated objective).

    Returns the counts and whether a cost lies within 1e-6 of an integer below max_n + 1 (its floor is fragile), or
    None where the published rule divides by zero (every prompt effective, with a fallback) or gives every prompt
    the default n (no effective prompt, no p = 0 prompt): cases our adaptations replace."""
    q = [Fraction(float(x)) for x in p]
    num = len(q)
    counts = [n] * num
    effective = [i for i in range(num) if 0 < q[i] < 1]
    zero = [i for i in range(num) if q[i] == 0]
    rest = budget - n * num

    def spread(amount, prompts):  # evenly, one more each to the first `amount % len` by index
        for j, i in enumerate(prompts):
            counts[i] += amount // len(prompts) + (j < amount % len(prompts))

    if not effective:
        if not zero:
            return None
        spread(rest, zero)
        return counts, False
    costs = [math.log(1 - 0.9) / math.log1p(-min(float(p[i]), 1 - float(p[i]))) for i in effective]
    fragile = any(abs(c - round(c)) < 1e-6 and c < max_n + 1 for c in costs)
    capacity = sum(math.floor(min(max_n, c)) for c in costs)
    if capacity < rest:
        others = zero or [i for i in range(num) if i not in effective]
        if not others:
            return None
        spread(rest - capacity, others)
        rest = capacity
    top = max_n - n  # the DP's most extra rollouts per prompt

    def score(x, k):
        big_n = n + k
        value = (1 - x ** big_n - (1 - x) ** big_n) * x * (1 - x) ** 2
        return Fraction(0) if k == 0 and dp_scores_zero_extra else value

    tables = [[score(q[i], k) for k in range(top + 1)] for i in effective]
    usable = min(rest, top * len(effective))  # the DP's largest budget it can fill exactly
    best = max((ks for ks in itertools.product(range(top + 1), repeat=len(effective)) if sum(ks) == usable),
               key=lambda ks: sum(t[k] for t, k in zip(tables, ks)))
    for i, k in zip(effective, best):
        counts[i] += k
    spread(rest - usable, effective)  # what the DP could not place: evenly over the effective prompts, uncapped
    return counts, fragile


def test_knapsack_with_a_tiny_p_matches_the_published_rule():
    """p = [0.5, 1e-9, 0, 1], B = 40, bounds [2, 16]. Costs: ln 0.1 / ln 0.5 = 3.32 -> 3, and for p = 1e-9
    ln 0.1 / ln(1 - 1e-9) = 2.3e9 -> min(16, .) = 16; C = 19 < R = 32, so the p = 0 prompt gets the excess 13
    (15 in all) and the knapsack spends 19: p = 0.5 takes its 14 (its gains dwarf p = 1e-9's ~1e-18), p = 1e-9
    the last 5. In float32 1 - 1e-9 == 1, so ln(max(p, 1 - p)) = 0 made the cost -inf (we gave [16, 16, 4, 4])."""
    p = np.array([0.5, 1e-9, 0.0, 1.0], np.float32)
    for quirk in (True, False):  # every allocation of 19 gives each effective prompt >= 5: the quirk is moot
        published, fragile = _published_knapsack(p, 40, 2, 16, dp_scores_zero_extra=quirk)
        assert published == [16, 7, 15, 2] and not fragile
    np.testing.assert_array_equal(KNAPSACK.counts(p, 40, n_min=2, n_max=16), [16, 7, 15, 2])


def test_knapsack_with_tiny_p_matches_the_published_rule_on_generated_cases():
    """P = 4, bounds [2, 16], each case with a p below 2^-25 (where 1 - p rounds to 1 in float32), compared where
    none of our adaptations applies: the published rule is defined, its shares stay within n_max, and the DP's
    quirk gives the stated objective's maximiser."""
    rng = np.random.default_rng(7)
    compared = 0
    for trial in range(40):
        kinds = ["tiny"] + list(rng.choice(["tiny", "zero", "one", "interior"], size=3))
        values = {"tiny": lambda: 10.0 ** rng.uniform(-12, -7.6), "zero": lambda: 0.0, "one": lambda: 1.0,
                  "interior": lambda: rng.uniform(0.05, 0.95)}
        p = np.array([values[k]() for k in rng.permutation(kinds)], np.float32)
        interior = p[(p > 0) & (p < 1)]
        if len(set(interior.tolist())) < len(interior):
            continue  # equal p: the maximiser is not unique
        budget = int(rng.choice([28, 40, 52]))
        published, adapted = (_published_knapsack(p, budget, 2, 16, dp_scores_zero_extra=quirk)
                              for quirk in (True, False))
        if published is None or published[1] or published[0] != adapted[0] or max(published[0]) > 16:
            continue
        counts = _assert_counts(KNAPSACK.counts(p, budget, n_min=2, n_max=16), budget, 2, 16)
        np.testing.assert_array_equal(counts, published[0], err_msg=f"trial {trial}: p={p.tolist()}, B={budget}")
        compared += 1
    assert compared >= 15, compared


def test_knapsack_cost_of_a_tiny_p_is_finite():
    """c = ln(1 - alpha) / ln(max(p, 1 - p)) by hand in float64: 3.3219 for p = 0.5 and 0.5 ... p = 1e-9 gives
    ln 0.1 / (-1e-9) = 2.3026e9; p = 1 - 2^-24 (float32's largest below 1) gives ln 0.1 / ln(1 - 2^-24)."""
    p = np.array([0.5, 1e-9, 1e-30, 1 - 2.0 ** -24, 0.9], np.float32)
    want = [math.log(0.1) / math.log1p(-min(float(x), 1 - float(x))) for x in p]
    np.testing.assert_allclose(allocators.knapsack_costs(p), want, rtol=1e-5)


def test_knapsack_on_a_posterior_uses_its_mean():
    post = BetaPosterior(np.array([1.0, 2.0, 3.0, 0.5], np.float32), np.array([1.0, 6.0, 1.0, 0.5], np.float32))
    np.testing.assert_array_equal(KNAPSACK.counts(post, 17, n_min=N_MIN, n_max=N_MAX),
                                  KNAPSACK.counts(post.mean, 17, n_min=N_MIN, n_max=N_MAX))


# ---------------------------------------------------------------------------------------------------------
# Both: jittable with a traced estimate, and the shared validation.


@pytest.mark.parametrize("name", ["dynamo", "knapsack"])
def test_counts_under_jit_and_bad_input(name):
    allocator = allocators.get_allocator(name)
    p = np.array([0.0, 0.3, 0.6, 0.9], np.float32)
    jitted = jax.jit(lambda q: allocator.counts(q, 17, n_min=N_MIN, n_max=N_MAX, check=False))
    np.testing.assert_array_equal(jitted(p), allocator.counts(p, 17, n_min=N_MIN, n_max=N_MAX))
    with pytest.raises(ValueError, match="infeasible budget 25"):
        allocator.counts(p, 25, n_min=N_MIN, n_max=N_MAX)
    with pytest.raises(ValueError, match="p_hat must be probabilities"):
        allocator.counts(np.array([0.5, 1.5, 0.5, 0.5], np.float32), 17, n_min=N_MIN, n_max=N_MAX)


# ---------------------------------------------------------------------------------------------------------
# sera_jax.allocate: one entry point that speaks the registry's names.

# Callable by name: counts chosen before sampling from the step's estimates alone. Refused: the rest, each with why.
BY_NAME = ("uniform", "sera", "sera_all_active", "sera_sum", "dynamo", "knapsack", "dapo", "pods")
REFUSED = {
    "reinforce_ada": r"method 'reinforce_ada' samples in rounds.*no counts before sampling",
    "mopps": r"method 'mopps' selects the step's prompts from a history of earlier steps.*select_fn",
    "greso": r"method 'greso' selects the step's prompts from a history of earlier steps.*select_fn",
    "dars_et": r"method 'dars_et' allocates from a pilot's success fractions.*pilot_allocate\(",
    "dars_hw": r"method 'dars_hw' allocates from a pilot's success fractions.*pilot_allocate\(",
}
ISSUE_P = np.array([0.001, 0.5, 0.999, 0.5], np.float32)


def test_allocate_and_the_registry_mean_the_same_sera():
    """The issue's case: allocate gave the all-active max–min [16, 7, 2, 7] and get_allocator('sera') the released
    rule [0, 16, 0, 16]; now ``sera`` is the released rule in both and the max–min is ``sera_all_active``."""
    import sera_jax
    released = allocators.get_allocator("sera").counts(ISSUE_P, 32, n_min=2, n_max=16)
    np.testing.assert_array_equal(released, [0, 16, 0, 16])
    np.testing.assert_array_equal(sera_jax.allocate(ISSUE_P, 32, n_min=2, n_max=16), released)
    np.testing.assert_array_equal(sera_jax.allocate(ISSUE_P, 32, n_min=2, n_max=16, method="sera_all_active"),
                                  [16, 7, 2, 7])


def test_every_registered_allocator_is_callable_by_name_or_says_what_to_use_instead():
    assert set(BY_NAME) | set(REFUSED) == set(allocators.ALLOCATORS)  # a new entry must be put in one of them
    p = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    for name in BY_NAME:
        want = allocators.get_allocator(name).counts(p, 17, n_min=N_MIN, n_max=N_MAX)
        got = np.asarray(allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method=name))
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert got.sum() == 17 and got.dtype == np.int32, name
    for name in ("dapo", "pods"):  # their counts are uniform's; what they decide comes after sampling (keep_fn)
        np.testing.assert_array_equal(allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method=name), uniform_counts(4, 17))
    for name, why in REFUSED.items():
        with pytest.raises(ValueError, match=why):
            allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method=name)
    with pytest.raises(ValueError, match=r"unknown allocation method 'serra'; known methods: \[.*'sera_all_active'"):
        allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method="serra")


def test_allocate_under_jit_resolves_the_name_at_trace_time():
    p = np.array([0.002, 0.3, 0.6, 0.9], np.float32)
    for name in ("sera", "sera_all_active", "dynamo"):
        jitted = jax.jit(lambda q: allocate(q, 17, n_min=N_MIN, n_max=N_MAX, method=name, check=False))
        np.testing.assert_array_equal(jitted(p), allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method=name))


def test_a_posterior_and_a_token_budget_go_to_the_rules_that_have_them():
    """sera_all_active allocates on a Beta posterior and under a token budget (the costed greedy, written out
    independently in tests/core/enumeration.py); the released rule and the others refuse both, naming who can."""
    from tests.core import enumeration
    post = BetaPosterior(np.array([0.5, 2.0, 5.0, 1.0], np.float32), np.array([4.5, 4.0, 1.0, 1.0], np.float32))
    counts = np.asarray(allocate(post, 17, n_min=N_MIN, n_max=N_MAX, method="sera_all_active"))
    want = enumeration.greedy_allocation(lambda i, n: _posterior_power(post.alpha[i], post.beta[i], n), 4, 17,
                                         N_MIN, N_MAX)
    np.testing.assert_array_equal(counts, want)
    with pytest.raises(ValueError, match=r"allocator 'sera' allocates on point estimates, not a Beta posterior"):
        allocate(post, 17, n_min=N_MIN, n_max=N_MAX)
    p = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    costs = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    costed = np.asarray(allocate(p, 60.0, n_min=N_MIN, n_max=N_MAX, method="sera_all_active", costs_P=costs))
    want = enumeration.greedy_allocation_with_costs(lambda i, n: _power(float(p[i]), n), costs, 60.0, N_MIN, N_MAX)
    np.testing.assert_array_equal(costed, want)
    for name in ("sera", "uniform", "dynamo"):
        with pytest.raises(ValueError, match=rf"method '{name}' has no token-budget form \(costs_P\); those that do: "
                                             r"\['sera_all_active'\]"):
            allocate(p, 60.0, n_min=N_MIN, n_max=N_MAX, method=name, costs_P=costs)


@pytest.mark.parametrize("name, estimator", [("sera", "grpo"), ("sera", "rloo"), ("sera_sum", "grpo"),
                                             ("sera_all_active", "reinforce")])
def test_a_rule_called_with_an_estimator_it_is_not_defined_for_names_both(name, estimator):
    p = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    both = rf"(?s)(?=.*'{name}')(?=.*'{estimator}')"
    with pytest.raises(ValueError, match=both):
        allocators.get_allocator(name).counts(p, 17, n_min=N_MIN, n_max=N_MAX, estimator=estimator)
    with pytest.raises(ValueError, match=both):
        allocate(p, 17, n_min=N_MIN, n_max=N_MAX, method=name, estimator=estimator)


def test_help_explains_the_names_and_how_to_call_a_rule():
    """What help(sera_jax.allocate) and help(sera_jax.get_allocator) show a user first."""
    import sera_jax
    allocate_doc, lookup_doc = sera_jax.allocate.__doc__, sera_jax.get_allocator.__doc__
    for name in BY_NAME + tuple(REFUSED):
        assert f"``{name}``" in allocate_doc, name
    assert "get_allocator" in allocate_doc and "released" in allocate_doc
    for phrase in (".counts(", "allocate(", "needs_estimate", "kind"):
        assert phrase in lookup_doc, phrase
