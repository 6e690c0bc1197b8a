"""Scale factors against exact enumeration over a small softmax policy (docs/method.md §2)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.experimental import checkify

from sera_jax.core import (BetaPosterior, advantages, effective_prompt_weights, expected_scale_factor, loss_weights,
                           posterior_scale_factor, scale_factor)
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
    with pytest.raises(ValueError, match="max_n"):
        jax.jit(lambda n: scale_factor(jnp.array([0.5]), n, "grpo"))(jnp.array([3]))


def test_traced_bad_probabilities_are_refused_readably_under_checkify():
    """Under jit a bad p cannot raise mid-program; checkify reports the eager message, not an XLA callback error."""
    f = checkify.checkify(jax.jit(lambda p: scale_factor(p, 4)))
    f(jnp.array([0.5]))[0].throw()
    with pytest.raises(checkify.JaxRuntimeError, match="p must be probabilities in") as raised:
        f(jnp.array([jnp.nan]))[0].throw()
    assert "INTERNAL" not in str(raised.value) and "Callback" not in str(raised.value)


# -- no rollouts: s(p, 0) = 0 ------------------------------------------------------------------------------


def _batch_expected_gradients(logits_PxV, counts_P, estimator, correction):
    """``E[-dL/dlogits]`` of the flat-batch loss ``L = -sum_b w_b A_b log pi(y_b)``, by summing over every outcome
    of every row (V^B sequences): each prompt's row of the result is what the batch's gradient puts on that
    prompt's logits. The layout, advantages and weights are the public functions; the expectation is enumerated."""
    import itertools
    num_prompts, num_outcomes = logits_PxV.shape
    pi_PxV = np.stack([enumeration.softmax(row) for row in logits_PxV])
    ids_B = np.repeat(np.arange(num_prompts), counts_P)
    seqs_YxB = np.array(list(itertools.product(range(num_outcomes), repeat=len(ids_B))))
    probs_Y = np.prod(pi_PxV[ids_B, seqs_YxB], axis=1)
    rewards_YxB = SUCCESS[seqs_YxB].astype(np.float64)
    ids = jnp.asarray(ids_B, jnp.int32)
    adv_YxB = np.asarray(jax.vmap(lambda r: advantages(r, ids, num_prompts, estimator))(jnp.asarray(rewards_YxB)))
    w_B = np.asarray(loss_weights(ids, num_prompts, correction=correction, dtype=jnp.float64))
    scores_YxBxV = np.eye(num_outcomes)[seqs_YxB] - pi_PxV[ids_B]  # d log pi(y_b) / d logits of b's prompt
    grads_YxPxV = np.zeros((len(seqs_YxB), num_prompts, num_outcomes))
    for b, i in enumerate(ids_B):
        grads_YxPxV[:, i] += (w_B[b] * adv_YxB[:, b])[:, None] * scores_YxBxV[:, b]
    return np.einsum("y,ypv->pv", probs_Y, grads_YxPxV)


@pytest.mark.parametrize("estimator", ESTIMATOR_NAMES)
@pytest.mark.parametrize("correction", [True, False])
def test_a_prompt_without_rollouts_contributes_nothing(estimator, correction, x64):
    """Counts [0, 2, 3]: the batch's expected gradient, enumerated, is ``w_i s(p_i, N_i) grad log p_i`` with
    ``w_i s_i = effective_prompt_weights(scale_factor(p, N), N)``, and the prompt with no rollouts gets 0."""
    logits_PxV = np.stack(POLICIES)
    counts_P = np.array([0, 2, 3])
    expected_PxV = _batch_expected_gradients(logits_PxV, counts_P, estimator, correction)
    p_and_grads = [enumeration.policy_p_and_grad_log_p(row, SUCCESS) for row in logits_PxV]
    p_P = jnp.asarray([p for p, _ in p_and_grads])
    s_P = scale_factor(p_P, jnp.asarray(counts_P), estimator)
    weights_P = np.asarray(effective_prompt_weights(s_P, jnp.asarray(counts_P), correction=correction))
    np.testing.assert_allclose(expected_PxV, weights_P[:, None] * np.stack([g for _, g in p_and_grads]),
                               rtol=1e-9, atol=1e-12)
    assert np.asarray(s_P)[0] == 0.0 and weights_P[0] == 0.0 and not np.any(expected_PxV[0])


