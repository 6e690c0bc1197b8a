"""Train masks of DAPO, PODS and Reinforce-Ada (docs/allocators.md §1, §6, §7): the docs' hand examples, and each
rule against an independent Python reference (loops and exhaustive enumeration)."""

import itertools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_jax.core import keep as keep_lib

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# One static layout for the property tests (few compiles): B rows over P prompts, padding mixed in.
B, P = 16, 3
KEEPS = (4, 3, 1, 2, 5)  # static m / n; the first is drawn most

# Jitted wrappers (static arguments by name): the public functions must also run inside a caller's jit.
JITTED = {
    "mixed_groups": jax.jit(keep_lib.mixed_groups, static_argnames=("num_prompts",)),
    "kept_groups": jax.jit(keep_lib.kept_groups, static_argnames=("num_prompts",)),
    "keep_first": jax.jit(keep_lib.keep_first, static_argnames=("num_prompts",)),
    "class_split": jax.jit(keep_lib.class_split),
    "max_variance_subset": jax.jit(keep_lib.max_variance_subset, static_argnames=("num_prompts", "keep")),
    "balanced_subset": jax.jit(keep_lib.balanced_subset, static_argnames=("num_prompts", "keep")),
    "reinforce_ada_finished": jax.jit(keep_lib.reinforce_ada_finished, static_argnames=("keep",)),
    "reinforce_ada_round": jax.jit(keep_lib.reinforce_ada_round, static_argnames=("round_size", "keep")),
}


def _kept(keep_B) -> list:
    keep_B = np.asarray(keep_B)
    assert keep_B.dtype == np.float32 and set(np.unique(keep_B)) <= {0.0, 1.0}
    return [int(b) for b in np.flatnonzero(keep_B)]


def _groups(ids, valid, num_prompts):
    """Flat indices of each prompt's valid rows, in flat (arrival) order."""
    return [[b for b in range(len(ids)) if valid[b] and ids[b] == i] for i in range(num_prompts)]


# ---------------------------------------------------------------------------------------------------------
# Independent references (plain Python).


def _mixed_reference(rewards, ids, valid, num_prompts):
    kept = []
    for group in _groups(ids, valid, num_prompts):
        values = {float(rewards[b]) for b in group}
        if len(group) == 1 or len(values) > 1:
            kept += group
    return sorted(kept)


def _keep_first_reference(rewards, ids, valid, successes, failures):
    seen = {}
    kept = []
    for b in range(len(ids)):
        if not valid[b]:
            continue
        cls = int(rewards[b])
        quota = successes[ids[b]] if cls == 1 else failures[ids[b]]
        count = seen.get((ids[b], cls), 0)
        if count < quota:
            kept.append(b)
        seen[(ids[b], cls)] = count + 1
    return kept


def _max_variance_reference(rewards, ids, valid, num_prompts, m):
    """Every size-m subset of each group: the largest reward variance (exact fractions), then more successes (the
    ceil(m/2) tie rule), then the lexicographically smallest index tuple (lowest indices)."""
    kept = []
    for group in _groups(ids, valid, num_prompts):
        if len(group) <= m:
            kept += group
            continue
        def rank(subset):
            r = [Fraction(int(rewards[b])) for b in subset]
            mean = sum(r) / m
            variance = sum((x - mean) ** 2 for x in r) / m
            return (-variance, -sum(r), subset)
        kept += min(itertools.combinations(group, m), key=rank)
    return sorted(kept)


