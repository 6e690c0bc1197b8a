"""Prompt selection (MoPPS, GRESO): docs/allocators.md §4-5's hand examples and plain-loop references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core.allocation import BetaPosterior
from sera_jax.core.selection import (SkipState, greso_select, greso_skip_probability, greso_update,
                                     mopps_posterior, mopps_select, mopps_select_from_draws, skip_state_init)
from sera_jax.core.success_rates import tracker_init, tracker_update

# ---------------------------------------------------------------------------------------------------------
# MoPPS (§5)


def _mopps_reference(draws, num_select, target):
    """The P smallest (draw - target)^2 in float64, ties by index (lexsort: the last key is the primary one)."""
    distance = (np.asarray(draws, np.float64) - target) ** 2
    return np.lexsort((np.arange(len(distance)), distance))[:num_select]


def test_mopps_hand_example():
    """§5.5: distances [0.16, 0.0025, 0.04, 0.0004] select [3, 1], closest first."""
    idx = mopps_select_from_draws(np.array([0.10, 0.45, 0.70, 0.52], np.float32), 2)
    assert idx.dtype == jnp.int32
    np.testing.assert_array_equal(idx, [3, 1])
    np.testing.assert_array_equal(mopps_select_from_draws(np.array([0.10, 0.45, 0.70, 0.52], np.float32), 3,
                                                          target_rate=0.0), [0, 1, 3])


def test_mopps_ties_go_to_the_lower_index():
    draws = np.array([0.25, 0.75, 0.5, 0.5, 0.75], np.float32)  # dyadic: the distances tie exactly
    np.testing.assert_array_equal(mopps_select_from_draws(draws, 4), [2, 3, 0, 1])


def test_mopps_select_equals_the_rule_on_its_draws():
    rng = np.random.default_rng(0)
    num_candidates = 16  # one window shape: one compile of the Beta sampler
    for trial, (num_select, target) in enumerate([(1, 0.5), (5, 0.5), (16, 0.5), (5, 0.2), (9, 0.9)]):
        post = BetaPosterior(rng.uniform(0.3, 20, num_candidates).astype(np.float32),
                             rng.uniform(0.3, 20, num_candidates).astype(np.float32))
        key = jax.random.key(trial)
        idx = np.asarray(mopps_select(post, num_select, key, target_rate=target))
        draws = np.asarray(jax.random.beta(key, post.alpha, post.beta))
        np.testing.assert_array_equal(idx, _mopps_reference(draws, num_select, target))
        assert idx.dtype == np.int32 and len(set(idx.tolist())) == num_select


def test_mopps_keeps_the_prompts_believed_near_the_target():
    """Posteriors concentrated at 0.5 (indices 1, 4) beat ones concentrated at 0.05 / 0.95, whatever the key."""
    post = BetaPosterior(np.array([5, 5000, 9500, 500, 5000] + [9500] * 11, np.float32),  # 16: the shape above
                         np.array([95, 5000, 500, 9500, 5000] + [500] * 11, np.float32))
    for seed in range(3):
        assert sorted(np.asarray(mopps_select(post, 2, jax.random.key(seed))).tolist()) == [1, 4]
    # A different target: the 0.05 prompts are now the closest.
    assert sorted(np.asarray(mopps_select(post, 2, jax.random.key(0), target_rate=0.05)).tolist()) == [0, 3]


def _mopps_update(alpha, beta, k, n, lam):
    """MoPPS's published update (README; mopps.py PosteriorSampler.train)."""
    return lam * alpha + (1 - lam) * 1 + k, lam * beta + (1 - lam) * 1 + (n - k)


def test_mopps_posterior_hand_example():
    """§5.5: Beta(1, 1) with k = 3 of 8 (lambda = 1) is Beta(4, 6); then k = 2 of 8 (lambda = 0.5): Beta(4.5, 9.5)."""
    tracker = tracker_init(3)
    tracker = tracker_update(tracker, np.array([1]), np.array([3]), np.array([8]), decay=1.0)
    post = mopps_posterior(tracker, np.array([1, 0]))
    np.testing.assert_allclose(post.alpha, [4, 1])
    np.testing.assert_allclose(post.beta, [6, 1])
    tracker = tracker_update(tracker, np.array([1]), np.array([2]), np.array([8]), decay=0.5)
    post = mopps_posterior(tracker, np.array([1]))
    np.testing.assert_allclose(post.alpha, [4.5])
    np.testing.assert_allclose(post.beta, [9.5])