def test_zero_rollouts_are_zero_everywhere_p_and_n_can_be():
    """Every estimator, p in [0, 1] (p = 1 included: maxrl's closed form at n = 0 would be 1 - 1/0), eagerly,
    unchecked (the analyses pass check=False), under jit with traced counts, and with a finite gradient in p."""
    p = jnp.linspace(0.0, 1.0, 11)
    for estimator in ESTIMATOR_NAMES:
        for check in (True, False):
            assert np.all(np.asarray(scale_factor(p, 0, estimator, check=check)) == 0.0), (estimator, check)
    for estimator in ("maxrl", "grpo"):  # the closed form and the binomial sum
        jitted = jax.jit(lambda p, n: scale_factor(p, n, estimator, max_n=4, check=False))
        np.testing.assert_array_equal(jitted(p[-3:], jnp.array([0, 0, 4]))[:2], [0.0, 0.0])
    grad = jax.grad(lambda p: jnp.sum(scale_factor(p, jnp.array([0, 3, 0]), "maxrl")))(jnp.array([0.5, 0.5, 0.999]))
    np.testing.assert_allclose(grad, [0.0, 2 * 0.5, 0.0], rtol=1e-6)  # d/dp (1 - (1-p)^2) = 2 (1 - p)


def test_the_continuous_relaxation_runs_from_zero_then_one_rollout_up():
    """s is defined at n = 0 (0) and for real n >= 1; between them there is no group to estimate from (maxrl's
    closed form would go negative there): refused. On {0} U [1, inf) the factor never decreases."""
    p = jnp.asarray([0.05, 0.5, 0.95])
    n = jnp.asarray([0.0, 1.0, 1.25, 1.5, 2.0, 3.5, 8.0])
    for estimator in ("maxrl", "maxrl_no_baseline", "rloo", "reinforce"):
        s = np.asarray(scale_factor(p[:, None], n[None, :], estimator))
        assert np.all(s[:, 0] == 0.0) and np.all(np.diff(s, axis=1) >= 0), estimator
    np.testing.assert_allclose(scale_factor(p, 1.5, "maxrl_no_baseline"), 1 - (1 - np.asarray(p)) ** 1.5, rtol=1e-6)
    for bad in (0.5, 1e-3, -1, -0.5):
        for estimator in ESTIMATOR_NAMES:
            with pytest.raises(ValueError, match=r"rollout counts n must be 0 \(no rollouts\) or >= 1"):
                scale_factor(p, bad, estimator)
    with pytest.raises(ValueError, match="integer rollout counts"):
        scale_factor(p, 1.5, "grpo")


def test_posterior_factors_of_zero_rollouts_are_zero():
    """E[s(p, 0)] = 0 under any belief, on every code path and in both posterior functions; n in (0, 1) refused."""
    post = BetaPosterior(jnp.asarray([0.5, 2.0, 0.7]), jnp.asarray([0.5, 3.0, 0.4]))  # b < 1: betaln(a, b - 1) is NaN
    for estimator in ("maxrl", "maxrl_no_baseline", "grpo"):  # both power laws; the Beta-binomial sum (rloo's too)
        s = np.asarray(posterior_scale_factor(post, jnp.asarray([0, 3, 0]), estimator))
        assert s[0] == 0.0 and s[2] == 0.0 and s[1] > 0.0, estimator
    np.testing.assert_array_equal(expected_scale_factor(post, 0), 0.0)
    np.testing.assert_array_equal(expected_scale_factor(post, 0, offset=0), 0.0)
    for bad in (0.5, -1):
        with pytest.raises(ValueError, match=r"rollout counts n must be 0 \(no rollouts\) or >= 1"):
            posterior_scale_factor(post, bad)
        with pytest.raises(ValueError, match=r"rollout counts n must be 0 \(no rollouts\) or >= 1"):
            expected_scale_factor(post, bad)


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
    with pytest.raises(ValueError, match=r"n must be 0 \(no rollouts\) or >= 1"):
        posterior_scale_factor(post, -2)
    with pytest.raises(ValueError, match="max_n"):
        jax.jit(lambda n: posterior_scale_factor(post, n, "grpo"))(n)
