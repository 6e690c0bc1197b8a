"""The frozen per-epoch discounted Beta estimator (core.epoch_history): a hand-computed trace, the frozen-within-epoch
and evidence rules, epoch advancing and resumption, jit, and a dict-based restatement of the released class
(ChenZihao0121/SERA @ 3252ed5, ``HistoricalSuccessEstimator``) on random multi-epoch traces."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.core import epoch_history as eh

NAN = float("nan")

# Jitted wrappers (static arguments by name): the public functions must also run inside a caller's jit.
JITTED = {
    "start_epoch": jax.jit(eh.epoch_history_start_epoch, static_argnames=("prior", "discount")),
    "record": jax.jit(eh.epoch_history_record),
    "lookup": jax.jit(eh.epoch_history_lookup),
    "all_known": jax.jit(eh.epoch_history_all_known),
    "advance": jax.jit(eh.epoch_history_advance, static_argnames=("steps_per_epoch", "prior", "discount")),
}
EAGER = {
    "start_epoch": eh.epoch_history_start_epoch,
    "record": eh.epoch_history_record,
    "lookup": eh.epoch_history_lookup,
    "all_known": eh.epoch_history_all_known,
    "advance": eh.epoch_history_advance,
}


@pytest.fixture(params=["eager", "jit"])
def ops(request):
    return EAGER if request.param == "eager" else JITTED


def _record(ops, state, keys, successes, counts):
    return ops["record"](state, jnp.asarray(keys, jnp.int32), jnp.asarray(successes, jnp.float32),
                         jnp.asarray(counts, jnp.int32))


def _means(ops, state, num_keys=3):
    p_hat, known = ops["lookup"](state, jnp.arange(num_keys, dtype=jnp.int32))
    return np.asarray(p_hat, np.float64), np.asarray(known)


def _assert_means(actual, expected):
    actual = np.where(np.asarray(actual) == eh.UNKNOWN, np.nan, actual)  # the state's marker of "no estimate"
    np.testing.assert_allclose(actual, np.asarray(expected, np.float64), rtol=1e-6, atol=0, equal_nan=True)


def _states_equal(a: eh.EpochHistoryState, b: eh.EpochHistoryState):
    for name in eh.EpochHistoryState._fields:
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)


# ---------------------------------------------------------------------------------------------------------
# The hand-computed trace (prior Beta(0.5, 0.5), discount 0.75, 3 prompts).


def _two_epoch_trace(ops):
    """Epoch 0: key 0 3 of 4, key 1 0 of 4. Epoch 1: key 0 1 of 2, key 2 2 of 2. Returns lookups along the way."""
    seen = {}
    state = eh.epoch_history_init(3)
    assert int(state.epoch) == -1
    state = ops["start_epoch"](state)  # -> epoch 0: the first call promotes nothing
    seen["epoch0_start"] = _means(ops, state)
    state = _record(ops, state, [0, 1], [3, 0], [4, 4])
    seen["epoch0_after_record"] = _means(ops, state)
    state = ops["start_epoch"](state)  # -> epoch 1
    seen["epoch1_start"] = _means(ops, state)
    state = _record(ops, state, [0, 2], [1, 2], [2, 2])
    seen["epoch1_after_record"] = _means(ops, state)
    state = ops["start_epoch"](state)  # -> epoch 2
    seen["epoch2_start"] = _means(ops, state)
    state = ops["start_epoch"](state)  # -> epoch 3, nothing recorded in epoch 2
    seen["epoch3_start"] = _means(ops, state)
    return state, seen


def test_two_epoch_trace_by_hand(ops):
    a0 = b0 = 0.5
    d = 0.75
    _, seen = _two_epoch_trace(ops)

    # Epoch 0: nothing is known, and recording in it changes no lookup.
    for name in ("epoch0_start", "epoch0_after_record"):
        _assert_means(seen[name][0], [NAN, NAN, NAN])
        assert not seen[name][1].any()

    # Epoch 1: key 0 s = 3, f = 1 -> (0.5 + 3) / (1 + 4) = 0.7; key 1 s = 0, f = 4 -> 0.5 / 5 = 0.1; key 2 unseen.
    epoch1 = [(a0 + 3) / (a0 + b0 + 3 + 1), (a0 + 0) / (a0 + b0 + 0 + 4), NAN]
    assert epoch1[:2] == pytest.approx([0.7, 0.1])
    for name in ("epoch1_start", "epoch1_after_record"):  # frozen within the epoch
        _assert_means(seen[name][0], epoch1)
        assert seen[name][1].tolist() == [True, True, False]

    # Epoch 2: key 0 s = 0.75*3 + 1 = 3.25, f = 0.75*1 + 1 = 1.75 -> 3.75 / 6 = 0.625;
    # key 1 (not visited in epoch 1) s = 0, f = 0.75*4 = 3 -> 0.5 / 4 = 0.125; key 2 s = 2, f = 0 -> 2.5 / 3.
    s0, f0 = d * 3 + 1, d * 1 + 1
    s1, f1 = d * 0, d * 4
    s2, f2 = 2.0, 0.0
    epoch2 = [(a0 + s0) / (a0 + b0 + s0 + f0), (a0 + s1) / (a0 + b0 + s1 + f1), (a0 + s2) / (a0 + b0 + s2 + f2)]
    assert epoch2 == pytest.approx([0.625, 0.125, 2.5 / 3])
    _assert_means(seen["epoch2_start"][0], epoch2)
    assert seen["epoch2_start"][1].all()

    # Epoch 3, nothing recorded in epoch 2: every key's evidence decays once more, all stay known.
    # key 0: s = 2.4375, f = 1.3125 -> 2.9375 / 4.75; key 1: f = 2.25 -> 0.5 / 3.25; key 2: s = 1.5 -> 2 / 2.5.
    epoch3 = [(a0 + d * s) / (a0 + b0 + d * s + d * f) for s, f in ((s0, f0), (s1, f1), (s2, f2))]
    assert epoch3 == pytest.approx([2.9375 / 4.75, 0.5 / 3.25, 0.8])
    _assert_means(seen["epoch3_start"][0], epoch3)


def test_state_fields_after_the_trace(ops):
    state, _ = _two_epoch_trace(ops)
    assert int(state.epoch) == 3
    # Decayed evidence after the epoch-2 and epoch-3 boundaries (see the previous test): d*(3.25, 0, 2) etc.
    np.testing.assert_allclose(np.asarray(state.successes_E), [0.75 * 3.25, 0.0, 0.75 * 2.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.failures_E), [0.75 * 1.75, 0.75 * 3.0, 0.0], rtol=1e-6)
    assert np.asarray(state.pending_successes_E).tolist() == [0.0, 0.0, 0.0]
    assert np.asarray(state.pending_failures_E).tolist() == [0.0, 0.0, 0.0]
    assert state.successes_E.dtype == jnp.float32 and state.mean_E.dtype == jnp.float32
    assert state.epoch.dtype == jnp.int32 and state.epoch.shape == ()


def test_pending_outcomes_are_staged_not_frozen(ops):
    state = ops["start_epoch"](ops["start_epoch"](eh.epoch_history_init(4)))  # epoch 1, nothing known
    state = _record(ops, state, [2, 0], [1, 0], [3, 2])
    state = _record(ops, state, [2], [2], [2])  # a second step of the same epoch adds to the pending counts
    assert np.asarray(state.pending_successes_E).tolist() == [0, 0, 3, 0]
    assert np.asarray(state.pending_failures_E).tolist() == [2, 0, 2, 0]
    assert not _means(ops, state, 4)[1].any()
    state = ops["start_epoch"](state)
    # key 0: 0 of 2 -> 0.5 / 3; key 2: 3 of 5 -> 3.5 / 6.
    _assert_means(_means(ops, state, 4)[0], [0.5 / 3, NAN, 3.5 / 6, NAN])


def test_first_start_epoch_promotes_nothing_and_keeps_pending():
    """The released start_epoch only increments the epoch at active_epoch == -1 (its pending dicts are empty then,
    since update raises before it); a state built with pending outcomes at epoch -1 keeps them for epoch 0."""
    state = eh.epoch_history_init(2)._replace(pending_successes_E=jnp.asarray([2.0, 0.0]),
                                              pending_failures_E=jnp.asarray([1.0, 0.0]))
    state = eh.epoch_history_start_epoch(state)
    assert int(state.epoch) == 0
    assert np.asarray(state.pending_successes_E).tolist() == [2.0, 0.0]
    assert np.asarray(state.successes_E).tolist() == [0.0, 0.0]
    assert (np.asarray(state.mean_E) == eh.UNKNOWN).all()
    state = eh.epoch_history_start_epoch(state)  # epoch 1: 2 of 3 -> 2.5 / 4
    _assert_means(np.asarray(state.mean_E), [2.5 / 4, NAN])


# ---------------------------------------------------------------------------------------------------------
# Which prompts have an estimate.


def test_zero_count_records_do_not_make_a_prompt_known(ops):
    state = ops["start_epoch"](eh.epoch_history_init(3))
    state = _record(ops, state, [0, 1, 2], [0, 0, 0], [0, 2, 0])  # keys 0 and 2 got zero rollouts
    state = ops["start_epoch"](state)
    p_hat, known = _means(ops, state)
    assert known.tolist() == [False, True, False]
    _assert_means(p_hat, [NAN, 0.5 / 3, NAN])  # key 1: 0 of 2
    assert not bool(ops["all_known"](state, jnp.asarray([0, 1], jnp.int32)))
    assert bool(ops["all_known"](state, jnp.asarray([1], jnp.int32)))


def test_failures_alone_make_a_prompt_known(ops):
    """Their failures-only prompt enters just the pending-failures dict, and still gets an estimate."""
    state = ops["start_epoch"](eh.epoch_history_init(2))
    state = _record(ops, state, [1], [0], [1])
    state = ops["start_epoch"](state)
    _assert_means(_means(ops, state, 2)[0], [NAN, 0.5 / 2])


def test_zero_discount_keeps_the_estimate_at_the_prior_mean(ops):
    """d = 0 wipes a prompt's old evidence, but it stays known (their dicts keep the key with 0.0): prior mean."""
    prior = (1.0, 3.0)
    start = lambda s: ops["start_epoch"](s, prior=prior, discount=0.0)  # noqa: E731
    state = start(eh.epoch_history_init(2))
    state = _record(ops, state, [0], [4], [4])
    state = start(state)
    _assert_means(_means(ops, state, 2)[0], [(1 + 4) / (4 + 4), NAN])
    state = start(state)  # nothing recorded in epoch 1: s = 0 * 4 = 0 -> a0 / (a0 + b0) = 0.25
    p_hat, known = _means(ops, state, 2)
    _assert_means(p_hat, [0.25, NAN])
    assert known.tolist() == [True, False]