def _balanced_reference(rewards, ids, valid, num_prompts, n):
    """Take min(n, seen); aim at floor(n/2) successes; a short class is filled from the other; first arrivals."""
    successes, failures = [], []
    for group in _groups(ids, valid, num_prompts):
        k = sum(int(rewards[b]) for b in group)
        f = len(group) - k
        take = min(n, len(group))
        pos = min(n // 2, k)
        neg = min(take - pos, f)
        pos = take - neg
        successes.append(pos)
        failures.append(neg)
    return _keep_first_reference(rewards, ids, valid, successes, failures)


# Layouts: rewards, prompt ids (any order), validity; padding rows carry any id, even outside [0, P).
layouts = st.tuples(
    st.lists(st.integers(0, 1), min_size=B, max_size=B),
    st.lists(st.integers(0, P - 1), min_size=B, max_size=B),
    st.lists(st.booleans() | st.just(True), min_size=B, max_size=B),
    st.lists(st.integers(-1, P), min_size=B, max_size=B),
).map(lambda t: (np.array(t[0], np.float32), np.where(t[2], t[1], t[3]).astype(np.int32), np.array(t[2], bool)))


# ---------------------------------------------------------------------------------------------------------
# DAPO (§1)


def test_dapo_example_keeps_four_groups_and_sixteen_of_thirty_two_rollouts():
    """§1.5: B = 32, n = 4, two chunks of 4 prompts; K = [0,2,4,1] keeps {1,3}, K = [3,0,4,2] keeps {4,7}."""
    successes = [0, 2, 4, 1, 3, 0, 4, 2]
    rewards = np.array([1.0 if j < k else 0.0 for k in successes for j in range(4)], np.float32)
    ids = np.repeat(np.arange(8), 4).astype(np.int32)
    keep_B = keep_lib.mixed_groups(rewards, ids, 8)
    assert sorted(set(ids[_kept(keep_B)])) == [1, 3, 4, 7]
    assert len(_kept(keep_B)) == 16
    assert int(keep_lib.kept_groups(keep_B, ids, 8)) == 4


def test_mixed_groups_keeps_single_rollout_groups_as_dapo_does():
    """``std > 0 or len == 1``: prompt 0 has one rollout; prompt 1 one valid rollout plus padding; prompt 2 two
    equal ones (dropped); prompt 3 none at all."""
    rewards = np.array([1, 0, 1, 0, 0], np.float32)
    ids = np.array([0, 1, 1, 2, 2], np.int32)
    valid = np.array([True, True, False, True, True])
    keep_B = keep_lib.mixed_groups(rewards, ids, 4, valid)
    assert _kept(keep_B) == [0, 1]
    assert int(keep_lib.kept_groups(keep_B, ids, 4)) == 2


def test_mixed_groups_is_std_positive_for_real_rewards():
    rewards = np.array([0.5, 0.5, 0.2, 0.7, 0.1, 0.1, 0.1], np.float32)
    ids = np.array([0, 0, 1, 1, 2, 2, 2], np.int32)
    assert _kept(keep_lib.mixed_groups(rewards, ids, 3)) == [2, 3]


def test_mixed_groups_keeps_the_groups_whose_rewards_differ_not_a_rounded_std():
    """``max > min``, which a float std > 0 equals only in exact arithmetic. DAPO's float64 np.std gives three
    equal rewards 0.2 a tiny positive std (their mean rounds off 0.2: kept there) and two rewards 1e-170 apart
    a zero one (the squared deviations underflow: dropped there); in float32 the std of 1e-30 and the next float
    underflows too. Prompt 0 (three 0.2) is dropped; prompts 1 (1e-30 and its next float) and 2 (1 and its next
    float) are kept."""
    assert np.std([0.2] * 3) > 0 and np.std([1e-170, 2e-170]) == 0  # what the published float64 std says
    tiny = np.float32(1e-30)
    pair = np.array([tiny, np.nextafter(tiny, np.float32(1))], np.float32)
    assert pair[1] > pair[0] and np.std(pair) == 0
    rewards = np.array([0.2, 0.2, 0.2, *pair, 1.0, np.nextafter(np.float32(1), np.float32(2))], np.float32)
    ids = np.array([0, 0, 0, 1, 1, 2, 2], np.int32)
    assert _kept(keep_lib.mixed_groups(rewards, ids, 3)) == [3, 4, 5, 6]


@SETTINGS
@given(layout=layouts)
def test_mixed_groups_matches_the_reference(layout):
    rewards, ids, valid = layout
    keep_B = keep_lib.mixed_groups(rewards, ids, num_prompts=P, valid_B=valid)
    expected = _mixed_reference(rewards, ids, valid, P)
    assert _kept(keep_B) == expected
    assert int(keep_lib.kept_groups(keep_B, ids, P)) == len({int(ids[b]) for b in expected})


# ---------------------------------------------------------------------------------------------------------
# Building blocks


def test_keep_first_by_hand():
    rewards = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
    ids = np.array([0, 1, 0, 1, 0, 1, 0, 0], np.int32)
    # prompt 0: rows 0(1) 2(1) 4(0) 6(1) 7(0); prompt 1: rows 1(0) 3(1) 5(0)
    keep_B = keep_lib.keep_first(rewards, ids, 2, np.array([2, 0], np.int32), np.array([1, 5], np.int32))
    assert _kept(keep_B) == [0, 1, 2, 4, 5]


@SETTINGS
@given(layout=layouts, successes=st.lists(st.integers(0, 7), min_size=P, max_size=P),
       failures=st.lists(st.integers(0, 7), min_size=P, max_size=P))
def test_keep_first_matches_a_python_loop(layout, successes, failures):
    rewards, ids, valid = layout
    keep_B = keep_lib.keep_first(rewards, ids, num_prompts=P, successes_P=np.array(successes, np.int32),
                                 failures_P=np.array(failures, np.int32), valid_B=valid)
    assert _kept(keep_B) == _keep_first_reference(rewards, ids, valid, successes, failures)


def test_class_split_by_hand():
    pos, neg = keep_lib.class_split(np.array([5, 1, 7, 0]), np.array([3, 11, 1, 4]), np.array([4, 4, 4, 2]), 2)
    np.testing.assert_array_equal(pos, [2, 1, 3, 0])
    np.testing.assert_array_equal(neg, [2, 3, 1, 2])


@SETTINGS
@given(data=st.data())
def test_class_split_is_the_feasible_count_closest_to_the_target(data):
    s, f = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))
    take, target = data.draw(st.integers(0, s + f)), data.draw(st.integers(0, 8))
    pos, neg = keep_lib.class_split(np.array([s]), np.array([f]), np.array([take]), np.array([target]))
    feasible = [j for j in range(take + 1) if j <= s and take - j <= f]
    best = min(feasible, key=lambda j: abs(j - target))
    assert (int(pos[0]), int(neg[0])) == (best, take - best)


