"""Scale factors against exact enumeration over a small softmax policy (SERA.md §2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import advantages, scale_factor
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
