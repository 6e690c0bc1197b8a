"""More views of scripts/readme_results.py on hand-made files: the allocation view's mixed groups after epoch 0 and
its every-step diagnostics, and the headline's regime note (every cell computed here by hand)."""

import json

import pytest

from tests.test_readme import _readme_results


def _history(seed, mixed, every=1, by_step=False):
    steps = [{"step": i * every, "active_frac": 1.0, "rollouts_unmixed_frac": 0.0, "all_fail_group_fraction": 0.5,
              "all_pass_group_fraction": 0.0, "useful_group_fraction": m} for i, m in enumerate(mixed)]
    history = {"seed": seed, "every": every, "steps": steps, "totals": None}
    if by_step:
        history["allocation"] = {"steps": [h["step"] for h in steps],
                                 **{k: [h[k] for h in steps] for k in steps[0] if k != "step"}}
        history["steps"] = steps[::2]  # a thinned history beside it: the every-step diagnostics win
        history["every"] = 2
    return history


def test_mixed_groups_from_the_first_step_after_epoch_0(tmp_path):
    # Steps 0-3; epoch 0 is steps 0-1. From step 2: seed 0 (0.5 + 0.7) / 2 = 0.6, seed 1 (0.3 + 0.5) / 2 = 0.4.
    results = {"methods": {"sera": {"history": [_history(0, [1, 1, 0.5, 0.7], by_step=True),
                                                _history(1, [1, 1, 0.3, 0.5], by_step=True)]}}}
    (tmp_path / "a.json").write_text(json.dumps({"results": results, "provenance": {}}))
    table = _readme_results().render("a.json view=allocation after=2", tmp_path)
    assert "mixed groups from step 2 (after epoch 0) |" in table
    assert f"| 0.500 ± {12.706 * 0.1:.3f} |" in table
    assert "one step in" not in table  # every step was kept


def test_prompts_dropped_a_step_after_epoch_0_by_the_side_of_their_estimate(tmp_path):
    def run(seed, hard, easy):  # steps 0-3, epoch 0 is steps 0-1 (nothing dropped there)
        history = _history(seed, [1, 1, 0.5, 0.5], by_step=True)
        history["allocation"].update(dropped_hard=[0, 0, *hard], dropped_easy=[0, 0, *easy])
        return history

    # From step 2: all-fail drops seed 0 (3 + 1) / 2 = 2, seed 1 (2 + 0) / 2 = 1; all-pass drops 0 and 0.5.
    results = {"methods": {"sera": {"history": [run(0, [3, 1], [0, 0]), run(1, [2, 0], [1, 0])]}}}
    (tmp_path / "a.json").write_text(json.dumps({"results": results, "provenance": {}}))
    table = _readme_results().render("a.json view=allocation after=2", tmp_path)
    assert "prompts dropped a step from step 2: all failed at last visit | prompts dropped a step: all passed" in table
    t = 12.706204736  # t at 0.975 with 1 degree of freedom
    assert f"| 0.500 ± 0.000 | 1.500 ± {t * 0.5:.3f} | 0.250 ± {t * 0.25:.3f} |" in table


def test_a_file_without_dropped_prompts_keeps_its_columns(tmp_path):
    results = {"methods": {"sera": {"history": [_history(0, [1, 1, 0.5, 0.7], by_step=True)]}}}
    (tmp_path / "a.json").write_text(json.dumps({"results": results, "provenance": {}}))
    assert "dropped" not in _readme_results().render("a.json view=allocation after=2", tmp_path)


def test_a_thinned_history_says_how_often_it_was_logged(tmp_path):
    results = {"methods": {"sera": {"history": [_history(0, [1, 0.5, 0.7], every=10)]}}}
    (tmp_path / "a.json").write_text(json.dumps({"results": results, "provenance": {}}))
    table = _readme_results().render("a.json view=allocation after=10", tmp_path)
    assert "one step in 10 and each run's last" in table
    assert "| 0.600 |" in table  # steps 10 and 20: (0.5 + 0.7) / 2, one seed: no interval


