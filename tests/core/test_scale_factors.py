"""Scale factors against exact enumeration over a small softmax policy (docs/method.md §2)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import BetaPosterior, advantages, posterior_scale_factor, scale_factor
from sera_jax.core.estimators import ESTIMATORS
from tests.core import enumeration

ESTIMATOR_NAMES = sorted(ESTIMATORS)
# Three outcomes, the first one succeeds; logits chosen so p spans hard to easy prompts.
POLICIES = [np.array([-2.5, 0.3, 0.0]), np.array([0.0, 0.2, -0.4]), np.array([1.8, -0.5, 0.1])]
SUCCESS = np.array([True, False, False])


def _group_advantages(estimator):
    """Advantages of many single-prompt groups at once, through the public flat-layout function."""
    def one_group(rewards_N):
        return advantages(rewards_N, jnp.zeros(rewards_N.shape[0], jnp.int32), 1, estimator)
    return lambda rewards_YxN: np.asarray(jax.vmap(one_group)(jnp.asarray(rewards_YxN)))


@pytest.mark.parametrize("estimator", ESTIMATOR_NAMES)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_expected_gradient_is_scale_times_grad_log_p(estimator, n, x64):
    if estimator == "rloo" and n == 1:
        pytest.skip("RLOO needs a leave-one-out baseline")
    for logits in POLICIES:
        p, grad_log_p = enumeration.policy_p_and_grad_log_p(logits, SUCCESS)
        expected = enumeration.expected_estimator_gradient(logits, SUCCESS, n, _group_advantages(estimator))
        s = float(scale_factor(jnp.float64(p), n, estimator))
        np.testing.assert_allclose(expected, s * grad_log_p, rtol=1e-9, atol=1e-12)


def test_enumeration_distinguishes_estimators(x64):
    """The enumeration check can fail: maxrl's factor is not maxrl_no_baseline's."""
    logits = POLICIES[0]
    p, grad_log_p = enumeration.policy_p_and_grad_log_p(logits, SUCCESS)
    expected = enumeration.expected_estimator_gradient(logits, SUCCESS, 3, _group_advantages("maxrl"))
    wrong = float(scale_factor(jnp.float64(p), 3, "maxrl_no_baseline"))
    assert np.max(np.abs(expected - wrong * grad_log_p)) > 1e-3


@pytest.mark.parametrize("n", [1, 2, 4, 16, 128])
def test_closed_forms(n, x64):
    p = jnp.linspace(0.0, 1.0, 41)
    q = 1.0 - np.asarray(p)
    np.testing.assert_allclose(scale_factor(p, n, "maxrl"), 1 - q ** (n - 1), atol=1e-14)
    np.testing.assert_allclose(scale_factor(p, n, "maxrl_no_baseline"), 1 - q**n, atol=1e-14)
    np.testing.assert_allclose(scale_factor(p, n, "reinforce"), p, atol=0)


def test_exact_at_boundaries():
    for est in ESTIMATOR_NAMES:
        s0 = scale_factor(jnp.zeros(3), jnp.array([2, 3, 8]), est)
        assert np.all(np.asarray(s0) == 0.0), est
    np.testing.assert_array_equal(scale_factor(jnp.ones(3), jnp.array([2, 3, 8]), "maxrl"), 1.0)
    np.testing.assert_array_equal(scale_factor(jnp.ones(2), jnp.array([1, 4]), "maxrl_no_baseline"), 1.0)
    np.testing.assert_array_equal(scale_factor(jnp.float32(0.3), 1, "maxrl"), 0.0)  # N = 1: no gradient


def test_small_p_keeps_relative_precision():
    """1 - (1-p)^m for tiny p is ~ m p: no cancellation to 0 in float32."""
    s = scale_factor(jnp.float32(1e-7), 11, "maxrl")
    np.testing.assert_allclose(s, 1e-6, rtol=1e-5)


def test_dtype_broadcast_and_jit(x64):
    p64 = jnp.array([[0.1], [0.7]])
    n = jnp.array([2, 5, 9])
    s = scale_factor(p64, n, "grpo")
    assert s.shape == (2, 3) and s.dtype == jnp.float64
    s32 = scale_factor(p64.astype(jnp.float32), n, "grpo")
    assert s32.dtype == jnp.float32
    jitted = jax.jit(lambda p, n: scale_factor(p, n, "grpo", max_n=9))(p64, n)
    np.testing.assert_allclose(jitted, s, rtol=1e-12)


def test_grpo_factor_increases_with_n(x64):
    """Allocation by greedy is optimal only for factors non-decreasing in N: true for GRPO on a grid."""
    p = jnp.linspace(0.0, 1.0, 101)[:, None]
    n = jnp.arange(1, 129)[None, :]
    s = np.asarray(scale_factor(p, n, "grpo"))
    assert np.all(np.diff(s, axis=1) >= -1e-12)


@pytest.mark.parametrize("bad, message", [
    (jnp.array([0.2, jnp.nan]), "NaN"), (jnp.array([-0.1]), "below 0"), (jnp.array([1.5]), "above 1")])
def test_bad_probabilities(bad, message):
    with pytest.raises(ValueError, match=message):
        scale_factor(bad, 4)


def test_bad_estimator_and_counts():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        scale_factor(jnp.array([0.5]), 4, "ppo")
    with pytest.raises(ValueError, match="n must be >= 1"):
        scale_factor(jnp.array([0.5]), 0)
    with pytest.raises(ValueError, match="max_n"):
        jax.jit(lambda n: scale_factor(jnp.array([0.5]), n, "grpo"))(jnp.array([3]))


def test_traced_bad_probabilities_raise_at_run_time():
    f = jax.jit(lambda p: scale_factor(p, 4))
    f(jnp.array([0.5]))
    with pytest.raises(Exception, match="NaN"):
        jax.block_until_ready(f(jnp.array([jnp.nan])))


# -- posterior-expected factors E[s(p, N)] under p ~ Beta(a, b) ---------------------------------------------

# Beliefs after pilots and histories: Jeffreys after 0/4, 2/4, 4/4 successes, a flat prior, a sharp belief.
ALPHAS = np.array([0.5, 2.5, 4.5, 1.0, 30.0])
BETAS = np.array([4.5, 2.5, 0.5, 1.0, 70.0])


def _log_beta(a, b):
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


NS = np.array([2, 3, 5, 17, 64])


def test_posterior_factor_closed_forms(x64):
    """E[1 - (1-p)^m] = 1 - B(a, b+m)/B(a, b) (maxrl m = N-1, maxrl_no_baseline m = N); E[p] = a/(a+b) (rloo)."""
    post = BetaPosterior(jnp.asarray(ALPHAS)[:, None], jnp.asarray(BETAS)[:, None])
    for estimator, offset in (("maxrl", 1), ("maxrl_no_baseline", 0)):
        exact = [[1.0 - math.exp(_log_beta(a, b + n - offset) - _log_beta(a, b)) for n in NS]
                 for a, b in zip(ALPHAS, BETAS)]
        # jax.scipy.special.betaln is accurate to ~5e-7 in float64 (a float32-tuned series): hence atol.
        np.testing.assert_allclose(posterior_scale_factor(post, NS[None, :], estimator), exact, rtol=0, atol=2e-6)
    for estimator in ("rloo", "reinforce"):  # through the Beta-binomial sum: no closed form is used for them
        np.testing.assert_allclose(posterior_scale_factor(post, NS[None, :], estimator),
                                   np.broadcast_to((ALPHAS / (ALPHAS + BETAS))[:, None], (5, len(NS))), atol=2e-6)


def test_beta_binomial_sum_equals_the_closed_form(x64):
    """The general sum (used for grpo) and the power-law closed form are two code paths for one number."""
    from sera_jax.core.scale_factors import beta_binomial_scale_factor
    a, b = jnp.asarray(ALPHAS)[:, None], jnp.asarray(BETAS)[:, None]
    n = jnp.arange(2, 41)[None, :]
    for estimator in ("maxrl", "maxrl_no_baseline"):
        general = beta_binomial_scale_factor(a, b, n, ESTIMATORS[estimator].advantage, 40)
        np.testing.assert_allclose(general, posterior_scale_factor(BetaPosterior(a, b), n, estimator), atol=2e-6)


def test_posterior_factor_against_monte_carlo(x64):
    """Monte Carlo over p ~ Beta of the binomial sum written out in NumPy/SciPy (independent of the code):
    ``s(p, N) = sum_k Binom(k; N, p) [(k/N) f(1,k,N) - ((N-k)/N) (p/(1-p)) f(0,k,N)]``; the exact value must lie
    in the mean's 99.99% interval (4.4 standard errors), for every estimator, belief and N."""
    from scipy import stats
    rng = np.random.default_rng(0)
    ns = np.array([2, 4, 9])
    post = BetaPosterior(jnp.asarray(ALPHAS)[:, None], jnp.asarray(BETAS)[:, None])
    for estimator in ESTIMATOR_NAMES:
        f = ESTIMATORS[estimator].advantage
        got = np.asarray(posterior_scale_factor(post, ns[None, :], estimator))
        for i, (a, b) in enumerate(zip(ALPHAS, BETAS)):
            p = np.minimum(rng.beta(a, b, 20_000), 1 - 1e-12)[:, None]
            for j, n in enumerate(ns):
                k = np.arange(n + 1, dtype=np.float64)[None, :]
                pmf = stats.binom.pmf(k, n, p)
                nn = np.full_like(k, n)
                terms = (k / n * np.asarray(f(np.ones_like(k), k, nn))
                         - (n - k) / n * p / (1 - p) * np.asarray(f(np.zeros_like(k), k, nn)))
                x = np.sum(pmf * terms, axis=1)
                se = x.std(ddof=1) / math.sqrt(x.size)
                assert abs(x.mean() - got[i, j]) < 4.4 * se + 1e-9, (estimator, n, i, x.mean(), got[i, j], se)