@pytest.mark.parametrize("lam", [1.0, 0.5, 0.9])
def test_decayed_tracker_equals_mopps_update(lam):
    """Random steps on a few prompts, only the selected ones updated: Beta(1 + s, 1 + f) is MoPPS's posterior."""
    rng = np.random.default_rng(int(lam * 10))
    num_keys, n = 6, 8
    alpha, beta = np.ones(num_keys), np.ones(num_keys)
    tracker = tracker_init(num_keys)
    for _ in range(5):
        keys = rng.choice(num_keys, size=3, replace=False)
        k = rng.integers(0, n + 1, size=3)
        for key, ki in zip(keys, k):
            alpha[key], beta[key] = _mopps_update(alpha[key], beta[key], ki, n, lam)
        tracker = tracker_update(tracker, keys, k, np.full(3, n), decay=lam)
    post = mopps_posterior(tracker, np.arange(num_keys))
    np.testing.assert_allclose(post.alpha, alpha, rtol=1e-6)
    np.testing.assert_allclose(post.beta, beta, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# GRESO (§4): references on the published traces (one group-mean reward per visit)

EASY_MEAN, HARD_MEAN = 0.98, 0.11  # the published thresholds; with K of n binary rewards: K = n / K = 0 (n < 10)


def _state_from_traces(traces, num_keys, n=8, p_easy=0.5, p_hard=0.5):
    """Replays each prompt's visits (successes out of n) through greso_update, one prompt per step, epoch 0."""
    state = skip_state_init(num_keys)
    for key, trace in enumerate(traces):
        for k in trace:
            state = greso_update(state, np.array([key]), np.array([k]), np.array([n]), epoch_started=False)
    return state._replace(p_easy=jnp.float32(p_easy), p_hard=jnp.float32(p_hard))


def _trailing(trace, predicate):
    z = 0
    for mean in reversed(trace):
        if not predicate(mean):
            break
        z += 1
    return z


def _skip_probability_reference(trace_means, p_easy, p_hard):
    """filter_examples_all_probabilistic's skip probability for one prompt, from its trace of group means."""
    z_e = _trailing(trace_means, lambda m: m >= EASY_MEAN)
    easy = 1.0 - max(p_easy ** z_e, 0.01) if z_e > 0 else 0.0
    last_hard = bool(trace_means) and trace_means[-1] <= HARD_MEAN
    z_h = _trailing(trace_means, lambda m: m <= HARD_MEAN)
    hard = 1.0 - max(p_hard ** z_h, 0.01) if last_hard else 0.0
    return easy + (1.0 - easy) * hard  # the hard rule only if not skipped as easy


def _greso_select_reference(probs, uniforms, num_select):
    """Walk the window in order: the first num_select survivors, filled with the skipped ones in window order."""
    survivors = [i for i in range(len(probs)) if not uniforms[i] < probs[i]]
    skipped = [i for i in range(len(probs)) if uniforms[i] < probs[i]]
    return sorted((survivors + skipped)[:num_select])


def _random_traces(rng, num_keys, n=8):
    """Visit histories mixing all-correct, all-wrong and mixed groups, long streaks included."""
    traces = []
    for _ in range(num_keys):
        length = int(rng.integers(0, 6))
        kind = rng.choice(["easy", "hard", "any"])
        pool = {"easy": [n, n, n, 4], "hard": [0, 0, 0, 3], "any": [0, 2, 5, n]}[kind]
        traces.append([int(rng.choice(pool)) for _ in range(length)])
    return traces


def test_greso_skip_probability_hand_example():
    """§4.5: trace means [0.5, 1, 1] -> z_e = 2, skip 0.75; [0, 0, 0] -> z_h = 3, 0.875; [0, 0, 0.25] -> 0."""
    state = _state_from_traces([[4, 8, 8], [0, 0, 0], [0, 0, 2], []], num_keys=4)
    np.testing.assert_array_equal(state.easy_streak, [2, 0, 0, 0])
    np.testing.assert_array_equal(state.hard_streak, [0, 3, 0, 0])
    np.testing.assert_allclose(greso_skip_probability(state, np.array([0, 1, 2, 3])), [0.75, 0.875, 0.0, 0.0],
                               rtol=1e-6)
    # A coin u = 0.3 < 0.75 skips prompt 0; u = 0.8 keeps it.
    np.testing.assert_array_equal(greso_select(state, np.array([0, 2]), 1, np.array([0.3, 0.5], np.float32)), [1])
    np.testing.assert_array_equal(greso_select(state, np.array([0, 2]), 1, np.array([0.8, 0.5], np.float32)), [0])
    # Skipped iff u < prob: a coin equal to the probability keeps the prompt.
    np.testing.assert_array_equal(greso_select(state, np.array([0, 2]), 1, np.array([0.75, 0.5], np.float32)), [0])


def test_greso_keep_probability_floor_and_easy_then_hard():
    """max(p^z, 0.01): 0.5^10 < 0.01 gives skip 0.99. A prompt easy then hard follows only its last streak."""
    state = _state_from_traces([[8] * 10, [8, 8, 0], [0, 0, 8]], num_keys=3)
    np.testing.assert_allclose(greso_skip_probability(state, np.array([0, 1, 2])), [0.99, 0.5, 0.5], rtol=1e-6)
    state = state._replace(p_easy=jnp.float32(0.8), p_hard=jnp.float32(0.6))
    np.testing.assert_allclose(greso_skip_probability(state, np.array([1, 2])), [0.4, 0.2], rtol=1e-6)


def test_greso_easy_rule_first_in_a_hand_made_state():
    """greso_update never leaves both streaks > 0; a hand-made state with both reads as easy (tried first)."""
    state = SkipState(np.array([2, 0], np.int32), np.array([3, 0], np.int32), jnp.float32(0.5), jnp.float32(0.5))
    np.testing.assert_allclose(greso_skip_probability(state, np.array([0, 1])), [0.75, 0.0], rtol=1e-6)


def test_greso_skip_probability_matches_the_trace_rule():
    rng = np.random.default_rng(1)
    for _ in range(4):
        traces = _random_traces(rng, 12)
        p_easy, p_hard = (float(x) for x in rng.choice([0.05, 0.3, 0.5, 0.77, 0.95], size=2))
        state = _state_from_traces(traces, 12, p_easy=p_easy, p_hard=p_hard)
        want = [_skip_probability_reference([k / 8 for k in t], p_easy, p_hard) for t in traces]
        np.testing.assert_allclose(greso_skip_probability(state, np.arange(12)), want, rtol=1e-5, atol=1e-7)


def test_greso_select_fills_with_the_earliest_skipped():
    """Window probs [0.75, 0, 0.875, 0.75, 0.75], coins skip all but candidate 1: keep it, fill with 0 then 2."""
    state = _state_from_traces([[8, 8], [4], [0, 0, 0], [8, 8], [8, 8]], num_keys=5)
    coins = np.array([0.1, 0.9, 0.1, 0.1, 0.1], np.float32)
    np.testing.assert_array_equal(greso_select(state, np.arange(5), 3, coins), [0, 1, 2])
    # Enough survivors: the first ones, in window order, and the later survivors are left out.
    coins = np.array([0.9, 0.9, 0.95, 0.1, 0.9], np.float32)
    np.testing.assert_array_equal(greso_select(state, np.arange(5), 3, coins), [0, 1, 2])
    np.testing.assert_array_equal(greso_select(state, np.arange(5), 2, coins), [0, 1])
    np.testing.assert_array_equal(greso_select(state, np.array([3, 4, 1, 0, 2]), 3, coins), [0, 1, 2])


def test_greso_select_matches_the_walk():
    rng = np.random.default_rng(2)
    for trial in range(16):
        num_keys = 16
        traces = _random_traces(rng, num_keys)
        p_easy, p_hard = (float(x) for x in rng.choice([0.05, 0.3, 0.5, 0.95], size=2))
        state = _state_from_traces(traces, num_keys, p_easy=p_easy, p_hard=p_hard)
        num_candidates = 10
        keys_C = rng.integers(0, num_keys, size=num_candidates)  # a window may repeat a prompt (another epoch)
        num_select = int(rng.integers(1, num_candidates + 1))
        probs = [_skip_probability_reference([k / 8 for k in traces[key]], p_easy, p_hard) for key in keys_C]
        coins = rng.uniform(size=num_candidates).astype(np.float32)
        if any(abs(float(c) - p) < 1e-5 for c, p in zip(coins, probs)):
            continue  # a float32 / float64 tie: either answer is right
        idx = np.asarray(greso_select(state, keys_C, num_select, coins))
        assert idx.dtype == np.int32 and len(set(idx.tolist())) == num_select
        np.testing.assert_array_equal(idx, _greso_select_reference(probs, coins, num_select), err_msg=str(trial))


def test_greso_select_with_a_key_draws_its_coins():
    state = _state_from_traces([[8, 8], [0], [8], [4], [0, 0]] * 4, num_keys=20)
    for key in (jax.random.key(3), jax.random.PRNGKey(4)):
        idx = greso_select(state, np.arange(20), 7, key)
        coins = jax.random.uniform(key, (20,), jnp.float32)
        np.testing.assert_array_equal(idx, greso_select(state, np.arange(20), 7, np.asarray(coins)))
        assert len(set(np.asarray(idx).tolist())) == 7


def _greso_update_reference(easy, hard, p_easy, p_hard, keys, successes, counts, epoch_started, alpha=0.25,
                            step=0.01, p_min=0.05, p_max=0.95):
    """The streak update and fit's adaptation in plain Python floats (ratios compared in float64)."""
    easy, hard = list(easy), list(hard)
    for key, k, n in zip(keys, successes, counts):
        easy[key] = easy[key] + 1 if k == n else 0
        hard[key] = hard[key] + 1 if k == 0 else 0
    if epoch_started:
        easy_ratio = sum(k == n for k, n in zip(successes, counts)) / len(keys)
        hard_ratio = sum(k == 0 for k in successes) / len(keys)
        p_easy = min(max(p_easy + (-step if easy_ratio >= alpha / 3 else step), p_min), p_max)
        p_hard = min(max(p_hard + (-step if hard_ratio >= 2 * alpha / 3 else step), p_min), p_max)
    return easy, hard, p_easy, p_hard


def test_greso_update_hand_example():
    """§4.5: easy share 0.10 >= 1/12 lowers p_e to 0.49; hard share 0.10 < 1/6 raises p_h to 0.51."""
    state = skip_state_init(10)
    successes = np.array([8, 0, 1, 2, 3, 4, 5, 6, 7, 4])
    new = greso_update(state, np.arange(10), successes, np.full(10, 8), epoch_started=True)
    np.testing.assert_allclose([new.p_easy, new.p_hard], [0.49, 0.51], rtol=1e-6)
    np.testing.assert_array_equal(new.easy_streak, [1] + [0] * 9)
    np.testing.assert_array_equal(new.hard_streak, [0, 1] + [0] * 8)
    assert new.easy_streak.dtype == jnp.int32 and new.p_easy.dtype == jnp.float32
    # In the first epoch only the streaks move.
    first = greso_update(state, np.arange(10), successes, np.full(10, 8), epoch_started=False)
    np.testing.assert_allclose([first.p_easy, first.p_hard], [0.5, 0.5])
    np.testing.assert_array_equal(first.easy_streak, new.easy_streak)
    # Exact ties count as reaching the target: 1 of 12 all correct is 1/12 = 0.25 / 3; 2 of 12 all wrong is 1/6.
    tie = greso_update(skip_state_init(12), np.arange(12), np.array([8, 0, 0] + [4] * 9), np.full(12, 8),
                       epoch_started=True)
    np.testing.assert_allclose([tie.p_easy, tie.p_hard], [0.49, 0.49], rtol=1e-6)
    # Clipped to [p_min, p_max].
    low = state._replace(p_easy=jnp.float32(0.055), p_hard=jnp.float32(0.945))
    clipped = greso_update(low, np.arange(10), successes, np.full(10, 8), epoch_started=True)
    np.testing.assert_allclose([clipped.p_easy, clipped.p_hard], [0.05, 0.95], rtol=1e-6)


@pytest.mark.parametrize("alpha", [0.25, 0.3])
def test_greso_update_matches_the_reference(alpha):
    rng = np.random.default_rng(int(alpha * 100))
    num_keys, num_groups, n = 20, 12, 8
    state = skip_state_init(num_keys)
    easy, hard, p_easy, p_hard = [0] * num_keys, [0] * num_keys, 0.5, 0.5
    for step in range(40):
        keys = rng.choice(num_keys, size=num_groups, replace=False)
        successes = rng.choice([0, n, 1, 4, n - 1], size=num_groups, p=[0.2, 0.15, 0.2, 0.25, 0.2])
        epoch_started = step >= 3
        state = greso_update(state, keys, successes, np.full(num_groups, n), epoch_started=epoch_started,
                             target_zero_variance=alpha)
        easy, hard, p_easy, p_hard = _greso_update_reference(easy, hard, p_easy, p_hard, keys, successes,
                                                             [n] * num_groups, epoch_started, alpha=alpha)
        np.testing.assert_array_equal(state.easy_streak, easy)
        np.testing.assert_array_equal(state.hard_streak, hard)
        np.testing.assert_allclose([state.p_easy, state.p_hard], [p_easy, p_hard], atol=1e-5)
        assert not np.any((np.asarray(state.easy_streak) > 0) & (np.asarray(state.hard_streak) > 0))


# ---------------------------------------------------------------------------------------------------------
# Under jit, and bad inputs


def test_selection_under_jit():
    state = _state_from_traces([[8, 8], [0], [8], [4], [0, 0], [], [8]], num_keys=7)
    keys_C, coins = np.arange(7), np.linspace(0.05, 0.95, 7).astype(np.float32)
    jitted = jax.jit(greso_select, static_argnums=2)
    np.testing.assert_array_equal(jitted(state, keys_C, 4, coins), greso_select(state, keys_C, 4, coins))
    np.testing.assert_array_equal(jitted(state, keys_C, 4, jax.random.key(0)),
                                  greso_select(state, keys_C, 4, jax.random.key(0)))

    def update(s, keys, k, epoch_started):
        return greso_update(s, keys, k, jnp.full(keys.shape, 8), epoch_started=epoch_started)
    for started in (False, True):
        got = jax.jit(update)(state, jnp.arange(5), jnp.array([8, 0, 0, 3, 8]), jnp.asarray(started))
        want = update(state, np.arange(5), np.array([8, 0, 0, 3, 8]), started)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)

    post = BetaPosterior(jnp.array([1.0, 2.0, 8.0, 3.0]), jnp.array([1.0, 6.0, 2.0, 3.0]))
    select = jax.jit(lambda p, key: mopps_select(p, 2, key))
    np.testing.assert_array_equal(select(post, jax.random.key(5)), mopps_select(post, 2, jax.random.key(5)))
    tracker = tracker_init(4)
    np.testing.assert_allclose(jax.jit(mopps_posterior)(tracker, jnp.arange(4)).alpha, np.ones(4))


