"""SERA's all-active allocation (``sera_all_active``: ``allocation.all_active_counts``): exact discrete max–min against
the greedy and brute force; invariants by hypothesis."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from jax.experimental import checkify

from sera_jax.core import BetaPosterior, allocate_tokens, expected_scale_factor, scale_factor, waterline
from sera_jax.core import allocation as allocation_lib
from sera_jax.core.allocation import all_active_counts
from tests.core import enumeration

HYPOTHESIS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
P = 6  # one shape for the property tests, so they share one compiled program per (budget, bounds)
# The budget is static (one compile each): a few budgets spanning [P n_min, P n_max] keep the suite fast.
budgets = st.sampled_from([12, 13, 23, 37, 53, 54])


def _maxrl_scale(p):
    """s_i(n) = 1 - (1-p_i)^(n-1) in float64 NumPy: independent of the code under test."""
    return lambda i, n: 1.0 - (1.0 - float(p[i])) ** (n - 1)


def _min_scale(p, counts):
    return min(_maxrl_scale(p)(i, c) for i, c in enumerate(counts))


# p values on a grid of sigmoids with an irrational-ish offset: distinct grid points never tie exactly.
p_vectors = st.lists(st.integers(-40, 40), min_size=P, max_size=P).map(
    lambda z: (1.0 / (1.0 + np.exp(-(np.array(z) * 0.173 + 0.0137)))).astype(np.float32))
p_with_edges = st.lists(st.sampled_from([0.0, 1.0, 0.5, 0.01, 0.2, 0.93]) | st.floats(0, 1, width=32),
                        min_size=P, max_size=P).map(lambda v: np.array(v, np.float32))


@HYPOTHESIS
@given(p=p_with_edges, budget=budgets)
def test_sum_and_bounds(p, budget):
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))
    assert counts.dtype == np.int32
    assert counts.sum() == budget
    assert counts.min() >= 2 and counts.max() <= 9


# Interior p where a wrong step key changes the max-min value (key p_i (n-1) instead of -log(1-p_i) (n-1): min s
# 0.762 instead of 0.849, and 0.896 instead of 0.942); random draws with edges rarely hit such a case.
KEY_SENSITIVE = [[0.51, 0.9, 0.38, 0.69, 0.27, 0.86], [0.59, 0.62, 0.82, 0.53, 0.78, 0.76]]


@settings(HYPOTHESIS, max_examples=100, derandomize=True)  # derandomised: the same cases on every run
@given(p=p_with_edges, budget=budgets)
@example(p=np.array(KEY_SENSITIVE[0], np.float32), budget=23)
@example(p=np.array(KEY_SENSITIVE[1], np.float32), budget=23)
@example(p=np.array(KEY_SENSITIVE[1], np.float32), budget=37)
def test_max_min_equals_greedy(p, budget):
    """The max–min value over the prompts whose factor can be positive. A prompt with s = 0 at every count
    (p = 0, or p below float64 resolution) makes min s = 0 for any allocation, so it is left out of the minimum;
    the atol is far below every factor that is not 0. (Sorted factor vectors would be a stronger check but differ
    legitimately at near ties: see ``_without_near_ties``.)"""
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))
    greedy = enumeration.greedy_allocation(_maxrl_scale(p), P, budget, 2, 9)
    live = [i for i in range(P) if _maxrl_scale(p)(i, 9) > 0]
    assume(live)
    np.testing.assert_allclose(_min_scale(p[live], counts[live]), _min_scale(p[live], greedy[live]),
                               rtol=1e-5, atol=1e-12)


def _without_near_ties(p, n_min: int, n_max: int, tol: float = 1e-5) -> bool:
    """True unless two prompts with different p have step values s_i(n) closer than ``tol`` (but not equal).

    Exact ties (equal p) are broken the same way by both sides (fewer rollouts, then index); near ties are not
    decidable in float32 -- e.g. p = 0.9961 and 0.9954 both have s(p, 8) = 1 - O(1e-17), which is 1.0 in
    float32 and in float64, so which of them gets the last rollout is arbitrary.
    """
    keys = sorted((1.0 - (1.0 - float(pi)) ** (n - 1), float(pi)) for pi in p for n in range(n_min, n_max + 1))
    return all(b[0] - a[0] >= tol or a[1] == b[1] for a, b in zip(keys, keys[1:]))


@settings(HYPOTHESIS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(p=p_vectors, budget=budgets)
def test_counts_equal_greedy_without_near_ties(p, budget):
    assume(_without_near_ties(p, 2, 9))
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))
    greedy = enumeration.greedy_allocation(_maxrl_scale(p), P, budget, 2, 9)
    np.testing.assert_array_equal(counts, greedy)


def test_near_tie_filter_rejects_saturated_pairs():
    z = np.array([0, 0, 0, 0, 32, 31])  # the case that made the unfiltered test fail: two p near 0.996
    assert not _without_near_ties((1.0 / (1.0 + np.exp(-(z * 0.173 + 0.0137)))).astype(np.float32), 2, 9)
    assert _without_near_ties(np.array([0.1, 0.1, 0.3, 0.5], np.float32), 2, 9)


@pytest.mark.parametrize("seed", range(4))
def test_max_min_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, size=3).astype(np.float32)
    for budget in range(6, 19, 3):
        counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=6))
        best = enumeration.brute_force_max_min(_maxrl_scale(p), 3, budget, 2, 6)
        np.testing.assert_allclose(_min_scale(p, counts), best, rtol=1e-5)


def test_beats_rounding_the_continuous_solution():
    """Rounding the waterline can be strictly worse; the discrete waterline never is."""
    rng = np.random.default_rng(0)
    worse = 0
    for trial in range(30):
        p = rng.beta(0.5, 2.0, size=P).astype(np.float32)
        budget = [20, 31, 45, 60][trial % 4]
        cont = np.asarray(waterline(p, budget, n_min=2, n_max=12), np.float64)
        rounded = np.floor(cont).astype(int)
        order = np.argsort(-(cont - rounded), kind="stable")  # largest remainders first
        rounded[order[: budget - rounded.sum()]] += 1
        exact = np.asarray(all_active_counts(p, budget, n_min=2, n_max=12))
        assert _min_scale(p, exact) >= _min_scale(p, rounded) - 1e-7
        worse += _min_scale(p, exact) > _min_scale(p, rounded) + 1e-7
    assert worse > 0, "expected at least one case where naive rounding loses"


@HYPOTHESIS
@given(p=p_vectors, budget=st.sampled_from([12, 23, 37, 53]))
def test_monotone_in_budget(p, budget):
    small = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))
    large = np.asarray(all_active_counts(p, budget + 1, n_min=2, n_max=9))
    assert np.all(large >= small) and large.sum() - small.sum() == 1


@HYPOTHESIS
@given(p=p_vectors, budget=budgets, seed=st.integers(0, 2**16))
def test_permutation_equivariance(p, budget, seed):
    perm = np.random.default_rng(seed).permutation(P)
    direct = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))[perm]
    permuted = np.asarray(all_active_counts(p[perm], budget, n_min=2, n_max=9))
    # Equal p values are exact ties broken by index: compare the multiset of counts per p value.
    for value in np.unique(p):
        same = p[perm] == value
        np.testing.assert_array_equal(np.sort(direct[same]), np.sort(permuted[same]))


def test_equal_p_gives_near_uniform_counts():
    counts = np.asarray(all_active_counts(np.full(7, 0.3, np.float32), 7 * 5 + 3, n_min=2, n_max=16))
    np.testing.assert_array_equal(counts, [6, 6, 6, 5, 5, 5, 5])  # ties: fewer rollouts, then index


def test_hard_prompts_get_more_and_edges_spend_the_budget():
    p = np.array([0.0, 0.05, 0.3, 0.9, 1.0], np.float32)
    counts = np.asarray(all_active_counts(p, 40, n_min=2, n_max=16))
    assert counts.sum() == 40
    assert counts[0] == 16 and counts[4] == 2  # p = 0 fills first, p = 1 stays at n_min
    assert counts[1] > counts[2] > counts[3]
    all_solved = np.asarray(all_active_counts(np.ones(4, np.float32), 20, n_min=2, n_max=8))
    assert all_solved.sum() == 20 and all_solved.max() - all_solved.min() <= 1


def test_jit_equals_eager_and_traces_once():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(3, 50)).astype(np.float32)
    f = jax.jit(functools.partial(all_active_counts, budget=400, n_min=2, n_max=20))
    for row in p:
        np.testing.assert_array_equal(f(jnp.asarray(row)), all_active_counts(row, 400, n_min=2, n_max=20))
    before = allocation_lib._allocate_impl._cache_size()
    for row in rng.uniform(size=(3, 50)).astype(np.float32):
        all_active_counts(row, 400, n_min=2, n_max=20)
    assert allocation_lib._allocate_impl._cache_size() == before


def test_vmap_over_problems():
    rng = np.random.default_rng(2)
    p = rng.uniform(size=(5, 30)).astype(np.float32)
    batched = jax.vmap(lambda q: all_active_counts(q, 200, n_min=2, n_max=16, check=False))(jnp.asarray(p))
    for row, counts in zip(p, np.asarray(batched)):
        np.testing.assert_array_equal(counts, all_active_counts(row, 200, n_min=2, n_max=16))


def test_float64(x64):
    rng = np.random.default_rng(3)
    p = rng.uniform(size=40)
    counts = np.asarray(all_active_counts(p, 300, n_min=2, n_max=30))
    greedy = enumeration.greedy_allocation(_maxrl_scale(p), 40, 300, 2, 30)
    np.testing.assert_array_equal(counts, greedy)


def test_large_problem_matches_greedy_value():
    rng = np.random.default_rng(4)
    p = rng.beta(0.3, 1.0, size=300).astype(np.float32)
    counts = np.asarray(all_active_counts(p, 300 * 8, n_min=2, n_max=64))
    greedy = enumeration.greedy_allocation(_maxrl_scale(p), 300, 300 * 8, 2, 64)
    np.testing.assert_allclose(_min_scale(p, counts), _min_scale(p, greedy), rtol=1e-5)
    assert np.abs(counts - greedy).max() <= 1  # only near-ties may go the other way


def test_grpo_uses_its_own_factor():
    p = np.array([0.05, 0.2, 0.5, 0.8, 0.97], np.float32)
    table = np.asarray(scale_factor(p[:, None], np.arange(1, 17)[None, :], "grpo"))  # checked by enumeration

    def grpo_scale(i, n):
        return table[i, n - 1]

    counts = np.asarray(all_active_counts(p, 40, n_min=2, n_max=16, estimator="grpo"))
    greedy = enumeration.greedy_allocation(grpo_scale, 5, 40, 2, 16)
    assert counts.sum() == 40
    np.testing.assert_allclose(min(grpo_scale(i, c) for i, c in enumerate(counts)),
                               min(grpo_scale(i, c) for i, c in enumerate(greedy)), rtol=1e-5)


def test_posterior_expected_factor():
    post = BetaPosterior(jnp.array([0.5, 2.0, 5.0, 1.0]), jnp.array([10.0, 4.0, 1.0, 1.0]))

    @functools.lru_cache(maxsize=None)
    def expected_scale(i, n):  # E[1 - (1-p)^(n-1)] under Beta(a, b), by quadrature (independent)
        from scipy import integrate, stats
        a, b = float(post.alpha[i]), float(post.beta[i])
        return integrate.quad(lambda x: (1 - (1 - x) ** (n - 1)) * stats.beta.pdf(x, a, b), 0, 1)[0]

    np.testing.assert_allclose(expected_scale_factor(post, 5), [expected_scale(i, 5) for i in range(4)], rtol=1e-4)
    counts = np.asarray(all_active_counts(post, 30, n_min=2, n_max=16))
    greedy = enumeration.greedy_allocation(expected_scale, 4, 30, 2, 16)
    np.testing.assert_allclose(min(expected_scale(i, c) for i, c in enumerate(counts)),
                               min(expected_scale(i, c) for i, c in enumerate(greedy)), rtol=1e-5)


def test_uniform():
    counts = np.asarray(all_active_counts(np.full(5, 0.1, np.float32), 23, n_min=2, n_max=8, method="uniform"))
    np.testing.assert_array_equal(counts, [5, 5, 5, 4, 4])


TINY = np.float32(1.1754944e-38)  # the smallest normal float32: 1 / lambda = 8.5e37, four of them overflow a sum


@HYPOTHESIS
@given(p=p_with_edges, budget=budgets)
@example(p=np.array([0, 0, TINY, TINY, TINY, TINY], np.float32), budget=37)
def test_waterline_sum_bounds_and_equal_factors(p, budget):
    counts = np.asarray(waterline(p, budget, n_min=2, n_max=9), np.float64)
    np.testing.assert_allclose(counts.sum(), budget, rtol=1e-5)
    assert counts.min() >= 2 - 1e-5 and counts.max() <= 9 + 1e-5
    free = (counts > 2 + 1e-3) & (counts < 9 - 1e-3) & (p > 0) & (p < 1)
    if free.sum() >= 2:
        s = 1 - (1 - p[free].astype(np.float64)) ** (counts[free] - 1)
        np.testing.assert_allclose(s, s.mean(), rtol=1e-3, atol=1e-6)


def test_waterline_is_an_upper_bound_on_the_integer_value():
    rng = np.random.default_rng(5)
    for _ in range(10):
        p = rng.uniform(size=P).astype(np.float32)
        budget = [13, 23, 37, 53][_ % 4]
        cont = np.asarray(waterline(p, budget, n_min=2, n_max=9), np.float64)
        cont_value = np.min(1 - (1 - p.astype(np.float64)) ** (cont - 1))
        assert cont_value >= _min_scale(p, np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))) - 1e-6


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=5), "infeasible budget 5"),
    (dict(budget=100), "infeasible budget 100"),
    (dict(budget=20, n_min=9, n_max=8), "n_min \\(9\\) must be <= n_max \\(8\\)"),
    (dict(budget=20, n_min=1), "n_min=1 is too small for estimator 'maxrl'"),
    (dict(budget=20, estimator="ppo"), "unknown estimator 'ppo'"),
    (dict(budget=20, method="greedy"), "unknown allocation method 'greedy'"),
    (dict(budget=20, estimator="rloo"), "does not depend on N"),
    (dict(budget=20.0), "budget must be a static Python integer"),
])
def test_bad_problems(kwargs, message):
    kwargs = dict(dict(n_min=2, n_max=8), **kwargs)
    budget = kwargs.pop("budget")
    with pytest.raises(ValueError, match=message):
        all_active_counts(np.full(4, 0.5, np.float32), budget, **kwargs)


@pytest.mark.parametrize("p, message", [
    (np.array([0.5, np.nan], np.float32), "NaN"),
    (np.array([0.5, -0.2], np.float32), "below 0"),
    (np.array([0.5, 1.2], np.float32), "above 1"),
    (np.ones((2, 2), np.float32), "shape \\(P,\\)"),
    (np.array([1, 0]), "floating-point"),
])
def test_bad_p_hat(p, message):
    with pytest.raises(ValueError, match=message):
        all_active_counts(p, 8, n_min=2, n_max=8)
    with pytest.raises(ValueError, match=message):
        waterline(p, 8, n_min=2, n_max=8)


def test_bad_p_hat_under_jit_is_reported_by_checkify():
    f = checkify.checkify(jax.jit(lambda p: all_active_counts(p, 8, n_min=2, n_max=8)))
    f(jnp.array([0.5, 0.5]))[0].throw()
    with pytest.raises(checkify.JaxRuntimeError, match="p_hat must be probabilities"):
        f(jnp.array([0.5, jnp.nan]))[0].throw()


def test_posterior_allocation_for_an_estimator_without_a_power_law():
    """grpo on a Beta posterior equalises E[s_grpo(p, N)]: the exact discrete max–min of the greedy, with the
    expected factor computed by Gauss-Jacobi quadrature of the point factor (independent of the Beta sum)."""
    from scipy import special
    post = BetaPosterior(jnp.array([0.5, 2.0, 5.0, 1.0]), jnp.array([10.0, 4.0, 1.0, 1.0]))

    ns = np.arange(1, 13)
    table = []  # table[i][n - 1] = E[s_grpo(p_i, n)]
    for a, b in zip(np.asarray(post.alpha, np.float64), np.asarray(post.beta, np.float64)):
        x, w = special.roots_jacobi(24, b - 1, a - 1)
        s = np.asarray(scale_factor(jnp.asarray((1 + x) / 2, jnp.float32)[:, None], ns[None, :], "grpo"), np.float64)
        table.append(np.sum(w[:, None] * s, axis=0) / np.sum(w))

    def expected_scale(i, n):
        return float(table[i][n - 1])

    counts = np.asarray(all_active_counts(post, 30, n_min=2, n_max=12, estimator="grpo"))
    greedy = enumeration.greedy_allocation(expected_scale, 4, 30, 2, 12)
    assert counts.sum() == 30
    np.testing.assert_allclose(min(expected_scale(i, c) for i, c in enumerate(counts)),
                               min(expected_scale(i, c) for i, c in enumerate(greedy)), rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# Token budgets: costs l_i per rollout, sum_i l_i N_i <= budget.

# Costs on a grid of sixteenths in [0.5, 4]: every sum of them is exact in float32 and float64, so the code and the
# references agree on which allocations fit. The token budgets are static (one compile each) and all feasible
# (sum_i n_min l_i <= 48 for P = 6, n_min = 2); 300 exceeds every sum_i n_max l_i (<= 216): nothing binds there.
cost_vectors = st.lists(st.integers(8, 64), min_size=P, max_size=P).map(lambda v: np.array(v, np.float32) / 16)
token_budgets = st.sampled_from([48.0, 77.5, 121.0, 190.0, 300.0])


def _cost(costs, counts):
    return float(np.dot(np.asarray(costs, np.float64), np.asarray(counts, np.float64)))


@settings(HYPOTHESIS, derandomize=True)
@given(p=p_with_edges, budget=budgets)
def test_unit_costs_reduce_to_the_rollout_budget(p, budget):
    """All l_i = 1 and an integer budget: exactly today's counts, ties included, for both methods."""
    for method in ("sera_all_active", "uniform"):
        expected = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9, method=method))
        costed = np.asarray(all_active_counts(p, float(budget), n_min=2, n_max=9, method=method, costs_P=np.ones(P)))
        np.testing.assert_array_equal(costed, expected)


