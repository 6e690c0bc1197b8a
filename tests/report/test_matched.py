"""Coverage at matched pass@1 (sera_jax.report.matched) on constructed curves whose answer is known by hand."""

import numpy as np
import pytest

from sera_jax.report import matched


def _curve(seed, points, ks=(1, 32)):
    """A run's curve from (step, pass@1, pass@32) points."""
    return {"seed": seed, "evaluations": [{"step": s, "k": list(ks), "pass_at_k": [p1, p32]} for s, p1, p32 in points]}


def test_interpolates_each_reference_path_and_averages_the_crossings():
    # Two uniform learning rates from one start (0.10, 0.70). The fast one crosses pass@1 0.11 halfway between
    # its steps 50 and 100 (pass@32 0.69 -> 0.67: 0.68); the slow one reaches 0.11 exactly at step 100 (0.66).
    fast = _curve(0, [(0, 0.10, 0.70), (50, 0.105, 0.69), (100, 0.115, 0.67), (150, 0.12, 0.66)])
    slow = _curve(0, [(0, 0.10, 0.70), (50, 0.102, 0.69), (100, 0.11, 0.66), (150, 0.108, 0.70)])
    sera = _curve(0, [(0, 0.10, 0.70), (150, 0.11, 0.72)])
    out = matched.matched_pass_at_1({"sera": [sera], "fast": [fast], "slow": [slow]}, "sera", ["fast", "slow"], 32)
    (row,) = out["per_seed"]
    assert row["reference_pass_at_k"] == pytest.approx((0.68 + 0.66) / 2)
    assert row["diff"] == pytest.approx(0.72 - 0.67)
    assert row["clamped"] is None and out["num_clamped"] == 0


def test_first_crossing_not_a_later_one():
    # The path crosses 0.11 going up (step 50 -> 100) and again coming down (150 -> 200): the first one counts.
    path = matched.evaluation_path(
        _curve(0, [(0, 0.10, 0.7), (100, 0.12, 0.5), (200, 0.10, 0.9)])["evaluations"], 32)
    assert matched.first_crossing(path, 0.11) == pytest.approx(0.6)


def test_outside_the_range_takes_the_nearest_end_and_says_so():
    ref = _curve(0, [(0, 0.10, 0.70), (100, 0.12, 0.60)])
    above = _curve(0, [(0, 0.10, 0.70), (100, 0.13, 0.65)])
    below = _curve(0, [(0, 0.10, 0.70), (100, 0.09, 0.72)])
    out = matched.matched_pass_at_1({"t": [above], "u": [ref]}, "t", ["u"], 32)
    assert out["per_seed"][0]["clamped"] == "above"
    assert out["per_seed"][0]["reference_pass_at_k"] == pytest.approx(0.60)
    out = matched.matched_pass_at_1({"t": [below], "u": [ref]}, "t", ["u"], 32)
    assert out["per_seed"][0]["clamped"] == "below"
    assert out["per_seed"][0]["reference_pass_at_k"] == pytest.approx(0.70)


def test_over_seeds_a_t_interval_of_the_paired_differences():
    rng = np.random.default_rng(0)
    diffs = rng.normal(0.02, 0.01, size=6)
    curves = {"t": [], "u": []}
    for seed, d in enumerate(diffs):
        curves["u"].append(_curve(seed, [(0, 0.10, 0.70), (100, 0.12, 0.60)]))
        curves["t"].append(_curve(seed, [(0, 0.10, 0.70), (100, 0.11, 0.65 + d)]))  # reference there: 0.65
    curves["u"].append(_curve(99, [(0, 0.10, 0.70)]))  # a seed the treated method lacks: not paired
    out = matched.matched_pass_at_1(curves, "t", ["u"], 32)
    assert out["num_seeds"] == 6
    assert out["mean_diff"] == pytest.approx(diffs.mean())
    assert out["ci95"] == pytest.approx(2.570582 * diffs.std(ddof=1) / np.sqrt(6), rel=1e-5)


def test_a_missing_k_or_method_is_named():
    curve = _curve(0, [(0, 0.1, 0.7)], ks=(1, 16))
    with pytest.raises(ValueError, match="pass@32"):
        matched.matched_pass_at_1({"t": [curve], "u": [curve]}, "t", ["u"], 32)
    with pytest.raises(ValueError, match=r"\['v'\]"):
        matched.matched_pass_at_1({"t": [curve], "u": [curve]}, "t", ["v"], 16)


def test_a_comparisons_endpoint_has_the_primary_on_top_and_every_other_pair_secondary():
    import ml_collections

    from sera_jax.report.matched import matched_endpoints

    ks = (1, 16, 32)
    ref = {"seed": 0, "evaluations": [{"step": 0, "k": list(ks), "pass_at_k": [0.1, 0.5, 0.7]},
                                      {"step": 100, "k": list(ks), "pass_at_k": [0.2, 0.4, 0.6]}]}
    treated = {"seed": 0, "evaluations": [{"step": 100, "k": list(ks), "pass_at_k": [0.15, 0.5, 0.7]}]}
    spec = ml_collections.ConfigDict(dict(treated=("a", "b"), references=("u",), k=32, other_ks=(16,)))
    out = matched_endpoints({"a": {"curves": [treated]}, "b": {"curves": [treated]}, "u": {"curves": [ref]}}, spec)
    assert (out["treated"], out["k"]) == ("a", 32) and out["mean_diff"] == pytest.approx(0.7 - 0.65)
    assert [(s["treated"], s["k"]) for s in out["secondary"]] == [("a", 16), ("b", 32), ("b", 16)]


def test_a_spec_naming_an_unknown_method_or_a_k_not_evaluated_is_refused():
    from experiments.maze import config as maze_config
    from sera_jax.report.matched import matched_endpoints
    from sera_jax.rl.comparison import check_matched_spec

    config = maze_config.get_config("cpu_frontier")
    check_matched_spec(config, maze_config.METHODS)
    config.methods = ("uniform_lr_1e-6",)  # an invocation may run one arm: the endpoint waits for the rest
    check_matched_spec(config, maze_config.METHODS)
    assert matched_endpoints({"uniform_lr_1e-6": {"curves": []}}, config.matched_pass_at_1) is None
    with pytest.raises(ValueError, match="matched_pass_at_1.references.*uniform_lr_3e-6"):
        check_matched_spec(config, {m: {} for m in maze_config.METHODS if m != "uniform_lr_3e-6"})
    config = maze_config.get_config("cpu_frontier")
    config.eval.ks = (1, 2, 4)
    with pytest.raises(ValueError, match=r"k=\[32, 16, 64, 128\]"):
        check_matched_spec(config, maze_config.METHODS)
