"""DARS (docs/allocators.md §8): the published Δn, and its fixed-budget counts against a plain-loop reference."""

import math
from fractions import Fraction

import jax
import numpy as np
import pytest

from sera_jax.core import allocators
from sera_jax.core.dars import PilotFractions, check_sizes, dars_counts, dars_extra_weights

HAND_ACC = np.array([0, 1 / 8, 1 / 4, 3 / 8, 1 / 2], np.float32)


def _published_delta(acc, n, variant, n_max_total, guard=1e-9):
    """schedule_ET / schedule_HW in float64 Python, with the doc's 1e-9 guard before the ceil."""
    acc = 0.5 / n if acc == 0 else acc
    if acc >= 0.5:
        return 0
    if variant == "et":
        x = n * (0.5 / (2 * acc * (1 - acc)) - 1)
    else:
        x = n * (1 - 2 * acc) / (2 * acc)
    return min(math.ceil(x - guard), n_max_total - n)


def _fixed_budget_reference(acc, budget, n, n_max, variant, base=None):
    """§8.4 in plain Python: B2 in proportion to Δn (exact fractions), floor, +1 to the largest remainders (ties by
    index), capped at n_max - n, repeated on what the caps leave; round-robin by index when no weight is open.
    ``base`` (default n): every prompt's rollouts before the shares, when a lower bound lies above the pilot of
    n; Δn stays the published one at the pilot's n (N = n, N_max = n_max), B2 = budget - P base, cap n_max - base."""
    base = n if base is None else base
    weights = [_published_delta(float(a), n, variant, n_max) for a in acc]
    cap, extra = n_max - base, [0] * len(acc)
    left = budget - len(acc) * base
    while left > 0:
        open_ = [i for i in range(len(acc)) if extra[i] < cap]
        shares = {i: weights[i] for i in open_ if weights[i] > 0} or {i: 1 for i in open_}
        total = sum(shares.values())
        ideal = {i: Fraction(left * w, total) for i, w in shares.items()}
        add = {i: math.floor(q) for i, q in ideal.items()}
        for i in sorted(shares, key=lambda i: (-(ideal[i] - add[i]), i))[:left - sum(add.values())]:
            add[i] += 1
        for i in shares:
            step = min(add[i], cap - extra[i])
            extra[i] += step
            left -= step
    return [base + e for e in extra], weights


def test_extra_weights_hand_example():
    """§8.5, n = 8: ET (N_max 32) [24 (26.13 capped), 11, 3, 1, 0]; HW (N_max 64) [56, 24, 8, 3, 0]."""
    et = dars_extra_weights(HAND_ACC, 8, variant="et", n_max_total=32)
    assert et.dtype == np.int32
    np.testing.assert_array_equal(et, [24, 11, 3, 1, 0])
    np.testing.assert_array_equal(dars_extra_weights(HAND_ACC, 8, variant="hw", n_max_total=64), [56, 24, 8, 3, 0])
    np.testing.assert_array_equal(dars_extra_weights(HAND_ACC, 8, variant="et", n_max_total=100), [27, 11, 3, 1, 0])
    np.testing.assert_array_equal(dars_extra_weights(np.array([5 / 8, 1.0], np.float32), 8, variant="hw",
                                                     n_max_total=64), [0, 0])


def test_extra_weights_at_exact_integers():
    """Where the ceil's argument is an integer: HW 24 and 8 at n = 8 (§8.6), float64 noise above 36 (HW, n = 18,
    K = 3) and float32 noise above 4 (ET, n = 12, K = 3: float32 gives 4.0000005) and 3 (ET, n = 24, K = 8)."""
    assert 18 * (1 - 2 * (3 / 18)) / (2 * (3 / 18)) > 36  # the float64 noise the guard is for
    def weight(k, n, variant):
        return int(dars_extra_weights(np.array([k / n], np.float32), n, variant=variant, n_max_total=n + 100)[0])
    assert weight(1, 8, "hw") == 24 and weight(2, 8, "hw") == 8
    assert weight(3, 18, "hw") == 36
    assert weight(3, 12, "et") == 4 and weight(8, 24, "et") == 3