def test_equal_costs_reduce_to_the_rollout_budget():
    """l_i = c for all i and budget c B (plus less than c): the rollout budget B's counts."""
    rng = np.random.default_rng(6)
    for budget, c in [(23, 0.75), (37, 3.0), (37, 3.0)]:
        p = rng.uniform(size=P).astype(np.float32)
        p[:2] = p[2]  # exact ties, broken by (n, i) on both sides
        expected = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9))
        costed = np.asarray(all_active_counts(p, c * budget + 0.5 * c, n_min=2, n_max=9, costs_P=np.full(P, c, np.float32)))
        np.testing.assert_array_equal(costed, expected)
    np.testing.assert_array_equal(all_active_counts(p, 11.25, n_min=2, n_max=8, method="uniform", costs_P=np.full(P, 0.75)),
                                  [3, 3, 3, 2, 2, 2])  # 15 rollouts: round-robin from the first prompt


@settings(HYPOTHESIS, derandomize=True)
@given(p=p_with_edges, costs=cost_vectors, budget=token_budgets)
def test_costed_bounds_budget_and_nothing_left_that_fits(p, costs, budget):
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9, costs_P=costs))
    assert counts.dtype == np.int32
    assert counts.min() >= 2 and counts.max() <= 9
    left = budget - _cost(costs, counts)
    assert left >= 0
    assert np.all((counts == 9) | (costs > left)), "a rollout that still fits the budget was left out"


