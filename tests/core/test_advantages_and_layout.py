"""Advantages on the flat layout against hand-computed groups; layout helpers."""

import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import (advantages, counts_from_prompt_ids, prompt_ids_from_counts, rank_within_prompt,
                           segment_mean, segment_sum)

# Two prompts, interleaved (non-contiguous) rows: prompt 0 has rewards [1, 0, 0, 1], prompt 1 [0, 0, 0].
REWARDS = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
IDS = jnp.array([0, 1, 0, 1, 0, 0, 1])


def test_maxrl_by_hand():
    # prompt 0: N=4, K=2, rbar=1/2: success (1-1/2)/(1/2) = 1, failure (0-1/2)/(1/2) = -1; prompt 1: K=0 -> 0.
    np.testing.assert_allclose(advantages(REWARDS, IDS, 2, "maxrl"), [1, 0, -1, 0, -1, 1, 0])


def test_maxrl_by_hand_at_other_success_fractions():
    # A = (r - K/N) / (K/N): success N/K - 1, failure -1. Prompt 0: K/N = 1/3 -> 2, -1; prompt 1: 4/5 -> 1/4, -1;
    # prompt 2: 1/4 -> 3, -1 (a denominator of N, N - 1 or K + 1 instead of K gives other values at each).
    rewards = jnp.array([1.0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1])
    ids = jnp.array([0, 1, 2, 0, 0, 1, 1, 1, 2, 1, 2, 2, 3])  # prompt 3: N = 1, K = 1 -> 0 (all success)
    np.testing.assert_allclose(advantages(rewards, ids, 4, "maxrl"),
                               [2, 0.25, 3, -1, -1, 0.25, -1, 0.25, -1, 0.25, -1, -1, 0], rtol=1e-5)


def test_maxrl_no_baseline_by_hand():
    np.testing.assert_allclose(advantages(REWARDS, IDS, 2, "maxrl_no_baseline"), [2, 0, 0, 0, 0, 2, 0])


def test_grpo_by_hand():
    std = np.sqrt(2 * 2 / (4 * 3))  # unbiased std of [1, 0, 0, 1]
    a = 0.5 / (std + 1e-6)
    np.testing.assert_allclose(advantages(REWARDS, IDS, 2, "grpo"), [a, 0, -a, 0, -a, a, 0], rtol=1e-6)


def test_rloo_and_reinforce_by_hand():
    # RLOO: success 1 - 1/3, failure 0 - 2/3.
    np.testing.assert_allclose(advantages(REWARDS, IDS, 2, "rloo"), [2 / 3, 0, -2 / 3, 0, -2 / 3, 2 / 3, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(advantages(REWARDS, IDS, 2, "reinforce"), REWARDS)


def test_all_success_group_has_zero_maxrl_advantage():
    np.testing.assert_allclose(advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1), 0.0)


def test_integer_rewards_and_bad_shapes():
    assert advantages(jnp.array([1, 0]), jnp.array([0, 0]), 1).dtype == jnp.float32
    with pytest.raises(ValueError, match="shape \\(B,\\)"):
        advantages(jnp.ones(3), jnp.zeros(4, jnp.int32), 1)
    with pytest.raises(ValueError, match="unknown estimator"):
        advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1, "dpo")


def test_layout_helpers():
    counts = jnp.array([3, 1, 2])
    ids = prompt_ids_from_counts(counts, 6)
    np.testing.assert_array_equal(ids, [0, 0, 0, 1, 2, 2])
    np.testing.assert_array_equal(counts_from_prompt_ids(ids, 3), counts)
    np.testing.assert_array_equal(rank_within_prompt(ids, 3), [0, 1, 2, 0, 0, 1])
    values = jnp.arange(6.0)
    np.testing.assert_allclose(segment_sum(values, ids, 3), [3, 3, 9])
    np.testing.assert_allclose(segment_mean(values, ids, 3), [1, 3, 4.5])