def test_bad_inputs_name_the_argument():
    state = skip_state_init(4)
    draws = np.array([0.1, 0.5, 0.9], np.float32)
    with pytest.raises(ValueError, match="num_select"):
        mopps_select_from_draws(draws, 4)
    with pytest.raises(ValueError, match="num_select"):
        mopps_select_from_draws(draws, 0)
    with pytest.raises(ValueError, match="num_select"):
        mopps_select_from_draws(draws, 1.5)
    with pytest.raises(ValueError, match="draws_C"):
        mopps_select_from_draws(np.array([0.1, 1.5], np.float32), 1)
    with pytest.raises(ValueError, match="draws_C"):
        mopps_select_from_draws(np.ones((2, 2), np.float32), 1)
    with pytest.raises(ValueError, match="target_rate"):
        mopps_select_from_draws(draws, 1, target_rate=1.5)
    with pytest.raises(ValueError, match="alpha and beta"):
        mopps_select(BetaPosterior(np.array([1.0, 0.0]), np.array([1.0, 1.0])), 1, jax.random.key(0))
    with pytest.raises(ValueError, match="keys_C"):
        mopps_posterior(tracker_init(3), np.array([0, 3]))
    with pytest.raises(ValueError, match="keys_C"):
        greso_skip_probability(state, np.array([-1, 0]))
    with pytest.raises(ValueError, match="keys_C"):
        greso_select(state, np.array([0.0, 1.0]), 1, jax.random.key(0))
    with pytest.raises(ValueError, match="num_select"):
        greso_select(state, np.arange(4), 5, jax.random.key(0))
    with pytest.raises(ValueError, match="key_or_uniforms"):
        greso_select(state, np.arange(4), 2, np.full(3, 0.5, np.float32))
    with pytest.raises(ValueError, match="key_or_uniforms"):
        greso_select(state, np.arange(4), 2, np.array([0.1, 0.2, 0.3, 1.2], np.float32))
    with pytest.raises(ValueError, match="keys_P"):
        greso_update(state, np.array([0, 0]), np.array([1, 1]), np.array([2, 2]), epoch_started=True)
    with pytest.raises(ValueError, match="successes_P"):
        greso_update(state, np.array([0, 1]), np.array([3, 1]), np.array([2, 2]), epoch_started=True)
    with pytest.raises(ValueError, match="counts_P"):
        greso_update(state, np.array([0, 1]), np.array([0, 1]), np.array([2, 2, 2]), epoch_started=True)
    with pytest.raises(ValueError, match="counts_P"):
        greso_update(state, np.array([0, 1]), np.array([0, 0]), np.array([0, 2]), epoch_started=True)
    with pytest.raises(ValueError, match="p_min"):
        greso_update(state, np.array([0]), np.array([1]), np.array([2]), epoch_started=True, p_min=0.9, p_max=0.1)
    with pytest.raises(ValueError, match="step_size"):
        greso_update(state, np.array([0]), np.array([1]), np.array([2]), epoch_started=True, step_size=-0.1)
    with pytest.raises(ValueError, match="num_keys"):
        skip_state_init(0)
    assert isinstance(state, SkipState)