@settings(HYPOTHESIS, max_examples=60, derandomize=True)
@given(p=p_vectors, costs=cost_vectors, budget=token_budgets)
@example(p=np.array(KEY_SENSITIVE[0], np.float32), costs=np.array([1, 4, 0.5, 2, 0.5, 3], np.float32), budget=77.5)
@example(p=np.array(KEY_SENSITIVE[1], np.float32), costs=np.full(P, 2, np.float32), budget=77.5)
def test_costed_max_min_equals_brute_force(p, costs, budget):
    """The max–min value against every integer allocation that fits (8^6 of them)."""
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9, costs_P=costs))
    best = enumeration.brute_force_max_min_with_costs(_maxrl_scale(p), costs, budget, 2, 9)
    assert _cost(costs, counts) <= budget
    np.testing.assert_allclose(_min_scale(p, counts), best, rtol=1e-5, atol=1e-12)


@settings(HYPOTHESIS, max_examples=60, derandomize=True)
@given(p=p_vectors, costs=cost_vectors, budget=token_budgets, max_rows=st.sampled_from([12, 20, 27, 40, 60]))
def test_token_budget_with_a_row_cap_attains_the_joint_max_min(p, costs, budget, max_rows):
    """allocate_tokens: both budgets hold, and the max–min value equals brute force over every integer allocation
    that fits the tokens and the rows (the trainer's flat layout has a fixed number of rows)."""
    counts = np.asarray(allocate_tokens(p, budget, costs, max_rows, n_min=2, n_max=9))
    assert _cost(costs, counts) <= budget and counts.sum() <= max_rows
    assert counts.min() >= 2 and counts.max() <= 9
    best = enumeration.brute_force_max_min_with_costs(_maxrl_scale(p), costs, budget, 2, 9, max_rows=max_rows)
    np.testing.assert_allclose(_min_scale(p, counts), best, rtol=1e-5, atol=1e-12)


