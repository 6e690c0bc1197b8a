"""The released SERA rule (``core.released_rule``, registered as ``sera``) against the authors' rule restated in
NumPy (``released_reference``), against cases worked out by hand, and through the registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sera_jax.core as core
from sera_jax.core import released_rule
from tests.core import released_reference as reference


def _counts(p, budget, **kw):
    return np.asarray(released_rule.released_allocation(jnp.asarray(p), budget, **kw).counts_P)


# -- hand-computed cases -------------------------------------------------------------------------------------


def test_a_hopeless_prompt_gets_no_rollouts_and_the_rest_share_the_budget():
    """p = [0.5, 1e-4, 0.5, 0.5], B = 16 (N0 4), n_max 16. Scores at the cap: u(1e-4) = 1 - 0.9999^16 - 1e-64
    = 0.0016 < 0.05, the three p = 0.5 prompts score 1 - 2^-15. ceil(16 / 16) = 1 prompt must be active; the
    search over k in [1, 3] tries k = 2 (8 each: mixed chance 1 - 2^-7, passes), then k = 3: three equal prompts
    share 16: floor(16/3) = 5 each, one left, growth equal for all three, so prompt 0 (lowest index) gets it:
    [6, 0, 5, 5], every mixed chance >= 1 - 2^-4 passes. So k = 3."""
    np.testing.assert_array_equal(_counts([0.5, 1e-4, 0.5, 0.5], 16, n_min=2, n_max=16), [6, 0, 5, 5])


def test_equal_factors_follow_the_closed_form():
    """Two active prompts with q1 = 1/2 and q2 = 1/4 (lambda2 = 2 lambda1): equal factors mean N - 1 = tau / lambda,
    so the first takes twice the second's extra rollouts, N1 - 1 = 2 (N2 - 1), and with B = 16 the continuous
    counts are 10.67 and 5.33. Floors 10 and 5 leave one rollout, which goes to the prompt whose squared distance
    to the level 1 - e^-tau grows least (computed here from the closed form, not from the rule)."""
    p = np.array([0.5, 0.75])
    tau, cont = reference.waterline(p, 16, 2, 64)
    lam = -np.log1p(-p)
    np.testing.assert_allclose(cont, 1 + tau / lam, rtol=1e-9)
    np.testing.assert_allclose(cont.sum(), 16, rtol=1e-9)
    np.testing.assert_allclose(cont[0] - 1, 2 * (cont[1] - 1), rtol=1e-9)
    # Floors 10 and 5; one rollout left. Growth of (s(N+1) - t)^2 - (s(N) - t)^2 with t = 1 - e^-tau:
    t = 1 - np.exp(-tau)
    growth = [(1 - q ** n - t) ** 2 - (1 - q ** (n - 1) - t) ** 2 for q, n in ((0.5, 10), (0.25, 5))]
    expected = [10, 5]
    expected[int(np.argmin(growth))] += 1
    np.testing.assert_array_equal(_counts(p, 16, n_min=2, n_max=64), expected)


def test_too_few_eligible_prompts_activates_the_best_ones_anyway():
    """Only one prompt is eligible, but B = 24 with n_max 8 needs ceil(24 / 8) = 3 active prompts: the three with
    the highest scores are active (the third one below the threshold), all at the cap, the fourth gets 0."""
    p = [0.5, 1e-5, 2e-5, 1e-6]
    counts = _counts(p, 24, n_min=2, n_max=8)
    np.testing.assert_array_equal(counts, [8, 8, 8, 0])


def test_every_prompt_active_at_the_budget_floor():
    """B = P n_min: every active prompt sits at n_min."""
    np.testing.assert_array_equal(_counts([0.3, 0.5, 0.7, 0.4], 8, n_min=2, n_max=8), [2, 2, 2, 2])


def test_a_pilot_floor_keeps_the_inactive_prompts_rollouts():
    """floor = 2 (a pilot of 2 a prompt): the hopeless prompt keeps its 2, the others share B - 2."""
    counts = _counts([0.5, 1e-5, 0.5], 20, n_min=2, n_max=16, floor=2)
    assert counts[1] == 2 and counts.sum() == 20 and counts[0] + counts[2] == 18


# -- against the authors' rule restated ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_equals_the_released_rule_on_generated_cases(dtype, request):
    """The issue's 240 generated cases (P 32-256, N0 4-128, n_max = 4 N0, five Beta shapes): identical counts and
    active sets in float32 and float64 (the rule's float32 growth rounds like the authors' float64, see _growth);
    most cases give some prompt zero rollouts."""
    if dtype == "float64":
        request.getfixturevalue("x64")
    cases = reference.generated_cases()
    with_zeros = 0
    for i, (p, budget, n_min, n_max) in enumerate(cases):
        counts, active, _ = reference.released_counts(p, budget, n_min, n_max)
        out = released_rule.released_allocation(jnp.asarray(p, dtype), budget, n_min=n_min, n_max=n_max)
        np.testing.assert_array_equal(np.asarray(out.counts_P), counts, err_msg=f"case {i}")
        np.testing.assert_array_equal(np.asarray(out.active_P), active, err_msg=f"case {i}")
        with_zeros += bool((counts == 0).any())
    assert len(cases) == 240 and with_zeros >= 150


def test_floor_mode_equals_the_released_rule():
    rng = np.random.default_rng(7)
    for trial in range(20):
        # A few prompt counts (each compiles the rule once), every draw of p and N0 new.
        num, n0 = int(rng.choice((4, 13, 39))), int(rng.integers(2, 9))
        p = np.clip(rng.beta(0.3, 2.0, num), 1e-6, 1 - 1e-6)
        budget = num * n0 * 2
        counts, active, _ = reference.released_counts(p, budget, n0, 4 * n0, floor=n0)
        np.testing.assert_array_equal(_counts(p, budget, n_min=n0, n_max=4 * n0, floor=n0), counts,
                                      err_msg=f"trial {trial}")


def test_invariants():
    """Sum = B; active counts in [n_min, n_max]; inactive 0; active prompts are the top scores (a prefix)."""
    rng = np.random.default_rng(3)
    for _ in range(30):
        num, n0 = int(rng.choice((1, 5, 17, 59))), int(rng.integers(2, 20))  # few shapes: see the floor-mode test
        p = jnp.asarray(np.clip(rng.beta(0.4, 1.5, num), 1e-6, 1 - 1e-6), jnp.float32)
        out = released_rule.released_allocation(p, num * n0, n_min=2, n_max=4 * n0)
        counts, active, score = (np.asarray(x) for x in (out.counts_P, out.active_P, out.score_P))
        assert counts.sum() == num * n0
        assert ((counts >= 2) & (counts <= 4 * n0))[active].all() and (counts[~active] == 0).all()
        if active.any() and (~active).any():
            assert score[active].min() >= score[~active].max()


def test_jit_and_no_recompile_across_budgets():
    """Budget and bounds are traced: one compilation per (P, dtype)."""
    p = jnp.asarray([0.1, 0.4, 0.01, 0.8])
    released_rule.released_allocation(p, 16, n_min=2, n_max=16)
    before = released_rule._released_impl._cache_size()
    for budget, n_max in ((12, 8), (20, 20), (32, 32)):
        released_rule.released_allocation(p, budget, n_min=2, n_max=n_max)
    assert released_rule._released_impl._cache_size() == before
    jitted = jax.jit(lambda q: released_rule.released_allocation(q, 16, n_min=2, n_max=16, check=False).counts_P)
    np.testing.assert_array_equal(jitted(p), _counts(p, 16, n_min=2, n_max=16))


@pytest.mark.parametrize("kwargs, match", [
    (dict(p=[0.5, np.nan], budget=8, n_max=8), "p_P must be probabilities"),
    (dict(p=[0.5, 1.5], budget=8, n_max=8), "p_P must be probabilities"),
    (dict(p=[[0.5]], budget=8, n_max=8), r"shape \(P,\)"),
    (dict(p=[0.5, 0.5], budget=100, n_max=8), "infeasible budget 100"),
    (dict(p=[0.5, 0.5], budget=3, n_max=8), "infeasible budget 3"),
    (dict(p=[0.5, 0.5], budget=8, n_max=8, n_min=9), r"n_min \(9\)"),
    (dict(p=[0.5, 0.5], budget=8, n_max=8, floor=8), r"floor \(8\)"),
    (dict(p=[0.5, 0.5], budget=8, n_max=8, threshold=1.5), "threshold"),
    (dict(p=[0.5, 0.5], budget=8.0, n_max=8), "budget must be a static Python integer"),
])
def test_bad_input_is_named(kwargs, match):
    kwargs = dict(kwargs)
    p = kwargs.pop("p")
    with pytest.raises(ValueError, match=match):
        released_rule.released_allocation(jnp.asarray(p, jnp.float32), kwargs.pop("budget"), **kwargs)


# -- through the registry ---------------------------------------------------------------------------------------


def test_registry_sera_is_the_released_rule_and_sera_all_active_the_max_min():
    p = jnp.asarray([0.5, 1e-4, 0.5, 0.5])
    np.testing.assert_array_equal(core.get_allocator("sera").counts(p, 16, n_min=2, n_max=16), [6, 0, 5, 5])
    all_active = np.asarray(core.get_allocator("sera_all_active").counts(p, 16, n_min=2, n_max=16))
    assert (all_active >= 2).all() and all_active[1] == 16 - 3 * 2  # the max–min feeds the hardest prompt first
    assert core.get_allocator("sera").may_skip_prompts and not core.get_allocator("sera_all_active").may_skip_prompts


def test_registry_sera_refuses_a_posterior():
    post = core.BetaPosterior(jnp.ones(4), jnp.ones(4))
    with pytest.raises(ValueError, match="point estimates"):
        core.get_allocator("sera").counts(post, 16, n_min=2, n_max=16)


def test_a_pilot_keeps_its_rollouts_for_skipped_prompts():
    """pilot_allocate hands the pilot's n0 as the floor: no prompt ends below it."""
    counts = np.asarray(core.pilot_allocate(jnp.asarray([0.0, 2.0, 1.0, 0.0]), 2, 32, n_min=2, n_max=16))
    assert counts.sum() == 32 and counts.min() >= 2


