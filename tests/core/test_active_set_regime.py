"""When the released rule gives prompts zero rollouts after the uniform epoch 0 (docs/method.md §3.4).

After epoch 0 every prompt's epoch estimate is p-hat = (a0 + k) / (a0 + b0 + N0) from its k successes of N0. The
cases here are one step of P = 256 such prompts under the authors' budget B = P N0, n_min 2, n_max 4 N0: a share
of them all-fail (k = 0) and the rest at k spread evenly over [0, N0] (``np.linspace``, the ends excluded, rounded:
at the top they include all-pass prompts, k = N0).
"""

import numpy as np
import pytest

import sera_jax.core as core
from tests.core import released_reference as reference

A0 = B0 = 0.5  # the authors' Beta prior
THRESHOLD, N_MIN = 0.05, 2


def epoch0_estimates(all_fail_share: float, n0: int, num: int = 256) -> tuple[np.ndarray, int]:
    """(p-hat of the ``num`` prompts after a uniform epoch 0 of ``n0`` rollouts each, how many are all-fail)."""
    num_fail = int(all_fail_share * num)
    k_rest = np.round(np.linspace(0, n0, num - num_fail + 2)[1:-1]).astype(int)
    k = np.concatenate([np.zeros(num_fail, int), k_rest])
    return (A0 + k) / (A0 + B0 + n0), num_fail


def dropped(all_fail_share: float, n0: int) -> tuple[int, int]:
    """(all-fail prompts given zero rollouts, other prompts given zero rollouts) by the authors' rule."""
    p, num_fail = epoch0_estimates(all_fail_share, n0)
    counts = reference.released_counts(p, p.size * n0, N_MIN, 4 * n0, threshold=THRESHOLD)[0]
    return int(np.sum(counts[:num_fail] == 0)), int(np.sum(counts[num_fail:] == 0))


def all_pass_mixed_chance_at_n_min(n0) -> np.ndarray:
    """An all-pass prompt's chance of a mixed group at n_min after epoch 0: 1 - p^2 - (1-p)^2 = 2 p (1 - p)."""
    p = (np.asarray(n0, np.float64) + A0) / (A0 + B0 + np.asarray(n0, np.float64))
    return 1 - p**N_MIN - (1 - p) ** N_MIN


def test_the_score_test_drops_nothing_after_epoch_0():
    # All-fail and all-pass prompts share the lowest score, 1 - (1 - eps)^(4 N0) - eps^(4 N0) with
    # eps = a0 / (a0 + b0 + N0), about 1 - exp(-2) = 0.86 at every N0: far above the threshold.
    for n0 in (4, 16, 19, 128, 1024):
        eps = A0 / (A0 + B0 + n0)
        lowest = reference.mixed_chance(np.array([eps, 1 - eps]), np.full(2, 4 * n0))
        assert np.all(lowest > 0.8) and lowest[0] == pytest.approx(lowest[1])


def test_the_count_test_starts_dropping_at_n0_19():
    # The waterline holds the easiest prompts at n_min; an all-pass prompt's mixed chance there, about 1 / (N0 + 1),
    # falls under the threshold from N0 = 19 on (18.5 / 361 = 0.0512 at 18, 19.5 / 400 = 0.0488 at 19).
    chances = all_pass_mixed_chance_at_n_min(np.arange(1, 200))
    assert int(np.argmax(chances < THRESHOLD)) + 1 == 19
    assert np.all(chances[18:] < THRESHOLD) and np.all(chances[:18] >= THRESHOLD)
    for share in (0.1, 0.3, 0.5):
        assert dropped(share, 16) == (0, 0) and dropped(share, 18) == (0, 0)
        assert sum(dropped(share, 19)) > 0


def test_at_the_authors_n0_128_the_hopeless_prompts_go():
    # The all-fail prompts would each take n_max = 4 N0 rollouts: with 30% of them the rest are starved to n_min,
    # the count test fails on the easiest, and the search shrinks the active set from the lowest scores, where the
    # all-fail (and all-pass) prompts tie.
    assert dropped(0.3, 128) == (32, 0)
    assert dropped(0.5, 128) == (78, 0)
    assert dropped(0.1, 128) == (0, 0)  # with 10% all-fail the budget serves them all
    # The jitted rule gives the same counts as the restatement.
    p, num_fail = epoch0_estimates(0.3, 128)
    ours = np.asarray(core.released_allocation(p, 256 * 128, n_min=N_MIN, n_max=512).counts_P)
    theirs = reference.released_counts(p, 256 * 128, N_MIN, 512)[0]
    np.testing.assert_array_equal(ours, theirs)
    assert int(np.sum(ours[:num_fail] == 0)) == 32


def test_all_fail_prompts_fail_the_count_test_only_many_to_a_step_with_evidence_near_its_cap():
    # 8 prompts a step at N0 = 128 (B = 1,024, n_max 512): k all-fail prompts with F failures of evidence beside
    # mid-rate ones. They need about 0.103 (1 + F) rollouts each: at F = 2,048 (the cap 16 N0) the budget serves 4.
    def dropped_of_8(k, evidence):
        p = np.array([A0 / (A0 + B0 + evidence)] * k + [0.3] * (8 - k))
        counts = reference.released_counts(p, 8 * 128, N_MIN, 512, threshold=THRESHOLD)[0]
        return int(np.sum(counts[:k] == 0))

    assert [dropped_of_8(k, 128) for k in range(1, 9)] == [0] * 8  # after epoch 0: never
    assert [dropped_of_8(k, 1024) for k in range(1, 9)] == [0] * 8
    assert [dropped_of_8(k, 2048) for k in range(1, 9)] == [0, 0, 0, 0, 1, 2, 3, 4]


def test_a_near_certain_prompt_takes_hopeless_ones_out_of_its_step():
    # 8 prompts a step at N0 = 128 after epoch 0 (B = 1,024, n_max 512). Three all-fail prompts beside mid-rate
    # ones are all served. Put one prompt at 126 successes of 128 among them (p-hat 0.981: at n_min = 2 its mixed
    # chance, 0.038, is under the threshold) and the count test fails on it; the search drops the lowest scores,
    # two of the all-fail prompts, until the waterline lifts it to a mixed group's chance >= 0.05.
    def counts(successes):
        p = (A0 + np.asarray(successes)) / (A0 + B0 + 128)
        theirs = reference.released_counts(p, 1024, N_MIN, 512, threshold=THRESHOLD)[0]
        ours = np.asarray(core.released_allocation(p, 1024, n_min=N_MIN, n_max=512).counts_P)
        np.testing.assert_array_equal(ours, theirs)
        return theirs

    assert np.all(counts([0, 0, 0, 100, 91, 60, 110, 30]) > 0)
    near_certain = counts([0, 0, 0, 126, 91, 60, 110, 30])
    assert int(np.sum(near_certain[:3] == 0)) == 2 and np.all(near_certain[3:] > 0)
    mixed_chance = reference.mixed_chance(np.array([126.5 / 129]), near_certain[3:4])
    assert mixed_chance[0] >= THRESHOLD
    # With one all-fail prompt the budget lifts the near-certain one without dropping any.
    assert np.all(counts([0, 126, 64, 64, 64, 64, 64, 64]) > 0)
    # With hard mid-rate prompts (an 11x11 maze's), nothing is near-certain: five all-fail prompts stay.
    assert np.all(counts([0, 0, 6, 10, 0, 0, 83, 0]) > 0)