def test_a_row_cap_that_cannot_bind_leaves_the_token_allocation():
    p, costs = np.array([0.05, 0.3, 0.6, 0.9, 0.2, 0.5], np.float32), np.full(P, 0.5, np.float32)
    np.testing.assert_array_equal(allocate_tokens(p, 20.0, costs, 54, n_min=2, n_max=9),
                                  all_active_counts(p, 20.0, n_min=2, n_max=9, costs_P=costs))
    capped = np.asarray(allocate_tokens(p, 20.0, costs, 20, n_min=2, n_max=9))  # 40 rollouts fit the tokens
    assert capped.sum() <= 20


@settings(HYPOTHESIS, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(p=p_vectors, costs=cost_vectors, budget=token_budgets)
def test_costed_counts_equal_costed_greedy_without_near_ties(p, costs, budget):
    """The counts, not just the value: the leftover is spent by the greedy rule (module docstring)."""
    assume(_without_near_ties(p, 2, 9))
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=9, costs_P=costs))
    greedy = enumeration.greedy_allocation_with_costs(_maxrl_scale(p), costs, budget, 2, 9)
    np.testing.assert_array_equal(counts, greedy)


@settings(HYPOTHESIS, derandomize=True)
@given(costs=cost_vectors, budget=token_budgets)
def test_costed_uniform_is_round_robin(costs, budget):
    counts = np.asarray(all_active_counts(np.full(P, 0.5, np.float32), budget, n_min=2, n_max=9, method="uniform",
                                 costs_P=costs))
    np.testing.assert_array_equal(counts, enumeration.greedy_allocation_with_costs(lambda i, n: 0.0, costs, budget,
                                                                                    2, 9))


