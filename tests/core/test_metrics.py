"""pass@k against exact rational arithmetic; alignment metrics; success-rate estimation."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import (cosine_similarity, fitted_prior, mean_pass_at_k, pass_at_k, pass_at_k_curve,
                           pilot_allocate, pilot_posterior, relative_error, tracker_init, tracker_posterior,
                           tracker_predict, tracker_update)


def exact_pass_at_k(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n, c, k", [
    (10, 0, 3), (10, 10, 3), (10, 3, 8), (10, 3, 7), (64, 1, 1), (2048, 5, 128), (2048, 1900, 7),
    (100_000, 1, 1), (100_000, 3, 50_000), (100_000, 99_000, 10), (100_000, 17, 2048)])
def test_pass_at_k_exact(n, c, k):
    exact = float(exact_pass_at_k(n, c, k))
    np.testing.assert_allclose(pass_at_k(n, c, k), exact, rtol=1e-12, atol=0)


def test_pass_at_k_curve_matches_pointwise():
    rng = np.random.default_rng(0)
    correct = rng.integers(0, 200, size=6)
    ks = np.array([1, 2, 5, 16, 100, 200])
    curve = pass_at_k_curve(200, correct, ks)
    for q, c in enumerate(correct):
        for j, k in enumerate(ks):
            np.testing.assert_allclose(curve[q, j], float(exact_pass_at_k(200, int(c), int(k))), rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(mean_pass_at_k(200, correct, ks), curve.mean(0))


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(10, 2, 11)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(10, 12, 1)


def test_alignment_metrics_over_pytrees():
    a = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    np.testing.assert_allclose(cosine_similarity(a, a), 1.0, rtol=1e-6)
    neg = jax.tree.map(lambda x: -2 * x, a)
    np.testing.assert_allclose(cosine_similarity(a, neg), -1.0, rtol=1e-6)
    orth = {"w": jnp.array([2.0, -1.0]), "b": jnp.array([[0.0]])}
    np.testing.assert_allclose(cosine_similarity(a, orth), 0.0, atol=1e-7)
    half = jax.tree.map(lambda x: 0.5 * x, a)
    np.testing.assert_allclose(relative_error(half, a), 0.5, rtol=1e-6)


def test_tracker_counts_decay_and_prior():
    state = tracker_init(5)
    state = tracker_update(state, jnp.array([0, 3]), jnp.array([2, 0]), jnp.array([4, 4]))
    state = tracker_update(state, jnp.array([3, 1]), jnp.array([4, 1]), jnp.array([4, 8]), decay=0.5)
    np.testing.assert_allclose(state.successes, [2, 1, 0, 4, 0])
    np.testing.assert_allclose(state.failures, [2, 7, 0, 2, 0])
    a0, b0 = fitted_prior(state)
    post = tracker_posterior(state, jnp.array([3, 4]))
    np.testing.assert_allclose(post.alpha, [a0 + 4, a0], rtol=1e-6)
    np.testing.assert_allclose(post.beta, [b0 + 2, b0], rtol=1e-6)
    pooled = (7 + 0.5) / (18 + 1)
    np.testing.assert_allclose(a0 / (a0 + b0), pooled, rtol=1e-6)  # unseen prompts get the pooled rate
    np.testing.assert_allclose(tracker_predict(state, jnp.array([4])), pooled, rtol=1e-6)


def test_fitted_prior_recovers_beta_population():
    """Moment fit on 4000 prompts x 30 trials from Beta(2, 6): mean 0.25, concentration 8."""
    rng = np.random.default_rng(0)
    p = rng.beta(2.0, 6.0, size=4000)
    k = rng.binomial(30, p)
    state = tracker_update(tracker_init(4000), jnp.arange(4000), jnp.asarray(k), jnp.full(4000, 30))
    a0, b0 = (float(x) for x in fitted_prior(state))
    # Standard errors at this size are ~0.003 on the mean and ~0.3 on the concentration.
    assert abs(a0 / (a0 + b0) - 0.25) < 0.015
    assert abs((a0 + b0) - 8.0) < 1.5


def test_pilot():
    post = pilot_posterior(jnp.array([0, 2, 4]), 4)
    np.testing.assert_allclose(post.mean, [0.5 / 5, 2.5 / 5, 4.5 / 5])
    counts = np.asarray(pilot_allocate(jnp.array([0, 2, 4]), 4, 36, n_max=20))
    assert counts.sum() == 36 and counts.min() >= 4 and counts[0] > counts[1] > counts[2]


@pytest.mark.parametrize("bad", [float("nan"), 2.5, float("inf")])
def test_pass_at_k_refuses_counts_that_are_not_whole(bad):
    """A NaN cast to int64 is a huge negative count and 2.5 becomes 2: both are named instead."""
    with pytest.raises(ValueError, match=r"pass_at_k: c must be whole numbers.*\[(nan|2\.5|inf)\]"):
        pass_at_k(10, bad, 1)
    with pytest.raises(ValueError, match=r"pass_at_k: correct must be whole numbers"):
        mean_pass_at_k(10, np.array([3.0, bad]), [1, 2])
    np.testing.assert_allclose(pass_at_k(10.0, 2.0, 1), 0.2)  # whole floats are counts: 2 of 10 at k = 1
