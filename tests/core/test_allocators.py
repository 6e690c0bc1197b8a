"""The allocator registry: lookup, what each entry needs, and each rule against brute force."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_jax.core import BetaPosterior, allocate, get_estimator, uniform_counts
from sera_jax.core import allocators

P, N_MIN, N_MAX = 4, 2, 6
BUDGETS = (8, 11, 17, 24)  # P n_min .. P n_max: few static budgets, few compiles
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
    assert {"uniform", "sera", "sera_sum"} <= set(allocators.ALLOCATORS)
    with pytest.raises(ValueError, match=r"unknown allocation method 'ppo'; known methods: \[.*'sera'.*\]"):
        allocators.get_allocator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        allocators.register(allocators.get_allocator("sera"))


def test_what_each_entry_needs():
    assert not allocators.get_allocator("uniform").needs_estimate
    assert allocators.get_allocator("sera").needs_estimate and allocators.get_allocator("sera_sum").needs_estimate
    with pytest.raises(ValueError, match="does not depend on N"):
        allocators.get_allocator("sera").check_estimator(get_estimator("reinforce"))
    with pytest.raises(ValueError, match="power-law factor"):
        allocators.get_allocator("sera_sum").check_estimator(get_estimator("grpo"))


def test_uniform_and_sera_are_the_core_allocations():
    p = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    uniform = allocators.get_allocator("uniform").counts(None, 17, n_min=2, n_max=6, num_prompts=4)
    np.testing.assert_array_equal(uniform, uniform_counts(4, 17))
    np.testing.assert_array_equal(allocators.get_allocator("sera").counts(p, 17, n_min=2, n_max=6),
                                  allocate(p, 17, n_min=2, n_max=6))
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
    np.testing.assert_array_equal(allocators.get_allocator("sera").counts(p, 6, n_min=2, n_max=4), [4, 2])
    np.testing.assert_array_equal(allocators.get_allocator("sera_sum").counts(p, 6, n_min=2, n_max=4), [2, 4])