def test_costed_skipped_prompts_leave_the_rest_to_cheaper_ones():
    """Hand-checked: after the hard, long prompt's next rollout no longer fits, the short ones go on."""
    p = np.array([0.05, 0.5, 0.6], np.float32)
    costs = np.array([10.0, 1.0, 1.0], np.float32)
    # n_min costs 24 tokens. Prompt 0's keys -log(1 - s) = 0.051 (n - 1) stay below prompt 1's first, 0.69, up to 14
    # rollouts, so it takes 4 more (64 tokens); its 7th (74) does not fit 70. Prompts 1 and 2 then share the last 6
    # tokens by their keys 0.69 (n - 1) and 0.92 (n - 1): 0.69, 0.92, 1.39, 1.83, 2.08, 2.75, three each.
    np.testing.assert_array_equal(all_active_counts(p, 70.0, n_min=2, n_max=16, costs_P=costs), [6, 5, 5])
    np.testing.assert_array_equal(enumeration.greedy_allocation_with_costs(_maxrl_scale(p), costs, 70.0, 2, 16),
                                  [6, 5, 5])
    # Costs 10, 4, 4: 36 tokens at n_min, prompt 0 takes 3 more (66); the 4 tokens left fit exactly one rollout of
    # prompt 1 (key 0.69 < 0.92), none of prompt 0's.
    np.testing.assert_array_equal(all_active_counts(p, 70.0, n_min=2, n_max=16, costs_P=np.array([10.0, 4.0, 4.0])),
                                  [5, 3, 2])


