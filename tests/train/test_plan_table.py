"""scripts/plan_table.py: the docs' planned-figures table, read back from the planner's own saved output."""

import importlib.util
import pathlib
import sys

import pytest

from sera_jax.train import plan, targets

REPO = pathlib.Path(__file__).resolve().parents[2]


def _plan_table():
    spec = importlib.util.spec_from_file_location("plan_table", REPO / "scripts" / "plan_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["plan_table"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _row(name, peak_gib, flops, roofline, mfu, model_flops=0.0, has_loop=False):
    memory = plan.CallMemory(name, int(peak_gib * 2**30), 0, 0, 0, 1.0, "a note")
    return plan.CallOnTarget(memory, flops, 1e9, has_loop, model_flops, 0.0, roofline, mfu)


def _saved(rows, exit_code=0, devices=8):
    h200 = targets.get_target("h200")
    return (f"command: python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --devices={devices}\n"
            f"commit: abc123\ndate: 2026-12-03\n"
            f"experiments/maze/config.py:gpu on {devices} device(s) of h200; XLA:GPU H200\n"
            f"{plan.format_target_table(rows, h200, 'XLA:GPU H200')}\nexit {exit_code} wall 12 s\n")


def test_a_saved_plan_reads_back_and_sums_one_step():
    pt = _plan_table()
    rows = [_row("pilot sampling", 0.5, 1e12, 2e-3, 0.10, model_flops=1e12),
            _row("rollout sampling", 3.0, 4e13, 0.25, 0.20, model_flops=4e13),
            _row("evaluation sampling", 6.0, 3e13, 0.5, 0.05, model_flops=3e13),
            _row("update", 24.43, 4.26e13, 0.0431, 1.0, has_loop=True)]
    saved = pt.parse_plan(_saved(rows))
    assert (saved.config, saved.target, saved.devices, saved.exit_code) == ("maze gpu", "h200", 8, 0)
    assert saved.commit == "abc123" and "--devices=8" in saved.command
    assert set(saved.calls) == {"pilot sampling", "rollout sampling", "evaluation sampling", "update"}
    assert saved.calls["update"].flops_lower_bound and not saved.calls["rollout sampling"].flops_lower_bound
    line = pt.row(saved)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "24.4 (update)"  # the largest peak, not the evaluation call's
    assert cells[4] == f"{1e12 + 4e13 + 4.26e13:.3g}*"  # pilot + rollout + update; * where XLA's count is a bound
    step = 2e-3 + 0.25 + 0.0431
    assert cells[5] == f"{step:.3g} s" and cells[7] == "0.5 s" and cells[8] == "yes"
    # The step's MFU is its model FLOPs over its roofline: each call's bound weighted by its roofline time.
    assert cells[6] == f"{(0.10 * 2e-3 + 0.20 * 0.25 + 1.0 * 0.0431) / step:.1%}"


def test_a_plans_config_overrides_name_its_row():
    pt = _plan_table()
    text = _saved([_row("rl step", 1.0, 1e12, 0.01, 0.2)]).replace(
        "experiments/maze/config.py:gpu on", "overrides: --config.rl.sample_slots=128\nexperiments/maze/config.py:gpu on")
    assert pt.parse_plan(text).config == "maze gpu rl.sample_slots=128"


def test_a_plan_that_does_not_fit_says_so_and_a_broken_file_is_named(tmp_path):
    pt = _plan_table()
    saved = pt.parse_plan(_saved([_row("rl step", 500.0, 1e13, 0.04, 0.3)], exit_code=1, devices=1))
    assert pt.row(saved).endswith("| **no** |")
    with pytest.raises(ValueError, match="broken.txt: not a saved target plan"):
        pt.parse_plan("compiled update (3 s)\n", "broken.txt")


def test_the_docs_tables_are_the_saved_plans():
    """Every doc's <!-- plans --> table is what the committed results/plans/ give (python scripts/plan_table.py
    --write rewrites them)."""
    pt = _plan_table()
    plans = pt.load()
    assert plans, "results/plans/ holds no saved plans"
    for doc in pt.DOCS:
        text = doc.read_text()
        if pt.BLOCK.search(text):
            assert pt.render(text, plans) == text, f"{doc.name}: run python scripts/plan_table.py --write"


def test_a_block_can_keep_only_the_plans_it_names():
    pt = _plan_table()
    gpu = pt.parse_plan(_saved([_row("rl step", 1.0, 1e12, 0.01, 0.2)]))
    paper = pt.Plan("maze paper", "h200", 4, "XLA:GPU H200", gpu.calls, 0)
    doc = "a\n<!-- plans: paper -->\nstale\n<!-- end plans -->\nb\n<!-- plans -->\n<!-- end plans -->\n"
    out = pt.render(doc, [gpu, paper])
    paper_block, all_block = out.split("<!-- end plans -->")[:2]
    assert "maze paper" in paper_block and "maze gpu" not in paper_block and "stale" not in paper_block
    assert "maze paper" in all_block and "maze gpu" in all_block
    assert pt.render(out, [gpu, paper]) == out