def test_posterior_factor_against_quadrature_of_the_point_factor(x64):
    """E[s(p, N)] = int s(p, N) Beta(p; a, b) dp, by Gauss-Jacobi quadrature (exact for the polynomial s)."""
    from scipy import special
    post = BetaPosterior(jnp.asarray(ALPHAS), jnp.asarray(BETAS))
    for estimator in ("grpo", "maxrl"):
        got = np.asarray(posterior_scale_factor(post, 7, estimator))
        for i, (a, b) in enumerate(zip(ALPHAS, BETAS)):
            # Weight (1-x)^(b-1) (1+x)^(a-1) on [-1, 1]; p = (1+x)/2. 40 nodes: exact up to degree 79.
            x, w = special.roots_jacobi(40, b - 1, a - 1)
            s = np.asarray(scale_factor(jnp.asarray((1 + x) / 2), 7, estimator))
            np.testing.assert_allclose(got[i], np.sum(w * s) / np.sum(w), atol=2e-6)


def test_posterior_factor_is_below_the_plug_in_for_a_failed_pilot():
    """0 of 4 pilot successes: p_hat = 0.1 and s(0.1, 32) = 0.96, but E[s] = 1 - B(.5, 35.5)/B(.5, 4.5) = 0.65."""
    post = BetaPosterior(jnp.array([0.5]), jnp.array([4.5]))
    plug_in = float(scale_factor(post.mean, 32)[0])
    expected = float(posterior_scale_factor(post, 32)[0])
    np.testing.assert_allclose(plug_in, 1 - 0.9**31, rtol=1e-5)
    np.testing.assert_allclose(expected, 1 - math.exp(_log_beta(0.5, 35.5) - _log_beta(0.5, 4.5)), rtol=1e-5)
    assert expected < plug_in - 0.25


def test_posterior_factor_jit_dtype_and_errors(x64):
    post = BetaPosterior(jnp.array([0.5, 3.0]), jnp.array([2.5, 1.0]))
    n = jnp.array([3, 8])
    jitted = jax.jit(lambda a, b, n: posterior_scale_factor(BetaPosterior(a, b), n, "grpo", max_n=8))(*post, n)
    np.testing.assert_allclose(jitted, posterior_scale_factor(post, n, "grpo"), rtol=1e-12)
    f32 = BetaPosterior(post.alpha.astype(jnp.float32), post.beta.astype(jnp.float32))
    assert posterior_scale_factor(f32, n).dtype == jnp.float32
    with pytest.raises(ValueError, match="finite and > 0"):
        posterior_scale_factor(BetaPosterior(jnp.array([0.0]), jnp.array([1.0])), 4)
    with pytest.raises(ValueError, match="n must be >= 1"):
        posterior_scale_factor(post, 0)
    with pytest.raises(ValueError, match="max_n"):
        jax.jit(lambda n: posterior_scale_factor(post, n, "grpo"))(n)