@pytest.mark.parametrize("seed", range(4))
def test_costed_max_min_equals_brute_force_with_random_costs(seed):
    """P = 4, n in [2, 6], costs uniform in [0.5, 4] (not on a grid): float32 sums may round, so the value is
    bracketed by the brute force at budget (1 -+ 1e-6). The continuous waterline bounds it from above."""
    rng = np.random.default_rng(100 + seed)
    p = rng.uniform(0.02, 0.98, size=4).astype(np.float32)
    costs = rng.uniform(0.5, 4.0, size=4).astype(np.float32)
    for budget in (33.0, 47.0, 70.0):
        counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=6, costs_P=costs))
        value = _min_scale(p, counts)
        low = enumeration.brute_force_max_min_with_costs(_maxrl_scale(p), costs, budget * (1 - 1e-6), 2, 6)
        high = enumeration.brute_force_max_min_with_costs(_maxrl_scale(p), costs, budget * (1 + 1e-6), 2, 6)
        assert _cost(costs, counts) <= budget * (1 + 1e-6)
        assert low * (1 - 1e-5) <= value <= high * (1 + 1e-5)
        cont = np.asarray(waterline(p, budget, n_min=2, n_max=6, costs_P=costs), np.float64)
        assert np.min(1 - (1 - p.astype(np.float64)) ** (cont - 1)) >= high - 1e-6


@pytest.mark.parametrize("estimator", ["maxrl_no_baseline", "grpo"])
def test_costed_other_estimators(estimator):
    p = np.array([0.05, 0.2, 0.5, 0.8], np.float32)
    costs = np.array([3.5, 2.0, 1.25, 0.5], np.float32)
    table = np.asarray(scale_factor(p[:, None], np.arange(1, 7)[None, :], estimator), np.float64)

    def scale(i, n):
        return float(table[i, n - 1])

    counts = np.asarray(all_active_counts(p, 33.0, n_min=2, n_max=6, estimator=estimator, costs_P=costs))
    best = enumeration.brute_force_max_min_with_costs(scale, costs, 33.0, 2, 6)
    np.testing.assert_allclose(min(scale(i, c) for i, c in enumerate(counts)), best, rtol=1e-5)
    assert _cost(costs, counts) <= 33.0