def test_group_outcomes_by_hand():
    """Groups: [0 of 0 (unsampled), 0 of 4 (all fail), 2 of 4 (mixed), 3 of 3 (all pass), 1 of 4 (mixed)]."""
    m = core.group_outcomes(jnp.asarray([0.0, 0.0, 2.0, 3.0, 1.0]), jnp.asarray([0, 4, 4, 3, 4]),
                            jnp.asarray([0.1, 0.2, 0.5, 0.9, 0.3]))
    assert float(m["active_frac"]) == pytest.approx(0.8)
    np.testing.assert_allclose([float(m[k]) for k in ("useful_group_fraction", "all_fail_group_fraction",
                                                       "all_pass_group_fraction")], [0.5, 0.25, 0.25])
    assert float(m["rollouts_unmixed"]) == 7 and float(m["rollouts_unmixed_frac"]) == pytest.approx(7 / 15)
    expected = ((1 - 0.8**4 - 0.2**4) + (1 - 0.5**4 - 0.5**4) + (1 - 0.1**3 - 0.9**3) + (1 - 0.7**4 - 0.3**4)) / 4
    np.testing.assert_allclose(float(m["useful_group_fraction_expected"]), expected, rtol=1e-6)


@pytest.mark.parametrize("aggregation", ["sequence_sum", "sequence_mean", "token_mean", "token_mean_microbatch"])
def test_zero_count_prompts_flow_through_layout_advantages_and_weights(aggregation):
    """Counts [3, 0, 5, 0] of B = 8 rows: the flat layout holds no row of prompts 1 and 3; advantages and weights
    are finite, a corrected prompt's rollouts weigh 1 / (P N_i) (sequence_sum: prompts 0 and 2 weigh 1/4 each,
    the skipped ones nothing, as the authors' N0 / N_i inside a mean over all B rows)."""
    counts = jnp.asarray([3, 0, 5, 0])
    ids = core.prompt_ids_from_counts(counts, 8)
    np.testing.assert_array_equal(ids, [0, 0, 0, 2, 2, 2, 2, 2])
    rewards = jnp.asarray([1, 0, 0, 0, 0, 0, 0, 0], jnp.float32)
    adv = core.advantages(rewards, ids, 4, "maxrl")
    assert np.all(np.isfinite(np.asarray(adv)))
    np.testing.assert_allclose(np.asarray(adv)[:3], [2.0, -1.0, -1.0], rtol=1e-6)  # (r - 1/3) / (1/3)
    mask = jnp.ones((8, 3), bool)
    w = np.asarray(core.loss_weights(ids, 4, token_mask_BxR=mask, aggregation=aggregation, correction=True))
    assert np.all(np.isfinite(w))
    if aggregation == "sequence_sum":
        np.testing.assert_allclose(w[:, 0], [1 / 12] * 3 + [1 / 20] * 5, rtol=1e-6)