def test_the_headline_regime_note_is_uniforms_own_change_from_its_start(tmp_path, monkeypatch):
    from sera_jax.report import stats

    def run(seed, start, final):
        return {"seed": seed, "rollouts_spent": 64, "history": [],
                "evaluations": [{"step": 0, "k": [1, 4], "pass_at_k": start, "rollouts_spent": 0},
                                {"step": 10, "k": [1, 4], "pass_at_k": final, "rollouts_spent": 64}]}

    runs = {"uniform": [run(0, [0.1, 0.5], [0.2, 0.4]), run(1, [0.1, 0.5], [0.2, 0.6])],
            "sera": [run(0, [0.1, 0.5], [0.15, 0.5]), run(1, [0.1, 0.5], [0.15, 0.5])]}
    (tmp_path / "cpu" / "x").mkdir(parents=True)
    (tmp_path / "cpu" / "x" / "results.json").write_text(json.dumps(
        {"results": stats.summarize_runs(runs), "provenance": {"command": "c", "commit": "abc", "dirty": False}}))
    rr = _readme_results()
    monkeypatch.setattr(rr, "HEADLINE", (dict(label="X", anchor="x", file="x/results.json", method="sera", rule=None,
                                              estimates="e", endpoints=("pass@1", "pass@4"), regime=True),))
    table = rr.render("cpu view=headline", tmp_path)
    # uniform's change: pass@1 +0.1 on both seeds; pass@4 -0.1 and +0.1.
    assert (f"(uniform MaxRL's own change: pass@1 +0.100 ± 0.000, pass@4 +0.000 ± {12.706 * 0.1:.3f}) |") in table


def test_active_set_calibration_rows_average_after_epoch_0_and_give_uniforms_change(tmp_path):
    # 16 mazes, 8 a step: epoch 0 is steps 0-1, so sera's active fraction after it is (0.5 + 1) / 2 = 0.75.
    evaluations = [{"step": 0, "k": [1, 32], "pass_at_k": [0.5, 0.8]}, {"step": 4, "k": [1, 32], "pass_at_k": [0.55, 0.79]}]
    run = {"name": "c1", "settings": {"maze.size": 9, "maze.num_train": 16, "rl.prompts_per_step": 8,
                                      "maze.hard_fraction": 0.25, "maze.easy_fraction": 0.125, "rl.learning_rate": 1e-5},
           "methods": {"sera": [{"seed": 100, "evaluations": [], "active_frac": [1.0, 1.0, 0.5, 1.0]}],
                       "uniform": [{"seed": 100, "evaluations": evaluations}]}}
    (tmp_path / "a.json").write_text(json.dumps({"results": {"runs": [run]}, "provenance": {}}))
    table = _readme_results().render("a.json view=active_set_calibration k=32", tmp_path)
    assert "| c1 | 100 | 9x9, 16 | 0.25 | 0.125 | 1e-05 | 0.750 | +0.050 | −0.010 |" in table


def _matched_file(tmp_path):
    """Two seeds of a treated run against two reference runs, through sera_jax.report.matched itself."""
    from sera_jax.report.matched import matched_pass_at_1

    def evals(*points):
        return [{"step": 50 * i, "k": [1, 32], "pass_at_k": list(p)} for i, p in enumerate(points)]

    curves = {
        # seed 0 ends at pass@1 0.2; seed 1 at 0.5, past every reference path.
        "sera_lr_1e-5": [{"seed": 0, "evaluations": evals((0.1, 0.7), (0.2, 0.8))},
                         {"seed": 1, "evaluations": evals((0.1, 0.7), (0.5, 0.9))}],
        # At pass@1 0.2: halfway from (0.1, 0.7) to (0.3, 0.5) -> 0.6; the other run at 0.2 exactly -> 0.7.
        "uniform_lr_1e-6": [{"seed": s, "evaluations": evals((0.1, 0.7), (0.3, 0.5))} for s in (0, 1)],
        "uniform_lr_3e-6": [{"seed": s, "evaluations": evals((0.1, 0.7), (0.2, 0.7), (0.4, 0.6))} for s in (0, 1)],
    }
    found = matched_pass_at_1(curves, "sera_lr_1e-5", ("uniform_lr_1e-6", "uniform_lr_3e-6"), 32)
    results = {"matched_pass_at_1": {**found, "secondary": []}}
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "m.json").write_text(json.dumps({"results": results, "provenance": {}}))
    return found