def test_costed_posterior_expected_factor():
    from scipy import integrate, stats
    post = BetaPosterior(jnp.array([0.5, 2.0, 5.0, 1.0]), jnp.array([10.0, 4.0, 1.0, 1.0]))
    costs = np.array([4.0, 2.5, 1.0, 0.5], np.float32)

    @functools.lru_cache(maxsize=None)
    def expected_scale(i, n):  # E[1 - (1-p)^(n-1)] under Beta(a, b), by quadrature (independent)
        a, b = float(post.alpha[i]), float(post.beta[i])
        return integrate.quad(lambda x: (1 - (1 - x) ** (n - 1)) * stats.beta.pdf(x, a, b), 0, 1)[0]

    counts = np.asarray(all_active_counts(post, 33.0, n_min=2, n_max=6, costs_P=costs))
    best = enumeration.brute_force_max_min_with_costs(expected_scale, costs, 33.0, 2, 6)
    np.testing.assert_allclose(min(expected_scale(i, c) for i, c in enumerate(counts)), best, rtol=1e-5)


def test_costed_token_lengths_at_scale_match_the_greedy():
    """64 prompts, integer token lengths 20..400 (exact float32 sums), many phases of skipped prompts."""
    rng = np.random.default_rng(7)
    p = rng.beta(0.5, 1.5, size=64).astype(np.float32)
    costs = rng.integers(20, 401, size=64).astype(np.float32)
    budget = float(np.floor(8 * costs.sum()) + 0.5)
    counts = np.asarray(all_active_counts(p, budget, n_min=2, n_max=32, costs_P=costs))
    greedy = enumeration.greedy_allocation_with_costs(_maxrl_scale(p), costs, budget, 2, 32)
    np.testing.assert_allclose(_min_scale(p, counts), _min_scale(p, greedy), rtol=1e-5)
    left = budget - _cost(costs, counts)
    assert 0 <= left and np.all((counts == 32) | (costs > left))
    assert np.abs(counts - greedy).sum() <= 4  # only near-ties may go the other way


def test_costed_float64(x64):
    rng = np.random.default_rng(8)
    p = rng.uniform(size=20)
    costs = rng.integers(8, 65, size=20) / 16
    counts = np.asarray(all_active_counts(p, 200.0, n_min=2, n_max=12, costs_P=costs))
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts, enumeration.greedy_allocation_with_costs(_maxrl_scale(p), costs, 200.0,
                                                                                    2, 12))


def test_costed_jit_and_vmap_equal_eager():
    rng = np.random.default_rng(9)
    p = rng.uniform(size=(4, 12)).astype(np.float32)
    costs = rng.integers(50, 500, size=(4, 12)).astype(np.float32)
    budget = 20000.0
    eager = np.stack([all_active_counts(q, budget, n_min=2, n_max=16, costs_P=c) for q, c in zip(p, costs)])
    f = jax.jit(lambda q, c: all_active_counts(q, budget, n_min=2, n_max=16, costs_P=c))
    np.testing.assert_array_equal(np.stack([f(q, c) for q, c in zip(p, costs)]), eager)
    g = jax.vmap(lambda q, c: all_active_counts(q, budget, n_min=2, n_max=16, costs_P=c, check=False))
    np.testing.assert_array_equal(g(jnp.asarray(p), jnp.asarray(costs)), eager)


@settings(HYPOTHESIS, derandomize=True)
@given(p=p_with_edges, costs=cost_vectors, budget=token_budgets)
@example(p=np.array([0, 0, 0, 0, 0, TINY], np.float32), costs=np.array([8, 8, 8, 8, 42, 64], np.float32) / 16,
         budget=77.5)  # found by hypothesis: l_i / lambda_i overflowed float32 before the exact solve was scaled
def test_costed_waterline_spends_the_budget_at_equal_factors(p, costs, budget):
    counts = np.asarray(waterline(p, budget, n_min=2, n_max=9, costs_P=costs), np.float64)
    assert counts.min() >= 2 - 1e-5 and counts.max() <= 9 + 1e-5
    np.testing.assert_allclose(_cost(costs, counts), min(budget, _cost(costs, np.full(P, 9))), rtol=1e-5)
    free = (counts > 2 + 1e-3) & (counts < 9 - 1e-3) & (p > 0) & (p < 1)
    if free.sum() >= 2:  # equal factors, whatever the costs: N_i = 1 + tau / lambda_i
        s = 1 - (1 - p[free].astype(np.float64)) ** (counts[free] - 1)
        np.testing.assert_allclose(s, s.mean(), rtol=1e-3, atol=1e-6)