@pytest.mark.parametrize("variant", ["et", "hw"])
def test_extra_weights_equal_the_published_float64_formula(variant):
    """Every K of every n <= 64 (one padded shape), uncapped and capped."""
    width = 65
    for n in range(1, 65):
        acc = np.array([k / n for k in range(n + 1)] + [1.0] * (width - n - 1), np.float32)
        for n_max_total in (n + 5000, 2 * n):
            want = [_published_delta(k / n, n, variant, n_max_total) for k in range(n + 1)]
            got = dars_extra_weights(acc, n, variant=variant, n_max_total=n_max_total)
            np.testing.assert_array_equal(np.asarray(got)[:n + 1], want, err_msg=f"n={n}, N_max={n_max_total}")


def _check_counts(counts, budget, n_pilot, n_max):
    counts = np.asarray(counts)
    assert counts.dtype == np.int32
    assert counts.sum() == budget and counts.min() >= n_pilot and counts.max() <= n_max, counts
    return counts


def test_counts_hand_examples():
    # §8.5: P = 4, B = 64, n = 8, ET weights [24, 11, 3, 0]: shares [20.21, 9.26, 2.53, 0] -> extras [20, 9, 3, 0].
    acc = np.array([0, 1 / 8, 1 / 4, 1 / 2], np.float32)
    np.testing.assert_array_equal(dars_counts(acc, 64, n_pilot=8, n_max=32, variant="et"), [28, 17, 11, 8])
    # Caps: ET weights [8, 8, 3, 0] at N_max 16, B2 = 20: shares 8.42, 8.42, 3.16, +1 to prompt 0 (the tie goes to
    # the lower index) capped at 8; the one left goes to prompt 2, the only open weighted prompt.
    np.testing.assert_array_equal(dars_counts(acc, 52, n_pilot=8, n_max=16, variant="et"), [16, 16, 12, 8])
    # Every weighted prompt full: what is left goes round-robin by index over the others.
    acc = np.array([0, 1 / 2, 1 / 2, 3 / 4], np.float32)
    np.testing.assert_array_equal(dars_counts(acc, 45, n_pilot=8, n_max=16, variant="et"), [16, 10, 10, 9])
    # sum Δn = 0: B2 = 7 round-robin by index.
    acc = np.array([0.5, 0.75, 1.0], np.float32)
    np.testing.assert_array_equal(dars_counts(acc, 19, n_pilot=4, n_max=8, variant="hw"), [7, 6, 6])
    # The pilot alone, and the full budget.
    np.testing.assert_array_equal(dars_counts(acc, 12, n_pilot=4, n_max=8), [4, 4, 4])
    np.testing.assert_array_equal(dars_counts(acc, 24, n_pilot=4, n_max=8), [8, 8, 8])