def test_the_matched_view_gives_each_seeds_reading_by_hand(tmp_path):
    found = _matched_file(tmp_path)
    # seed 0: 0.8 - mean(0.6, 0.7) = +0.15; seed 1: above both paths, the highest pass@1 (0.4) has pass@32 0.6 -> +0.3.
    assert [s["diff"] for s in found["per_seed"]] == pytest.approx([0.15, 0.3])
    table = _readme_results().render("cpu/m.json view=matched", tmp_path)
    half = 12.706 * 0.15 / 2 ** 0.5 / 2 ** 0.5  # t(1) x sd of (0.15, 0.3) / sqrt(2)
    assert (f"| sera_lr_1e-5 (primary) | 32 | 2 | 0.350 | 0.850 | 0.625 | +0.225 ± {half:.3f} | 1 / 0 |") in table


def test_the_headline_reads_a_matched_endpoint(tmp_path, monkeypatch):
    _matched_file(tmp_path)
    rr = _readme_results()
    monkeypatch.setattr(rr, "HEADLINE", (dict(label="F", anchor="f", file="m.json", method="sera_lr_1e-5", rule=None,
                                              estimates="e", endpoints=("matched@32",)),))
    half = 12.706 * 0.15 / 2
    assert f"| 2 | pass@32 at matched pass@1 +0.225 ± {half:.3f} |" in rr.render("cpu view=headline", tmp_path)


def test_a_paired_table_against_another_baseline(tmp_path):
    from sera_jax.report import stats

    def run(seed, final):
        return {"seed": seed, "rollouts_spent": 64, "history": [],
                "evaluations": [{"step": 10, "k": [1, 4], "pass_at_k": final, "rollouts_spent": 64}]}

    runs = {"uniform": [run(0, [0.2, 0.4]), run(1, [0.2, 0.6])],
            "sera": [run(0, [0.3, 0.5]), run(1, [0.1, 0.5])],
            "sera_all_active": [run(0, [0.2, 0.5]), run(1, [0.2, 0.7])]}
    (tmp_path / "a.json").write_text(json.dumps({"results": stats.summarize_runs(runs), "provenance": {}}))
    table = _readme_results().render("a.json view=paired baseline=sera_all_active", tmp_path)
    # sera - sera_all_active: pass@1 +0.1 and -0.1 (mean 0, sd 0.1414); pass@4 0 and -0.2 (mean -0.1).
    half = 12.706 * 0.1414214 / 2 ** 0.5
    assert f"| sera | +0.000 ± {half:.3f} | −0.100 ± {half:.3f} |" in table  # not −0.000 (float noise)
    assert "| method − sera_all_active |" in table and "| uniform (MaxRL) |" in table


def test_digits_prints_differences_under_a_thousandth(tmp_path):
    from sera_jax.report import stats

    def run(seed, final):
        return {"seed": seed, "rollouts_spent": 64, "history": [],
                "evaluations": [{"step": 0, "k": [1], "pass_at_k": [0.4], "rollouts_spent": 0},
                                {"step": 10, "k": [1], "pass_at_k": [final], "rollouts_spent": 64}]}

    # sera - uniform: -0.0002 and -0.0004 -> mean -0.0003, half-width t * 0.0001.
    runs = {"uniform": [run(0, 0.4010), run(1, 0.4010)], "sera": [run(0, 0.4008), run(1, 0.4006)]}
    (tmp_path / "a.json").write_text(json.dumps({"results": stats.summarize_runs(runs), "provenance": {}}))
    rr = _readme_results()
    assert "| sera | **+0.000 ± 0.001**" in rr.render("a.json view=paired ks=1 bold=1", tmp_path)
    t = 12.706204736
    assert f"| sera | **−0.0003 ± {t * 0.0001:.4f}**" in rr.render("a.json view=paired ks=1 bold=1 digits=4", tmp_path)
    assert "| sera | 2 | +0.0007 ± " in rr.render("a.json view=start_change ks=1 digits=4", tmp_path)