def test_costed_waterline_with_unit_costs_is_the_rollout_waterline():
    rng = np.random.default_rng(10)
    p = np.concatenate([[0.0, 1.0], rng.uniform(size=P - 2)]).astype(np.float32)
    for budget in (13, 37, 53):
        np.testing.assert_allclose(waterline(p, float(budget), n_min=2, n_max=9, costs_P=np.ones(P)),
                                   waterline(p, budget, n_min=2, n_max=9), rtol=1e-6)


def test_costed_waterline_hand_checked():
    """Two prompts of equal p: equal factors mean equal counts whatever their costs; the budget sets the level."""
    p = np.array([0.3, 0.3], np.float32)
    np.testing.assert_allclose(waterline(p, 30.0, n_min=2, n_max=16, costs_P=np.array([1.0, 2.0])), [10, 10],
                               rtol=1e-5)
    # p = 0 gets n_max when affordable; else it takes what the others leave at n_min (here (12 - 2 * 3) / 1).
    p = np.array([0.0, 0.5], np.float32)
    np.testing.assert_allclose(waterline(p, 12.0, n_min=2, n_max=16, costs_P=np.array([1.0, 3.0])), [6, 2],
                               rtol=1e-5)


@pytest.mark.parametrize("costs, budget, message", [
    (np.array([1.0, np.nan, 1.0, 1.0]), 20.0, "costs_P must be finite"),
    (np.array([1.0, np.inf, 1.0, 1.0]), 20.0, "costs_P must be finite"),
    (np.array([1.0, 0.0, 1.0, 1.0]), 20.0, "costs_P must be > 0"),
    (np.array([1.0, -2.0, 1.0, 1.0]), 20.0, "costs_P must be > 0"),
    (np.ones(5), 20.0, "costs_P must have shape \\(P,\\) = \\(4,\\)"),
    (np.ones((4, 1)), 20.0, "costs_P must have shape"),
    (np.ones(4, bool), 20.0, "costs_P must be a real"),
    (np.array([1.0, 2.0, 3.0, 4.5]), 20.9, "infeasible budget 20.9: n_min \\* sum_i costs_P"),
    (np.ones(4), float("nan"), "budget must be finite and > 0"),
    (np.ones(4), -1.0, "budget must be finite and > 0"),
    (np.ones(4), "100", "budget must be a static Python number"),
    (np.ones(4), True, "budget must be a static Python number"),
])
def test_bad_costs_and_token_budgets(costs, budget, message):
    p = np.full(4, 0.5, np.float32)
    with pytest.raises(ValueError, match=message):
        all_active_counts(p, budget, n_min=2, n_max=8, costs_P=costs)
    with pytest.raises(ValueError, match=message):
        waterline(p, budget, n_min=2, n_max=8, costs_P=costs)


def test_costed_budget_just_feasible_and_above_every_need():
    p = np.full(4, 0.5, np.float32)
    costs = np.array([1.0, 2.0, 3.0, 4.5])
    np.testing.assert_array_equal(all_active_counts(p, 21.0, n_min=2, n_max=8, costs_P=costs), [2, 2, 2, 2])
    np.testing.assert_array_equal(all_active_counts(p, 1e6, n_min=2, n_max=8, costs_P=costs), [8, 8, 8, 8])


def test_bad_costs_under_jit_are_reported_by_checkify():
    f = checkify.checkify(jax.jit(lambda c: all_active_counts(np.full(3, 0.5, np.float32), 12.0, n_min=2, n_max=8,
                                                              costs_P=c)))
    f(jnp.array([1.0, 2.0, 3.0]))[0].throw()
    with pytest.raises(checkify.JaxRuntimeError, match="costs_P must be > 0"):
        f(jnp.array([1.0, -2.0, 3.0]))[0].throw()
    with pytest.raises(checkify.JaxRuntimeError, match="infeasible budget 12.0"):
        f(jnp.array([1.0, 2.0, 4.0]))[0].throw()


def test_costed_brute_force_reference_with_unit_costs():
    """The vectorised costed brute force against the plain one (sum = B): the two references agree."""
    p = np.array([0.1, 0.45, 0.8], np.float32)
    for budget in (6, 10, 13):
        np.testing.assert_allclose(
            enumeration.brute_force_max_min_with_costs(_maxrl_scale(p), np.ones(3), float(budget), 2, 6),
            enumeration.brute_force_max_min(_maxrl_scale(p), 3, budget, 2, 6), rtol=1e-12)