# ---------------------------------------------------------------------------------------------------------
# PODS (§7)


def test_pods_examples():
    """§7.5, n = 8, m = 4: K = 5 keeps 2 + 2; K = 7 keeps 3 successes and the one failure; K = 0 keeps any 4 (the
    first). The three prompts are interleaved in flat order."""
    groups = [[1, 0, 0, 1, 1, 1, 0, 1], [1, 1, 1, 0, 1, 1, 1, 1], [0] * 8]
    ids = np.tile(np.arange(3), 8).astype(np.int32)  # row b = 3 j + i is rollout j of prompt i
    rewards = np.array([groups[i][j] for j in range(8) for i in range(3)], np.float32)
    kept = _kept(keep_lib.max_variance_subset(rewards, ids, 3, 4))
    by_prompt = [[b // 3 for b in kept if b % 3 == i] for i in range(3)]
    assert by_prompt == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert [sum(groups[i][j] for j in js) for i, js in enumerate(by_prompt)] == [2, 3, 0]


def test_pods_odd_m_takes_ceil_half_successes():
    """m = 3 of K = 4 successes in n = 8: j = 1 and j = 2 have equal variance; the rule takes ceil(3/2) = 2."""
    rewards = np.array([0, 1, 0, 1, 0, 1, 0, 1], np.float32)
    kept = _kept(keep_lib.max_variance_subset(rewards, np.zeros(8, np.int32), 1, 3))
    assert kept == [0, 1, 3]


@SETTINGS
@given(layout=layouts, m=st.sampled_from(KEEPS))
def test_max_variance_subset_matches_exhaustive_enumeration(layout, m):
    rewards, ids, valid = layout
    keep_B = keep_lib.max_variance_subset(rewards, ids, num_prompts=P, keep=m, valid_B=valid)
    assert _kept(keep_B) == _max_variance_reference(rewards, ids, valid, P, m)


# ---------------------------------------------------------------------------------------------------------
# Reinforce-Ada (§6)


def test_reinforce_ada_finished_by_hand():
    # n = 4 needs >= 2 successes and >= 2 failures; n = 3 needs >= 1 and >= 2; n = 1 needs 0 and >= 1.
    counts, successes = np.array([4, 4, 8, 0, 3]), np.array([2, 3, 1, 0, 1])
    np.testing.assert_array_equal(keep_lib.reinforce_ada_finished(counts, successes, 4), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(keep_lib.reinforce_ada_finished(counts, successes, 3), [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(keep_lib.reinforce_ada_finished(counts, successes, 1), [1, 1, 1, 0, 1])


def test_reinforce_ada_round_by_hand():
    counts, successes = np.array([4, 4, 4, 4, 4]), np.array([2, 4, 0, 1, 3])  # with n = 4 only prompt 0 is done
    def round_(remaining, counts=counts, successes=successes):
        return np.asarray(keep_lib.reinforce_ada_round(counts, successes, remaining, round_size=3, keep=4)).tolist()
    assert round_(13) == [0, 3, 3, 3, 3]  # full round: 4 active x 3 <= 13
    assert round_(12) == [0, 3, 3, 3, 3]
    assert round_(7) == [0, 2, 2, 2, 1]  # partial: 7 = 4 x 1 + 3, the first three active prompts get one more
    assert round_(2) == [0, 1, 1, 0, 0]
    assert round_(0) == [0, 0, 0, 0, 0]
    done = np.array([2, 2, 2, 2, 2])
    assert round_(7, successes=done) == [2, 2, 1, 1, 1]  # none active: over all prompts in index order
    assert round_(0, successes=done) == [0, 0, 0, 0, 0]


def _drive_reinforce_ada(queues, budget, round_size, keep):
    """Runs rounds until the budget is spent, popping each prompt's rewards from its queue in order; returns the
    flat layout (arrival order) and every round's extra_P."""
    num_prompts = len(queues)
    positions = [0] * num_prompts
    rewards, ids, rounds = [], [], []
    remaining = budget
    while remaining > 0:
        assert len(rounds) < budget, "a round spent nothing"
        counts = np.array(positions, np.int32)
        successes = np.array([sum(queues[i][:positions[i]]) for i in range(num_prompts)], np.int32)
        extra = np.asarray(keep_lib.reinforce_ada_round(counts, successes, remaining, round_size=round_size,
                                                         keep=keep)).tolist()
        finished = np.asarray(keep_lib.reinforce_ada_finished(counts, successes, keep))
        active = [i for i in range(num_prompts) if not finished[i]]
        if active:
            expected_total = min(remaining, len(active) * round_size)
            assert all(extra[i] == 0 for i in range(num_prompts) if finished[i])
        else:
            expected_total = remaining
        assert sum(extra) == expected_total
        for i, e in enumerate(extra):
            rewards += queues[i][positions[i]:positions[i] + e]
            ids += [i] * e
            positions[i] += e
        remaining -= sum(extra)
        rounds.append(extra)
    return np.array(rewards, np.float32), np.array(ids, np.int32), rounds


def test_reinforce_ada_example():
    """§6.5: P = 3, M = 4, n = 4, balanced, B = 28."""
    queues = [[1, 0, 1, 0],
              [1, 1, 1, 1] + [1, 0, 1, 1] + [0, 1, 1, 1],
              [0, 0, 0, 0] + [0, 1, 0, 0] + [0, 0, 0, 0]]
    rewards, ids, rounds = _drive_reinforce_ada(queues, 28, round_size=4, keep=4)
    assert rounds == [[4, 4, 4], [0, 4, 4], [0, 4, 4]]  # A finishes in round 1, B in round 3, C never
    assert len(rewards) == 28
    kept = _kept(keep_lib.balanced_subset(rewards, ids, 3, 4))
    # Flat order: round 1 A 0-3, B 4-7, C 8-11; round 2 B 12-15, C 16-19; round 3 B 20-23, C 24-27.
    assert kept == sorted([0, 1, 2, 3] + [4, 5, 13, 20] + [8, 9, 10, 17])
    assert len(kept) == 12
    by_prompt = [[rewards[b] for b in kept if ids[b] == i] for i in range(3)]
    assert [(sum(r), len(r) - sum(r)) for r in by_prompt] == [(2, 2), (2, 2), (1, 3)]  # C's fallback: 1 + 3
    baselines = [(rewards[ids == i].sum(), (ids == i).sum()) for i in range(3)]  # global: all seen rollouts
    assert baselines == [(2, 4), (10, 12), (1, 12)]


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(0, 40), round_size=st.sampled_from((4, 1)),
       keep=st.sampled_from((4, 3)), p=st.sampled_from((0.5, 0.0, 1.0, 0.9)))
def test_reinforce_ada_rounds_spend_the_budget_exactly(seed, budget, round_size, keep, p):
    rng = np.random.default_rng(seed)
    queues = [[int(x) for x in rng.random(budget) < q] for q in (p, 1 - p, 0.5)]
    rewards, ids, _ = _drive_reinforce_ada(queues, budget, round_size, keep)
    assert len(rewards) == budget


def test_reinforce_ada_round_takes_a_traced_remaining():
    counts, successes = np.array([4, 4, 4]), np.array([2, 4, 0])
    run = jax.jit(lambda r: keep_lib.reinforce_ada_round(counts, successes, r, round_size=4, keep=4))
    assert np.asarray(run(jnp.int32(5))).tolist() == [0, 3, 2]
    assert np.asarray(run(jnp.int32(9))).tolist() == [0, 4, 4]
    assert np.asarray(run(jnp.int32(-3))).tolist() == [0, 0, 0]


@SETTINGS
@given(layout=layouts, n=st.sampled_from(KEEPS))
def test_balanced_subset_matches_the_reference(layout, n):
    rewards, ids, valid = layout
    keep_B = keep_lib.balanced_subset(rewards, ids, num_prompts=P, keep=n, valid_B=valid)
    assert _kept(keep_B) == _balanced_reference(rewards, ids, valid, P, n)


# ---------------------------------------------------------------------------------------------------------
# Layout invariances, padding, eager = jit


ALL_RULES = {
    "mixed_groups": lambda r, i, v: keep_lib.mixed_groups(r, i, P, v),
    "keep_first": lambda r, i, v: keep_lib.keep_first(r, i, P, np.array([1, 2, 0], np.int32),
                                                      np.array([2, 1, 3], np.int32), v),
    "max_variance_subset": lambda r, i, v: keep_lib.max_variance_subset(r, i, P, 3, v),
    "balanced_subset": lambda r, i, v: keep_lib.balanced_subset(r, i, P, 4, v),
}


@pytest.mark.parametrize("name", sorted(ALL_RULES))
def test_interleaved_prompts_keep_the_same_rollouts_as_the_contiguous_layout(name):
    """Interleave the prompts' rows (each prompt's rows keep their relative order, i.e. arrival order): the kept
    set is the contiguous layout's, mapped through the interleaving."""
    rng = np.random.default_rng(0)
    counts = [5, 6, 5]
    contiguous_ids = np.repeat(np.arange(P), counts).astype(np.int32)
    rewards = (rng.random(B) < 0.5).astype(np.float32)
    keep_contiguous = np.asarray(ALL_RULES[name](rewards, contiguous_ids, None))
    starts = np.cumsum(counts) - counts
    for _ in range(3):
        shuffled_ids = rng.permutation(contiguous_ids)
        occurrence = [int(np.sum(shuffled_ids[:t] == shuffled_ids[t])) for t in range(B)]
        source = np.array([starts[shuffled_ids[t]] + occurrence[t] for t in range(B)])
        keep_shuffled = np.asarray(ALL_RULES[name](rewards[source], shuffled_ids, None))
        np.testing.assert_array_equal(keep_shuffled, keep_contiguous[source])


@pytest.mark.parametrize("name", sorted(ALL_RULES))
def test_padding_rows_are_never_kept_and_count_for_nothing(name):
    """Inserting padding rows (reward 1 or 0, any prompt id) leaves the real rows' mask unchanged."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, P, 10).astype(np.int32)
    rewards = (rng.random(10) < 0.5).astype(np.float32)
    keep_real = np.asarray(ALL_RULES[name](rewards, ids, None))
    real_rows = np.sort(rng.choice(B, 10, replace=False))
    valid = np.zeros(B, bool)
    valid[real_rows] = True
    padded_ids = rng.integers(-1, P + 1, B).astype(np.int32)
    padded_rewards = np.ones(B, np.float32)
    padded_ids[real_rows], padded_rewards[real_rows] = ids, rewards
    keep_padded = np.asarray(ALL_RULES[name](padded_rewards, padded_ids, valid))
    np.testing.assert_array_equal(keep_padded[real_rows], keep_real)
    assert not np.any(keep_padded[~valid])


def test_jit_matches_eager():
    """Every public function inside a caller's jit (traced inputs skip the value checks) equals its eager call."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, P, B).astype(np.int32)
    rewards = (rng.random(B) < 0.5).astype(np.float32)
    valid = rng.random(B) < 0.8
    quota = np.array([1, 2, 3], np.int32)
    pairs = [
        (JITTED["mixed_groups"](rewards, ids, P, valid), keep_lib.mixed_groups(rewards, ids, P, valid)),
        (JITTED["keep_first"](rewards, ids, P, quota, quota[::-1], valid),
         keep_lib.keep_first(rewards, ids, P, quota, quota[::-1], valid)),
        (JITTED["max_variance_subset"](rewards, ids, P, 3, valid),
         keep_lib.max_variance_subset(rewards, ids, P, 3, valid)),
        (JITTED["balanced_subset"](rewards, ids, P, 4, valid), keep_lib.balanced_subset(rewards, ids, P, 4, valid)),
        (JITTED["reinforce_ada_finished"](quota + 3, quota, 4), keep_lib.reinforce_ada_finished(quota + 3, quota, 4)),
        (JITTED["kept_groups"](quota > 1, quota - 1, P), keep_lib.kept_groups(quota > 1, quota - 1, P)),
        (JITTED["reinforce_ada_round"](quota + 3, quota, 7, round_size=2, keep=4),
         keep_lib.reinforce_ada_round(quota + 3, quota, 7, round_size=2, keep=4)),
        *zip(JITTED["class_split"](quota, quota, quota, 2), keep_lib.class_split(quota, quota, quota, 2)),
    ]
    for jitted, eager in pairs:
        np.testing.assert_array_equal(jitted, eager)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs


R4, I4 = np.array([1, 0, 1, 0], np.float32), np.array([0, 0, 1, 1], np.int32)
Q2 = np.array([1, 1], np.int32)

BAD_INPUTS = [
    (lambda: keep_lib.mixed_groups(R4[None], I4[None], 2), "rewards_B"),
    (lambda: keep_lib.mixed_groups(R4, I4[:3], 2), "prompt_ids_B"),
    (lambda: keep_lib.mixed_groups(R4, I4.astype(np.float32), 2), "prompt_ids_B"),
    (lambda: keep_lib.mixed_groups(R4, I4, 1), "prompt_ids_B"),  # id 1 out of [0, 1)
    (lambda: keep_lib.mixed_groups(R4, I4, 0), "num_prompts"),
    (lambda: keep_lib.mixed_groups(R4, I4, 2.0), "num_prompts"),
    (lambda: keep_lib.mixed_groups(R4, I4, 2, np.ones(3, bool)), "valid_B"),
    (lambda: keep_lib.mixed_groups(R4, I4, 2, np.ones(4, np.float32)), "valid_B"),
    (lambda: keep_lib.kept_groups(R4, I4[:3], 2), "prompt_ids_B"),
    (lambda: keep_lib.kept_groups(R4[None], I4[None], 2), "keep_B"),
    (lambda: keep_lib.keep_first(R4 * 0.5, I4, 2, Q2, Q2), "rewards_B"),
    (lambda: keep_lib.keep_first(R4, I4, 2, Q2[:1], Q2), "successes_P"),
    (lambda: keep_lib.keep_first(R4, I4, 2, Q2, Q2.astype(np.float32)), "failures_P"),
    (lambda: keep_lib.class_split(Q2, Q2, np.array([3, 1]), 1), "take_P"),
    (lambda: keep_lib.class_split(Q2, Q2, np.array([-1, 1]), 1), "take_P"),
    (lambda: keep_lib.class_split(Q2, Q2[:1], Q2, 1), "failures_P"),
    (lambda: keep_lib.class_split(Q2, Q2, Q2, np.array([1, 1, 1])), "positives_target_P"),
    (lambda: keep_lib.class_split(Q2[0], Q2, Q2, 1), "successes_P"),
    (lambda: keep_lib.max_variance_subset(R4, I4, 2, 0), "keep"),
    (lambda: keep_lib.max_variance_subset(R4, I4, 2, 2.5), "keep"),
    (lambda: keep_lib.balanced_subset(R4 + 1, I4, 2, 2), "rewards_B"),
    (lambda: keep_lib.balanced_subset(R4, I4, 2, 0), "keep"),
    (lambda: keep_lib.reinforce_ada_finished(Q2, Q2[:1], 4), "successes_P"),
    (lambda: keep_lib.reinforce_ada_finished(Q2, Q2 + 1, 4), "successes_P"),
    (lambda: keep_lib.reinforce_ada_finished(Q2[None], Q2[None], 4), "counts_P"),
    (lambda: keep_lib.reinforce_ada_round(Q2, Q2, -1, round_size=4, keep=4), "remaining"),
    (lambda: keep_lib.reinforce_ada_round(Q2, Q2, 2.0, round_size=4, keep=4), "remaining"),
    (lambda: keep_lib.reinforce_ada_round(Q2, Q2, 4, round_size=0, keep=4), "round_size"),
    (lambda: keep_lib.reinforce_ada_round(Q2, Q2, 4, round_size=4, keep=0), "keep"),
]


@pytest.mark.parametrize("call, name", BAD_INPUTS, ids=[f"{i}-{name}" for i, (_, name) in enumerate(BAD_INPUTS)])
def test_bad_inputs_raise_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