def test_repeated_keys_add_up_like_per_rollout_outcomes(ops):
    """Their update takes one binary outcome per rollout; per-rollout records (count 1 each) equal one summed
    record."""
    state = ops["start_epoch"](eh.epoch_history_init(2))
    per_rollout = _record(ops, state, [1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 1])
    summed = _record(ops, state, [1, 0], [2, 0], [3, 1])
    _states_equal(per_rollout, summed)


def test_all_known_is_false_in_all_of_epoch_zero(ops):
    state = ops["start_epoch"](eh.epoch_history_init(3))
    keys = jnp.asarray([0, 1, 2], jnp.int32)
    state = _record(ops, state, [0, 1, 2], [1, 1, 1], [2, 2, 2])
    assert not bool(ops["all_known"](state, keys))
    state = ops["start_epoch"](state)
    assert bool(ops["all_known"](state, keys))


def test_traced_out_of_range_keys_are_dropped_and_unknown():
    state = eh.epoch_history_start_epoch(eh.epoch_history_init(2))
    state = JITTED["record"](state, jnp.asarray([-1, 2, 1], jnp.int32), jnp.asarray([1.0, 1.0, 1.0]),
                             jnp.asarray([1, 1, 1]))
    assert np.asarray(state.pending_successes_E).tolist() == [0.0, 1.0]  # -1 did not wrap to key 1
    state = eh.epoch_history_start_epoch(state)
    p_hat, known = JITTED["lookup"](state, jnp.asarray([-1, 1, 5], jnp.int32))
    assert np.asarray(known).tolist() == [False, True, False]
    assert np.isnan(np.asarray(p_hat)[[0, 2]]).all()