@pytest.mark.parametrize("estimator", ["maxrl", "grpo", "rloo", "maxrl_no_baseline", "reinforce"])
def test_counted_rows_make_the_group_statistics(estimator):
    """``rows_B``: K_i and N_i from the counted rows only (PODS's advantages on the kept rollouts), equal to the
    advantages of those rows alone; rows outside get f(r, K_i, N_i) of their prompt's counted rows."""
    rng = np.random.default_rng(1)
    ids = rng.permutation(np.repeat(np.arange(4), [5, 4, 6, 3]))
    rewards = (rng.random(ids.size) < 0.5).astype(np.float32)
    counted = rng.random(ids.size) < 0.7
    for i in range(4):  # every prompt keeps a success and a failure, so no estimator meets an empty group
        first = np.flatnonzero(ids == i)[:2]
        rewards[first], counted[first] = [1.0, 0.0], True
    got = np.asarray(advantages(jnp.asarray(rewards), jnp.asarray(ids), 4, estimator,
                                rows_B=jnp.asarray(counted, jnp.float32)))
    rows = np.flatnonzero(counted)
    want = np.asarray(advantages(jnp.asarray(rewards[rows]), jnp.asarray(ids[rows]), 4, estimator))
    np.testing.assert_allclose(got[rows], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(advantages(jnp.asarray(rewards), jnp.asarray(ids), 4, estimator,
                                                     rows_B=jnp.ones(ids.size))),
                               np.asarray(advantages(jnp.asarray(rewards), jnp.asarray(ids), 4, estimator)), rtol=1e-6)


# -- bad layouts are refused where they enter -------------------------------------------------------------------


@pytest.mark.parametrize("counts, total, match", [
    ([3, 3], 8, r"counts_P must sum to total = 8 \(the flat layout's rows\); they sum to 6"),
    ([5, 5], 8, r"counts_P must sum to total = 8 \(the flat layout's rows\); they sum to 10"),
    ([3, -1], 2, r"counts_P must be >= 0 \(rollouts per prompt\); got \[-1\]"),
    ([1.5, 0.5], 2, "counts_P must be an integer array"),
    ([[1, 1]], 2, r"counts_P must have shape \(P,\)"),
    ([1, 1], 2.0, "total must be a static Python integer"),
])
def test_prompt_ids_from_counts_refuses_counts_that_are_not_the_layout(counts, total, match):
    with pytest.raises(ValueError, match=match):
        prompt_ids_from_counts(jnp.asarray(counts), total)


@pytest.mark.parametrize("estimator", ["maxrl", "maxrl_no_baseline", "grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("bad", [2.0, 0.5, -1.0, float("nan")])
def test_advantages_refuse_rewards_that_are_not_binary(estimator, bad):
    rewards = jnp.asarray([1.0, 0.0, bad, 0.0])
    with pytest.raises(ValueError, match=rf"rewards_B must be binary \(0 or 1\) for estimator '{estimator}'"):
        advantages(rewards, jnp.asarray([0, 0, 1, 1]), 2, estimator)


@pytest.mark.parametrize("ids", [[0, 0, 1, 2], [0, -1, 1, 1]])
def test_flat_layout_functions_refuse_prompt_ids_outside_the_prompts(ids):
    ids = jnp.asarray(ids)
    match = r"prompt_ids_B must lie in \[0, num_prompts\) = \[0, 2\)"
    for call in (lambda: advantages(jnp.asarray([1.0, 0, 0, 1]), ids, 2),
                 lambda: counts_from_prompt_ids(ids, 2), lambda: segment_sum(jnp.ones(4), ids, 2),
                 lambda: segment_mean(jnp.ones(4), ids, 2), lambda: rank_within_prompt(ids, 2)):
        with pytest.raises(ValueError, match=match):
            call()


def test_flat_layout_functions_refuse_bad_prompt_counts_and_shapes():
    ids = jnp.asarray([0, 0, 1])
    for num_prompts, match in ((0, "num_prompts must be >= 1"), (2.0, "num_prompts must be a static Python integer")):
        for call in (lambda: advantages(jnp.ones(3), ids, num_prompts), lambda: segment_sum(jnp.ones(3), ids, num_prompts),
                     lambda: counts_from_prompt_ids(ids, num_prompts)):
            with pytest.raises(ValueError, match=match):
                call()
    with pytest.raises(ValueError, match="prompt_ids_B must be an integer array"):
        segment_sum(jnp.ones(3), jnp.asarray([0.0, 0, 1]), 2)
    with pytest.raises(ValueError, match=r"values_B must have B = 3 rows like prompt_ids_B"):
        segment_mean(jnp.ones(4), ids, 2)
    with pytest.raises(ValueError, match=r"rows_B must be a 0/1 mask"):
        advantages(jnp.ones(3), ids, 2, rows_B=jnp.asarray([1.0, 0.5, 1.0]))
    for ids in ([0, 1, 0], [1, 1, 0]):  # interleaved, or grouped out of prompt order: both gave wrong ranks
        with pytest.raises(ValueError, match=r"prompt_ids_B must be non-decreasing .*; row 2 has prompt 0 after "
                                             r"prompt 1"):
            rank_within_prompt(jnp.asarray(ids), 2)