def test_counts_match_the_reference():
    rng = np.random.default_rng(0)
    for trial in range(60):
        num_prompts = int(rng.choice([3, 6]))  # two shapes: two compiles
        n = int(rng.choice([2, 4, 8, 12]))
        n_max = n + int(rng.integers(0, 4 * n + 1))
        variant = str(rng.choice(["et", "hw"]))
        # Mostly hard prompts (acc < 1/2, Δn > 0), some easy ones.
        k = np.where(rng.uniform(size=num_prompts) < 0.75, rng.integers(0, (n + 1) // 2, size=num_prompts),
                     rng.integers(0, n + 1, size=num_prompts))
        acc = (k / n).astype(np.float32)
        budget = int(rng.integers(num_prompts * n, num_prompts * n_max + 1))
        want, weights = _fixed_budget_reference(acc, budget, n, n_max, variant)
        counts = _check_counts(dars_counts(acc, budget, n_pilot=n, n_max=n_max, variant=variant), budget, n, n_max)
        np.testing.assert_array_equal(counts, want, err_msg=f"trial {trial}: acc={acc}, budget={budget}")
        # A prompt without extra weight gets second-phase rollouts only once every weighted prompt is full.
        weighted = np.array(weights) > 0
        if np.any(counts[~weighted] > n) and np.any(weighted):
            assert np.all(counts[weighted] == n_max)


def test_counts_under_jit_and_bad_inputs():
    acc = np.array([0, 1 / 8, 1 / 4, 1 / 2], np.float32)
    jitted = jax.jit(lambda a: dars_counts(a, 64, n_pilot=8, n_max=32, variant="et"))
    np.testing.assert_array_equal(jitted(acc), [28, 17, 11, 8])
    weights = jax.jit(lambda a: dars_extra_weights(a, 8, variant="hw", n_max_total=64, check=False))
    np.testing.assert_array_equal(weights(HAND_ACC), [56, 24, 8, 3, 0])
    with pytest.raises(ValueError, match="infeasible budget 31"):
        dars_counts(acc, 31, n_pilot=8, n_max=32)
    with pytest.raises(ValueError, match="infeasible budget 129"):
        dars_counts(acc, 129, n_pilot=8, n_max=32)
    with pytest.raises(ValueError, match="budget"):
        dars_counts(acc, 64.0, n_pilot=8, n_max=32)
    with pytest.raises(ValueError, match="variant"):
        dars_counts(acc, 64, n_pilot=8, n_max=32, variant="uniform")
    with pytest.raises(ValueError, match="acc_P must be raw pilot success fractions"):
        dars_counts(np.array([0.3, 0.5], np.float32), 16, n_pilot=8, n_max=32)
    with pytest.raises(ValueError, match="acc_P must be probabilities"):
        dars_extra_weights(np.array([1.5], np.float32), 8, n_max_total=32)
    with pytest.raises(ValueError, match="acc_P must have shape"):
        dars_extra_weights(np.zeros((2, 2), np.float32), 8, n_max_total=32)
    with pytest.raises(ValueError, match="n_max"):
        dars_counts(acc, 32, n_pilot=8, n_max=4)
    with pytest.raises(ValueError, match="n_max_total"):
        dars_extra_weights(acc, 8, n_max_total=4)
    with pytest.raises(ValueError, match="n_pilot"):
        dars_counts(acc, 32, n_pilot=0, n_max=8)


def test_counts_with_a_lower_bound_above_the_pilot_by_hand():
    """K = [0, 1, 4, 4] of a pilot of n0 = 4, counts in [8, 32], B = 59. Published Δn at the pilot's N = 4 (ET):
    acc 0 -> 0.5/4, ceil(4 (0.5 / 0.21875 - 1)) = ceil(5.14) = 6; acc 1/4: ceil(4 (0.5 / 0.375 - 1)) = 2; acc 1: 0.
    Every prompt is raised to the bound 8 first, and B - 4 x 8 = 27 goes 6 : 2, shares 20.25 and 6.75 -> [20, 7].
    (Read at N = 8, as if the pilot had 8 rollouts, the weights were [24, 3] and the counts [32, 11, 8, 8].)"""
    assert [_published_delta(k / 4, 4, "et", 32) for k in (0, 1, 4)] == [6, 2, 0]
    acc = np.array([0, 1 / 4, 1, 1], np.float32)
    counts = dars_counts(PilotFractions(acc, 4), 59, n_pilot=8, n_max=32, variant="et")
    np.testing.assert_array_equal(_check_counts(counts, 59, 8, 32), [28, 15, 8, 8])
    # A pilot of 2 under a bound of 3 (acc 1/2 is no multiple of 1/3: read at N = 3 it used to be refused). HW at
    # N = 2: acc 0 -> 1/4, ceil(2 (1 - 1/2) / (1/2)) = 2, then [0, 0]; B2 = 15 - 9 = 6: prompt 0 takes its cap 5, the
    # last one goes round-robin to prompt 1.
    assert [_published_delta(k / 2, 2, "hw", 8) for k in (0, 1, 2)] == [2, 0, 0]
    acc = np.array([0, 1 / 2, 1], np.float32)
    np.testing.assert_array_equal(dars_counts(PilotFractions(acc, 2), 15, n_pilot=3, n_max=8, variant="hw"),
                                  [8, 4, 3])


def test_counts_with_a_lower_bound_above_the_pilot_match_the_reference():
    rng = np.random.default_rng(1)
    for trial in range(40):
        num_prompts, n0 = 6, int(rng.choice([2, 3, 4, 8]))
        base = n0 + int(rng.integers(1, 2 * n0 + 1))
        n_max = base + int(rng.integers(0, 3 * n0 + 1))
        variant = str(rng.choice(["et", "hw"]))
        acc = (rng.integers(0, n0 + 1, size=num_prompts) / n0).astype(np.float32)
        budget = int(rng.integers(num_prompts * base, num_prompts * n_max + 1))
        want, _ = _fixed_budget_reference(acc, budget, n0, n_max, variant, base=base)
        counts = dars_counts(PilotFractions(acc, n0), budget, n_pilot=base, n_max=n_max, variant=variant)
        np.testing.assert_array_equal(_check_counts(counts, budget, base, n_max), want,
                                      err_msg=f"trial {trial}: acc={acc}, n0={n0}, base={base}, B={budget}")


def test_pilot_allocate_reads_the_schedule_at_the_pilot_size():
    counts = allocators.pilot_allocate(np.array([0, 1, 4, 4], np.float32), 4, 59, n_min=8, n_max=32,
                                      method="dars_et")
    np.testing.assert_array_equal(counts, [28, 15, 8, 8])
    counts = allocators.pilot_allocate(np.array([0, 1, 2], np.float32), 2, 15, n_min=3, n_max=8,
                                      method="dars_hw")
    np.testing.assert_array_equal(counts, [8, 4, 3])


def test_sizes_refused_at_run_time():
    """What dars_counts refuses besides an infeasible budget (check_sizes, which the config validation calls too):
    a pilot above 1024 (exact int32 schedule), n_max >= 2^31, or B2 (n_max - base) >= 2^31 (exact int32 shares)."""
    check_sizes(4, 4 * 1024 + 4, n0=1024, n_pilot=1024, n_max=1025)  # the largest pilot
    with pytest.raises(ValueError, match=r"pilot size n0 must be <= 1024 \(exact int32 arithmetic\), got 1025"):
        check_sizes(4, 4 * 1025 + 4, n0=1025, n_pilot=1025, n_max=1026)
    with pytest.raises(ValueError, match=r"pilot size n0 must be <= 1024 \(exact int32 arithmetic\), got 1025"):
        dars_counts(PilotFractions(np.zeros(4, np.float32), 1025), 4 * 1025, n_pilot=1025, n_max=1026)
    check_sizes(4, 4 * 3, n0=2, n_pilot=3, n_max=2**31 - 1)  # B2 = 0
    with pytest.raises(ValueError, match=r"n_max must be < 2\^31"):
        check_sizes(4, 4 * 3, n0=2, n_pilot=3, n_max=2**31)
    with pytest.raises(ValueError, match=r"n_max must be < 2\^31"):
        dars_counts(PilotFractions(np.zeros(4, np.float32), 2), 4 * 3, n_pilot=3, n_max=2**31)
    check_sizes(2, 2 * 2 + 2, n0=2, n_pilot=2, n_max=2 + (2**31 - 1) // 2)  # B2 (n_max - n_pilot) = 2^31 - 2
    with pytest.raises(ValueError, match=r"budget 6 is too large for exact int32 shares"):
        check_sizes(2, 2 * 2 + 2, n0=2, n_pilot=2, n_max=2 + 2**30)
    # A lower bound below the pilot is no bound: the pilot is spent.
    with pytest.raises(ValueError, match=r"n_pilot \(1\) must be >= the pilot size n0 \(2\)"):
        dars_counts(PilotFractions(np.zeros(2, np.float32), 2), 4, n_pilot=1, n_max=4)
