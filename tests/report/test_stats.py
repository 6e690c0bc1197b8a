"""Seed statistics against scipy.stats (computed here, independently of the code under test)."""

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import stdtrit

from sera_jax.report import stats


def _t_interval(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """scipy's 95% t-interval of the mean: (lo, hi)."""
    n = x.shape[axis]
    return sps.t.interval(0.95, n - 1, loc=np.mean(x, axis=axis), scale=sps.sem(x, axis=axis))


@pytest.mark.parametrize("n", [2, 3, 5, 17])
def test_mean_and_ci95_match_scipy(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0.3, 2.0, size=n)
    lo, hi = _t_interval(x)
    mean, half = stats.mean_and_ci95(x)
    np.testing.assert_allclose(mean, x.sum() / n, rtol=1e-12)
    np.testing.assert_allclose(half, (hi - lo) / 2, rtol=1e-10)
    mean_i, interval = stats.mean_and_interval95(x)
    np.testing.assert_allclose(mean_i, mean, rtol=1e-12)
    np.testing.assert_allclose(interval, [lo, hi], rtol=1e-10)


@pytest.mark.parametrize("n", [2, 4, 9])
def test_mean_and_ci95_along_axis_0_of_a_matrix(n):
    rng = np.random.default_rng(100 + n)
    x = rng.uniform(0, 1, size=(n, 5)) * np.arange(1, 6)  # columns with different spreads
    lo, hi = _t_interval(x, axis=0)
    mean, half = stats.mean_and_ci95(x)
    assert mean.shape == half.shape == (5,)
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(half, (hi - lo) / 2, rtol=1e-10)
    _, (lo_x, hi_x) = stats.mean_and_interval95(x, axis=0)
    np.testing.assert_allclose(lo_x, lo, rtol=1e-10)
    np.testing.assert_allclose(hi_x, hi, rtol=1e-10)
    # Along axis 1 the columns' roles swap.
    lo1, hi1 = _t_interval(x, axis=1)
    np.testing.assert_allclose(stats.mean_and_ci95(x, axis=1)[1], (hi1 - lo1) / 2, rtol=1e-10)


def test_single_value_has_no_interval():
    mean, half = stats.mean_and_ci95(np.array([0.25]))
    assert half is None and mean == 0.25
    mean, half = stats.mean_and_ci95(np.array([[0.5, 0.75]]))
    assert half is None
    np.testing.assert_array_equal(mean, [0.5, 0.75])
    assert stats.mean_and_interval95([0.25])[1] is None


# ------------------------------------------------------------------------------------------------ pairing

# Final pass@k (k = 1, 4) per seed. sera lacks seed 2 and lists its seeds in another order than uniform,
# so pairing by position would subtract the wrong baseline values.
UNIFORM = {0: [0.10, 0.40], 1: [0.30, 0.55], 2: [0.05, 0.20], 3: [0.22, 0.61]}
SERA = {3: [0.31, 0.66], 0: [0.12, 0.47], 1: [0.36, 0.58]}
GRPO = {0: [0.08, 0.35], 1: [0.27, 0.50], 2: [0.07, 0.26], 3: [0.18, 0.57]}


def _entry(per_seed: dict[int, list[float]]) -> dict:
    return {"seeds": list(per_seed),
            "pass_at_k": {"k": [1, 4], "per_seed": list(per_seed.values()), "seeds": list(per_seed)}}


def _expected_paired(method: dict[int, list[float]]) -> tuple[np.ndarray, np.ndarray, int]:
    diffs = np.array([np.subtract(v, UNIFORM[s]) for s, v in method.items() if s in UNIFORM])
    lo, hi = _t_interval(diffs, axis=0)
    return diffs.mean(axis=0), (hi - lo) / 2, len(diffs)


def test_paired_differences_pair_by_seed():
    methods = {"uniform": _entry(UNIFORM), "sera": _entry(SERA), "grpo": _entry(GRPO),
               "no_evals": {"seeds": [0, 1]}}
    out = stats.paired_differences(methods)
    assert set(out) == {"sera", "grpo"}  # not the baseline, not a method without pass@k
    for name, per_seed in (("sera", SERA), ("grpo", GRPO)):
        mean, half, num = _expected_paired(per_seed)
        assert out[name]["k"] == [1, 4] and out[name]["num_seeds"] == num
        np.testing.assert_allclose(out[name]["mean_diff"], mean, rtol=1e-12)
        np.testing.assert_allclose(out[name]["ci95"], half, rtol=1e-10)
    assert out["sera"]["num_seeds"] == 3
    # By hand for k = 1: sera - uniform on seeds 3, 0, 1 is 0.09, 0.02, 0.06.
    np.testing.assert_allclose(out["sera"]["mean_diff"][0], (0.09 + 0.02 + 0.06) / 3, rtol=1e-12)


def test_paired_differences_edge_cases():
    assert stats.paired_differences({"sera": _entry(SERA)}) == {}  # no baseline
    one_shared = stats.paired_differences({"uniform": _entry(UNIFORM), "sera": _entry({1: [0.4, 0.6], 7: [0.9, 1.0]})})
    assert one_shared["sera"]["num_seeds"] == 1 and one_shared["sera"]["ci95"] is None
    np.testing.assert_allclose(one_shared["sera"]["mean_diff"], [0.1, 0.05], rtol=1e-12)
    none_shared = stats.paired_differences({"uniform": _entry(UNIFORM), "sera": _entry({9: [0.4, 0.6]})})
    assert none_shared == {}
    other_base = stats.paired_differences({"uniform": _entry(UNIFORM), "sera": _entry(SERA)}, baseline="sera")
    assert set(other_base) == {"uniform"}
    np.testing.assert_allclose(other_base["uniform"]["mean_diff"], -_expected_paired(SERA)[0], rtol=1e-12)


# ----------------------------------------------------------------------------------------------- summaries


def _run(seed: int, finals: list[float], rollouts) -> dict:
    """A run as run_comparison collects it: a start evaluation, the final one, a short history."""
    evaluations = [{"k": [1, 2, 8], "pass_at_k": [0.0, 0.01, 0.02], "rollouts_spent": 0},
                   {"k": [1, 2, 8], "pass_at_k": finals, "rollouts_spent": rollouts}]
    return {"seed": seed, "rollouts_spent": rollouts, "evaluations": evaluations, "history": [{"step": 0}]}


def test_summarize_runs():
    runs = {
        "uniform": [_run(0, [0.2, 0.3, 0.6], np.int64(96)), _run(1, [0.1, 0.25, 0.5], 96.0),
                    _run(2, [0.3, 0.45, 0.7], 96)],
        "sera": [_run(0, [0.25, 0.4, 0.65], 96), _run(1, [0.15, 0.2, 0.6], 96), _run(2, [0.3, 0.5, 0.8], 96)],
        "single": [_run(5, [0.5, 0.6, 0.9], 32)],
        "untrained": [{"seed": 0, "rollouts_spent": 0, "evaluations": [], "history": []}],
    }
    out = stats.summarize_runs(runs)
    methods = out["methods"]
    assert set(methods) == set(runs)
    for name in ("uniform", "sera"):
        entry = methods[name]
        finals = np.array([r["evaluations"][-1]["pass_at_k"] for r in runs[name]])
        lo, hi = _t_interval(finals, axis=0)
        pk = entry["pass_at_k"]
        assert pk["k"] == [1, 2, 8]
        assert pk["per_seed"] == finals.tolist()
        np.testing.assert_allclose(pk["mean"], finals.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(pk["ci95"], (hi - lo) / 2, rtol=1e-10)
        assert entry["seeds"] == [0, 1, 2]
        assert entry["train_rollouts"] == [96, 96, 96] and all(type(r) is int for r in entry["train_rollouts"])
        assert entry["curves"] == [{"seed": r["seed"], "evaluations": r["evaluations"]} for r in runs[name]]
        assert entry["history"] == [{"seed": r["seed"], "every": 1, "steps": r["history"], "totals": {}}
                                    for r in runs[name]]
    assert methods["single"]["pass_at_k"]["ci95"] is None
    assert methods["single"]["pass_at_k"]["mean"] == [0.5, 0.6, 0.9]
    assert "pass_at_k" not in methods["untrained"] and methods["untrained"]["train_rollouts"] == [0]
    # Paired against uniform: sera on all three seeds; "single" (seed 5) shares none.
    assert set(out["paired_vs_uniform"]) == {"sera"}
    diffs = np.array([r["evaluations"][-1]["pass_at_k"] for r in runs["sera"]]) - np.array(
        [r["evaluations"][-1]["pass_at_k"] for r in runs["uniform"]])
    lo, hi = _t_interval(diffs, axis=0)
    paired = out["paired_vs_uniform"]["sera"]
    assert paired["num_seeds"] == 3
    np.testing.assert_allclose(paired["mean_diff"], diffs.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(paired["ci95"], (hi - lo) / 2, rtol=1e-10)


@pytest.mark.parametrize("side", ["uniform", "sera"])
def test_a_seed_without_evaluations_is_left_out_of_the_pairs(side):
    """Seed 1 of one method never evaluated: the pairs are seeds 0 and 2, each with its own seed's baseline."""
    finals = {"uniform": {0: [0.2, 0.6], 1: [0.1, 0.5], 2: [0.3, 0.7]},
              "sera": {0: [0.25, 0.65], 1: [0.9, 0.9], 2: [0.28, 0.8]}}
    runs = {m: [_run(seed, f, 96) for seed, f in by_seed.items()] for m, by_seed in finals.items()}
    runs[side][1] = {"seed": 1, "rollouts_spent": 0, "evaluations": [], "history": []}
    out = stats.summarize_runs(runs)
    assert out["methods"][side]["pass_at_k"]["seeds"] == [0, 2]
    paired = out["paired_vs_uniform"]["sera"]
    assert paired["num_seeds"] == 2
    np.testing.assert_allclose(paired["mean_diff"], [(0.05 - 0.02) / 2, (0.05 + 0.1) / 2], rtol=1e-12)


def test_runs_from_summary_inverts_summarize_runs():
    runs = {"uniform": [_run(0, [0.2, 0.3, 0.6], 96), _run(3, [0.1, 0.2, 0.4], 64)],
            "sera": [{"seed": 0, "rollouts_spent": 0, "evaluations": [], "history": []}]}
    back = stats.runs_from_summary(stats.summarize_runs(runs))
    assert {m: [{k: v for k, v in r.items() if k != "totals"} for r in rs] for m, rs in back.items()} == runs


def _history(num_steps: int, rng) -> list[dict]:
    return [{"step": s, "loss": float(rng.normal()), "rollouts_sampled": float(rng.integers(8, 64)),
             "tokens_sampled": float(rng.integers(100, 900)), "step_seconds": float(rng.uniform(1, 2))}
            for s in range(num_steps)]


def test_a_summary_keeps_a_thinned_history_and_the_totals_of_every_step():
    """200 steps: every 10th and the last (21 rows), the sums over all 200; pooling the summary again (as an
    invocation that keeps earlier runs does) neither thins further nor changes the totals."""
    rng = np.random.default_rng(0)
    history = _history(200, rng)
    run = {"seed": 0, "rollouts_spent": 200 * 32, "evaluations": [], "history": history}
    kept = stats.summarize_runs({"uniform": [run]})["methods"]["uniform"]["history"][0]
    assert kept["every"] == 10
    assert [h["step"] for h in kept["steps"]] == list(range(0, 200, 10)) + [199]
    assert kept["steps"][3] == history[30]
    for name in ("rollouts_sampled", "tokens_sampled", "step_seconds"):
        assert kept["totals"][name] == pytest.approx(sum(h[name] for h in history), rel=1e-12)
    assert set(kept["totals"]) == {"rollouts_sampled", "tokens_sampled", "step_seconds"}  # loss is no total
    again = stats.summarize_runs(stats.runs_from_summary(stats.summarize_runs({"uniform": [run]})))
    assert again["methods"]["uniform"]["history"][0] == kept
    short = _history(7, rng)  # fewer steps than HISTORY_POINTS: all kept
    assert stats.summarize_history({"seed": 1, "history": short})["steps"] == short


def test_history_totals_need_every_step():
    rng = np.random.default_rng(1)
    history = _history(30, rng)
    assert stats.history_totals(history[::2]) is None
    assert stats.history_totals(history[1:]) is None
    assert stats.history_totals(history)["rollouts_sampled"] == sum(h["rollouts_sampled"] for h in history)


def test_minimum_detectable_effect_has_the_power_it_claims():
    """Simulated paired t-tests with the true difference set to the MDE reject H0 about 80% of the time."""
    rng = np.random.default_rng(0)
    for n in (5, 10, 20):
        mde = float(stats.minimum_detectable_effect(1.0, n))
        diffs = rng.normal(mde, 1.0, size=(20000, n))
        t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / np.sqrt(n))
        power = np.mean(np.abs(t) > stdtrit(n - 1, 0.975))
        assert 0.76 <= power <= 0.82, (n, power)  # the t approximation's error, +- 3 standard errors
    assert stats.minimum_detectable_effect(1.0, 1) is None
    out = stats.paired_differences({"uniform": _entry(UNIFORM), "sera": _entry(SERA)})["sera"]
    diffs = np.array([np.subtract(v, UNIFORM[s]) for s, v in SERA.items()])
    np.testing.assert_allclose(out["mde80"], (stdtrit(2, 0.975) + stdtrit(2, 0.8)) * diffs.std(0, ddof=1) / np.sqrt(3))


def test_fieller_with_a_constant_denominator_is_the_t_interval_scaled():
    """b without spread: Fieller's set is {r : |a - r b| <= t se(a)}, the numerator's t-interval divided by b."""
    rng = np.random.default_rng(0)
    a = rng.normal(0.2, 0.1, size=6)
    for b in (0.5, -0.5):
        ratio, (lo, hi) = stats.ratio_of_paired_means(a, np.full(6, b))
        t_lo, t_hi = _t_interval(a)
        np.testing.assert_allclose(ratio, a.mean() / b, rtol=1e-12)
        np.testing.assert_allclose(sorted([lo, hi]), sorted([t_lo / b, t_hi / b]), rtol=1e-9)


def test_fieller_interval_covers_the_true_ratio_95_percent_of_the_time():
    """Correlated normal pairs, n = 8 (Fieller is exact there), the denominator's mean 7 of its SEs from 0 (so the
    interval is bounded): coverage 0.95 within 3.5 Monte Carlo SEs (a normal quantile in place of t's covers ~0.91)."""
    rng = np.random.default_rng(1)
    true_ratio, sims, n = 0.6, 3000, 8
    cov = np.array([[1.0, 0.5], [0.5, 1.0]]) * 0.04
    covered = 0
    for _ in range(sims):
        pairs = rng.multivariate_normal([true_ratio * 0.5, 0.5], cov, size=n)
        _, interval = stats.ratio_of_paired_means(pairs[:, 0], pairs[:, 1])
        assert interval is not None
        covered += interval[0] <= true_ratio <= interval[1]
    assert abs(covered / sims - 0.95) < 3.5 * np.sqrt(0.95 * 0.05 / sims)


def test_fieller_interval_is_unbounded_when_the_denominator_could_be_zero():
    rng = np.random.default_rng(2)
    b = rng.normal(0.0, 1.0, size=5)
    b -= b.mean() - 0.01  # mean 0.01, far inside its own t-interval around 0
    ratio, interval = stats.ratio_of_paired_means(rng.normal(1.0, 0.1, size=5), b)
    assert interval is None and abs(ratio) > 10
    assert stats.ratio_of_paired_means(np.array([1.0]), np.array([2.0])) == (0.5, None)
    with pytest.raises(ValueError, match="shapes"):
        stats.ratio_of_paired_means(np.ones(3), np.ones(4))