# ---------------------------------------------------------------------------------------------------------
# Epochs of steps, advancing, resuming.


def test_epoch_length_and_epoch_of_step_match_the_math_tasks_divmod():
    # 10 training prompts, 3 per step: 3 steps per epoch (prompt 10 skipped); step 7 -> epoch 2, position 1.
    assert eh.epoch_length(10, 3) == 3
    assert eh.epoch_length(12, 3) == 4
    assert eh.epoch_length(5, 5) == 1
    assert [eh.epoch_of_step(s, 3) for s in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [divmod(s, 10 // 3)[0] for s in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert int(jax.jit(eh.epoch_of_step, static_argnums=1)(jnp.asarray(7), 3)) == 2


def _run_with_advance(ops, state, steps, steps_per_epoch, outcomes, **hyper):
    """Each step: advance to its epoch, then record its outcomes (keys, successes, counts)."""
    for step in steps:
        state = ops["advance"](state, jnp.asarray(step, jnp.int32), steps_per_epoch, **hyper)
        keys, successes, counts = outcomes[step]
        state = _record(ops, state, keys, successes, counts)
    return state


OUTCOMES = {  # 3 steps per epoch, 4 prompts
    0: ([0, 1], [1, 0], [2, 2]), 1: ([2, 3], [3, 1], [3, 1]), 2: ([1, 0], [2, 0], [2, 0]),
    3: ([3, 2], [0, 1], [2, 2]), 4: ([0, 1], [1, 1], [1, 1]), 5: ([2, 0], [0, 2], [0, 4]),
    6: ([1, 3], [2, 2], [4, 2]), 7: ([0, 2], [1, 1], [1, 3]),
}


def test_advance_equals_start_epoch_at_each_epoch_boundary(ops):
    """advance at every step equals their loop: start_epoch at the start of each pass over the data."""
    by_advance = _run_with_advance(ops, eh.epoch_history_init(4), range(8), 3, OUTCOMES)
    by_epochs = eh.epoch_history_init(4)
    for step in range(8):
        if step % 3 == 0:
            by_epochs = ops["start_epoch"](by_epochs)
        by_epochs = _record(ops, by_epochs, *OUTCOMES[step])
    assert int(by_advance.epoch) == 2
    _states_equal(by_advance, by_epochs)
    # Epoch 2's frozen means by hand: epoch-1 boundary promotes steps 0-2, epoch-2 boundary decays them by 0.75
    # and adds steps 3-5. key 0 (epoch 0: 1 of 2 and 0 of 0; epoch 1: 1 of 1 and 2 of 4): s = 0.75*1 + (1+2) = 3.75,
    # f = 0.75*1 + (0+2) = 2.75 -> 4.25 / 7.5.
    # key 1: s = 0.75*2 + 1 = 2.5, f = 0.75*2 + 0 = 1.5 -> 3 / 5. key 2: s = 0.75*3 + 1 = 3.25, f = 0 + 1 = 1
    # -> 3.75 / 5.25. key 3: s = 0.75*1 + 0 = 0.75, f = 0 + 2 = 2 -> 1.25 / 3.75.
    _assert_means(_means(ops, by_advance, 4)[0], [4.25 / 7.5, 3 / 5, 3.75 / 5.25, 1.25 / 3.75])


def test_advance_within_an_epoch_changes_nothing(ops):
    state = _run_with_advance(ops, eh.epoch_history_init(4), range(5), 3, OUTCOMES)  # mid-epoch 1
    for step in (4, 5):
        _states_equal(ops["advance"](state, jnp.asarray(step, jnp.int32), 3), state)


def test_resuming_mid_epoch_from_a_checkpoint_is_exact(ops):
    """A state saved after step 4 (mid-epoch 1) and restored (host arrays) continues as the uninterrupted run."""
    uninterrupted = _run_with_advance(ops, eh.epoch_history_init(4), range(8), 3, OUTCOMES)
    saved = _run_with_advance(ops, eh.epoch_history_init(4), range(5), 3, OUTCOMES)
    restored = eh.EpochHistoryState(*[np.array(x) for x in saved])
    assert int(restored.epoch) == 1 and np.asarray(restored.pending_successes_E).sum() == 1 + 1 + 0 + 1
    resumed = _run_with_advance(ops, restored, range(5, 8), 3, OUTCOMES)
    _states_equal(resumed, uninterrupted)


def test_advance_over_skipped_epochs_decays_once_per_epoch(ops):
    """From mid-epoch 1 straight to a step of epoch 4: promote, then decay twice more (three start_epochs)."""
    state = _run_with_advance(ops, eh.epoch_history_init(4), range(5), 3, OUTCOMES)
    jumped = ops["advance"](state, jnp.asarray(13, jnp.int32), 3)
    stepwise = state
    for _ in range(3):
        stepwise = ops["start_epoch"](stepwise)
    assert int(jumped.epoch) == 4
    _states_equal(jumped, stepwise)
    # key 1 by hand: epoch-1 s = 2, f = 2; epoch-2 s = 0.75*2 + 1 = 2.5, f = 1.5; then decayed twice.
    s, f = 2.5 * 0.75 ** 2, 1.5 * 0.75 ** 2
    _assert_means(_means(ops, jumped, 4)[0][1:2], [(0.5 + s) / (1 + s + f)])


def test_advance_from_the_initial_state_starts_epoch_zero(ops):
    state = ops["advance"](eh.epoch_history_init(2), jnp.asarray(0, jnp.int32), 5)
    assert int(state.epoch) == 0
    state = ops["advance"](eh.epoch_history_init(2), jnp.asarray(11, jnp.int32), 5)  # epoch 2, no evidence
    assert int(state.epoch) == 2 and (np.asarray(state.mean_E) == eh.UNKNOWN).all()


# ---------------------------------------------------------------------------------------------------------
# The released class, restated with dicts (independent of the code under test).


class _DictEstimator:
    """Their estimator in plain Python: dicts keyed by prompt id that a key enters only through an outcome."""

    def __init__(self, a0, b0, d):
        self.a0, self.b0, self.d = a0, b0, d
        self.epoch = -1
        self.evidence = {}  # key -> (decayed successes, decayed failures)
        self.pending = {}  # key -> (successes, failures) of the current epoch
        self.frozen = {}  # key -> posterior mean

    def start_epoch(self):
        if self.epoch >= 0:
            for key in set(self.evidence) | set(self.pending):
                s, f = self.evidence.get(key, (0.0, 0.0))
                k, m = self.pending.get(key, (0, 0))
                s, f = self.d * s + k, self.d * f + m
                self.evidence[key] = (s, f)
                self.frozen[key] = (self.a0 + s) / (self.a0 + self.b0 + s + f)
            self.pending = {}
        self.epoch += 1

    def update(self, keys, outcomes):  # one binary outcome per rollout
        for key, outcome in zip(keys, outcomes):
            k, m = self.pending.get(key, (0, 0))
            self.pending[key] = (k + outcome, m + 1 - outcome)

    def lookup(self, keys):
        return [self.frozen.get(key, math.nan) for key in keys]


@pytest.mark.parametrize("prior,discount,seed", [((0.5, 0.5), 0.75, 0), ((1.0, 3.0), 0.0, 1), ((0.3, 0.7), 1.0, 2),
                                                 ((2.0, 0.5), 0.4, 3)])
def test_matches_a_dict_restatement_on_a_random_trace(prior, discount, seed):
    num_keys, num_prompts, steps_per_epoch, num_epochs = 7, 3, 3, 5
    rng = np.random.default_rng(seed)
    reference = _DictEstimator(*prior, discount)
    state = eh.epoch_history_init(num_keys)
    for step in range(steps_per_epoch * num_epochs):
        if step % steps_per_epoch == 0:
            reference.start_epoch()
        state = JITTED["advance"](state, jnp.asarray(step, jnp.int32), steps_per_epoch, prior=prior, discount=discount)
        keys = rng.choice(num_keys, num_prompts, replace=False)
        # Lookups before this step's rollouts, for every prompt (not only the step's).
        p_hat, known = JITTED["lookup"](state, jnp.arange(num_keys, dtype=jnp.int32))
        expected = reference.lookup(list(range(num_keys)))
        np.testing.assert_allclose(np.asarray(p_hat, np.float64), expected, rtol=2e-6, equal_nan=True,
                                   err_msg=f"step {step}")
        assert np.asarray(known).tolist() == [not math.isnan(p) for p in expected]
        step_known = not any(math.isnan(p) for p in reference.lookup(keys.tolist()))
        assert bool(JITTED["all_known"](state, jnp.asarray(keys, jnp.int32))) == step_known
        # The step's rollouts: 0..3 per prompt (zero-count prompts included), binary outcomes.
        counts = rng.integers(0, 4, num_prompts)
        outcomes = [rng.integers(0, 2, int(n)).tolist() for n in counts]
        reference.update([int(k) for k, n in zip(keys, counts) for _ in range(n)], sum(outcomes, []))
        state = JITTED["record"](state, jnp.asarray(keys, jnp.int32),
                                 jnp.asarray([sum(o) for o in outcomes], jnp.float32), jnp.asarray(counts, jnp.int32))
    assert int(state.epoch) == num_epochs - 1 == reference.epoch


# ---------------------------------------------------------------------------------------------------------
# Bad arguments.


def _started(num_keys=3):
    return eh.epoch_history_start_epoch(eh.epoch_history_init(num_keys))


@pytest.mark.parametrize("call,name", [
    (lambda: eh.epoch_history_init(0), "num_keys"),
    (lambda: eh.epoch_history_init(3.0), "num_keys"),
    (lambda: eh.epoch_history_init(3, dtype=jnp.int32), "dtype"),
    (lambda: eh.epoch_history_start_epoch(_started(), prior=(0.0, 0.5)), "prior a0"),
    (lambda: eh.epoch_history_start_epoch(_started(), prior=(0.5, float("inf"))), "prior b0"),
    (lambda: eh.epoch_history_start_epoch(_started(), prior=(0.5,)), "prior"),
    (lambda: eh.epoch_history_start_epoch(_started(), discount=1.5), "discount"),
    (lambda: eh.epoch_history_start_epoch(_started(), discount=-0.1), "discount"),
    (lambda: eh.epoch_history_start_epoch(_started(), discount=float("nan")), "discount"),
    (lambda: eh.epoch_history_start_epoch((1, 2)), "state"),
    (lambda: eh.epoch_history_start_epoch(_started()._replace(failures_E=jnp.zeros(4))), "state.failures_E"),
    (lambda: eh.epoch_history_record(eh.epoch_history_init(3), [0], [1], [1]), "state.epoch"),
    (lambda: eh.epoch_history_record(_started(), [3], [1], [1]), "keys_P"),
    (lambda: eh.epoch_history_record(_started(), [-1], [1], [1]), "keys_P"),
    (lambda: eh.epoch_history_record(_started(), [0.0], [1], [1]), "keys_P"),
    (lambda: eh.epoch_history_record(_started(), [[0]], [1], [1]), "keys_P"),
    (lambda: eh.epoch_history_record(_started(), [0, 1], [1], [1, 1]), "successes_P"),
    (lambda: eh.epoch_history_record(_started(), [0, 1], [1, 1], [1]), "counts_P"),
    (lambda: eh.epoch_history_record(_started(), [0], [2], [1]), "successes_P"),
    (lambda: eh.epoch_history_record(_started(), [0], [-1], [1]), "successes_P"),
    (lambda: eh.epoch_history_record(_started(), [0], [0], [-1]), "counts_P"),
    (lambda: eh.epoch_history_lookup(_started(), [5]), "keys_P"),
    (lambda: eh.epoch_length(10, 0), "prompts_per_step"),
    (lambda: eh.epoch_length(2, 3), "prompts_per_step"),
    (lambda: eh.epoch_length(0, 1), "num_train_prompts"),
    (lambda: eh.epoch_of_step(-1, 3), "step"),
    (lambda: eh.epoch_of_step(4, 0), "steps_per_epoch"),
    (lambda: eh.epoch_history_advance(_started(), 2, 0), "steps_per_epoch"),
    (lambda: eh.epoch_history_advance(_started(), 2, 3, discount=2.0), "discount"),
    (lambda: eh.epoch_history_advance(eh.epoch_history_advance(_started(), 9, 3), 2, 3), "state.epoch"),
])
def test_bad_arguments_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        call()


# ---------------------------------------------------------------------------------------------------------
# What the estimator implies for the released rule's active set (docs/method.md §3.4).


@pytest.mark.parametrize("n_max", [2, 8, 64, 512])
def test_the_discount_keeps_every_prompt_above_the_released_rules_threshold(n_max):
    """A prompt visited once an epoch with at most n_max rollouts holds evidence below n_max / (1 - d), so p_hat stays
    in [eps, 1 - eps] with eps = a0 / (a0 + b0 + n_max / (1 - d)) and its mixed-group chance at n_max at least
    1 - exp(-eps n_max) - eps^n_max > 0.05: under the authors' discount the score never leaves a prompt out, even one
    that failed (or passed) all n_max rollouts of 60 epochs. Without the discount (d = 1) the same prompts drop out."""
    from sera_jax.core.released_rule import DEFAULT_THRESHOLD, mixed_group_chance

    def after_60_epochs(discount):
        state = eh.epoch_history_init(2)
        for _ in range(60):
            state = eh.epoch_history_start_epoch(state, discount=discount)
            state = _record(EAGER, state, [0, 1], [0, n_max], [n_max, n_max])  # always all fail, always all pass
        state = eh.epoch_history_start_epoch(state, discount=discount)
        p_hat, _ = eh.epoch_history_lookup(state, jnp.arange(2, dtype=jnp.int32))
        return p_hat, mixed_group_chance(p_hat, jnp.full((2,), n_max, jnp.int32))

    a0, b0 = eh.DEFAULT_PRIOR
    eps = a0 / (a0 + b0 + n_max / (1 - eh.DEFAULT_DISCOUNT))
    bound = 1 - math.exp(-eps * n_max) - eps**n_max
    assert bound > DEFAULT_THRESHOLD
    p_hat, chance = after_60_epochs(eh.DEFAULT_DISCOUNT)
    assert float(p_hat[0]) >= eps * (1 - 1e-5) and 1 - float(p_hat[1]) >= eps * (1 - 1e-5)
    np.testing.assert_array_less(bound * (1 - 1e-4), np.asarray(chance))
    _, undiscounted = after_60_epochs(1.0)
    np.testing.assert_array_less(np.asarray(undiscounted), DEFAULT_THRESHOLD)  # p_hat ~ 1/(120 n_max): chance ~ 1/120
