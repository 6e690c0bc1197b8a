"""The README's training-loop example runs as written, the README stays a short front door, and the result tables of
the README and docs/results.md are generated from the committed files (scripts/readme_results.py)."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
RESULTS_DOC = README.parent / "docs" / "results.md"
NO_DATA = re.compile(r"<!-- no data in the repository: [^>]+ -->.*?<!-- end no data -->", re.S)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_example_runs():
    blocks = _python_blocks()
    assert blocks, "the README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    counts = namespace["counts"]
    assert int(counts.sum()) == 32 and counts.shape == (4,)
    assert namespace["adv"].shape == (32,) and namespace["w"].shape == (32,)


def test_readme_example_shows_the_released_rule_and_its_zeros():
    """``allocate``'s default is the released rule (the registry's ``sera``), the snippet's counts include a prompt
    with no rollouts, and the numbers its comments quote are what the calls give."""
    import sera_jax
    namespace: dict = {}
    block = _python_blocks()[0]
    exec(compile(block, str(README), "exec"), namespace)
    p_hat, counts = namespace["p_hat"], np.asarray(namespace["counts"])
    np.testing.assert_array_equal(counts, sera_jax.get_allocator("sera").counts(p_hat, 32, n_min=2, n_max=16))
    assert counts.min() == 0 and f"[{', '.join(map(str, counts))}]" in block
    all_active = np.asarray(sera_jax.allocate(p_hat, 32, n_min=2, n_max=16, method="sera_all_active"))
    assert all_active.min() >= 2 and f"[{', '.join(map(str, all_active))}]" in block
    assert not np.any(np.asarray(namespace["w"])[np.asarray(namespace["prompt_ids"]) == 0])  # no row of prompt 0


# ------------------------------------------------------------------- result tables (scripts/readme_results.py)


def _readme_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_results", README.parent / "scripts" / "readme_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results_section(text: str) -> str:
    return text.split("## Headline results", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_five_minute_read():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to docs/ (at most 200)"


def _tables_outside_blocks(text: str, rr) -> list[str]:
    outside = NO_DATA.sub("", rr.BLOCK.sub("", text))
    return [line for line in outside.splitlines() if line.startswith("|")]


def test_every_results_table_is_generated_from_committed_files_or_marked_without_data():
    """Each table of docs/results.md and of the README's headline section is either rendered from a committed
    results.json (and equal to what that file gives now) or sits in a block that says the repository has no data
    for it."""
    rr = _readme_results()
    for path, text in ((RESULTS_DOC, RESULTS_DOC.read_text()), (README, _results_section(README.read_text()))):
        assert rr.stale_blocks(text) == [], f"{path.name}: stale tables; run python scripts/readme_results.py"
        assert rr.BLOCK.search(text), f"{path.name}: no generated table"
        tables = _tables_outside_blocks(text, rr)
        assert not tables, f"{path.name}: tables neither generated nor marked without data: {tables[:2]}"
    assert rr.stale_blocks(README.read_text()) == []


def test_the_checker_names_the_file_and_the_table_when_one_is_stale(tmp_path, capsys):
    rr = _readme_results()
    doc = tmp_path / "doc.md"
    spec = "cpu/maze/calibration.json view=calibration ks=1,16"
    doc.write_text(f"<!-- results: {spec} -->\n| stale |\n<!-- end results -->\n")
    assert rr.main(["--check", str(doc)]) == 1
    assert f"doc.md: the table of <!-- results: {spec} -->" in capsys.readouterr().err
    assert rr.main([str(doc)]) == 0 and "| stale |" not in doc.read_text()  # rewritten from the file
    assert rr.main(["--check", str(doc)]) == 0
    assert RESULTS_DOC in rr.documents() and README in rr.documents()


def test_every_results_section_says_which_rule_and_which_estimates_ran():
    """A section of docs/results.md with a table (or a table to come) names the SERA rule its rows ran (released
    `sera` or the all-active reconstruction) and the estimates of p."""
    rr = _readme_results()
    sections = re.split(r"\n(?=#{2,3} )", RESULTS_DOC.read_text())
    missing = [s.splitlines()[0] for s in sections if (rr.BLOCK.search(s) or NO_DATA.search(s))
               and not ("**Rule:**" in s and "**Estimates of p:**" in s)]
    assert not missing, f"sections that do not say which rule and estimates ran: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_headline_links_each_row_to_the_section_with_its_numbers():
    """Each headline row links to the section of docs/results.md whose generated tables hold its numbers."""
    rr = _readme_results()
    text = RESULTS_DOC.read_text()
    sections = {_slug(s.splitlines()[0].lstrip("#")): s for s in re.split(r"\n(?=#{2,3} )", text)[1:]}
    rows = [line for line in rr.render("cpu view=headline").splitlines() if line.startswith("| [")]
    assert len(rows) == len(rr.HEADLINE)
    for row in rows:
        anchor = re.search(r"\]\(docs/results\.md#([^)]+)\)", row).group(1)
        assert anchor in sections, f"the headline links to #{anchor}, which no heading of docs/results.md has"
        numbers = re.findall(r"[+−]?\d\.\d{3}(?: ± \d\.\d{3})?", row.rsplit("|", 2)[1])
        assert numbers, row
        for number in numbers:
            assert number in sections[anchor], f"{number} of the headline row {row[:60]} is not in #{anchor}"


def test_result_tables_render_the_files_numbers(tmp_path):
    """The pass@k and paired views on a hand-made summary: every cell is the file's number, rounded."""
    import json

    from sera_jax.report import stats

    def run(seed, finals):
        evals = [{"k": [1, 4], "pass_at_k": [0.1, 0.3], "rollouts_spent": 0},
                 {"k": [1, 4], "pass_at_k": finals, "rollouts_spent": 64}]
        return {"seed": seed, "rollouts_spent": 64, "evaluations": evals, "history": []}

    runs = {"uniform": [run(0, [0.2, 0.5]), run(1, [0.3, 0.6])], "sera": [run(0, [0.25, 0.4]), run(1, [0.3, 0.7])]}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps(
        {"results": stats.summarize_runs(runs), "provenance": {"command": "python -m x", "commit": "abc", "dirty": False}}))
    rr = _readme_results()
    table = rr.render("x/results.json view=pass_at_k ks=1,4", tmp_path)
    half = 12.706 * 0.05  # t(0.975, 1) * sd / sqrt(2); sd of (0.2, 0.3) and of (0.5, 0.6) is 0.1 / sqrt(2)
    assert "| SFT start (step 0, mean over the runs) | 0.100 | 0.300 |" in table
    assert f"| uniform (MaxRL) | 0.250 ± {half:.3f} | 0.550 ± {half:.3f} |" in table
    assert "Data: `results/x/results.json` (`python -m x`, commit abc)." in table
    paired = rr.render("x/results.json view=paired ks=1,4 bold=4", tmp_path)
    # sera - uniform per seed: pass@1 (0.05, 0.0): sd 0.05 / sqrt(2); pass@4 (-0.1, 0.1): sd 0.1 sqrt(2).
    assert f"| sera | +0.025 ± {12.706 * 0.025:.3f} | **+0.000 ± {12.706 * 0.1:.3f}** (MDE " in paired
    assert "start 1" not in paired and "Pairs: 2 seeds. Primary" in paired


def test_the_paired_view_splits_the_pairs_by_start(tmp_path):
    """Seeds from two SFT starts (``start_by_seed``): the pooled row, then each start's pairs alone."""
    import json

    from sera_jax.report import stats

    def run(seed, finals):
        return {"seed": seed, "rollouts_spent": 64, "history": [],
                "evaluations": [{"k": [1, 4], "pass_at_k": finals, "rollouts_spent": 64}]}

    uniform = {0: [0.2, 0.5], 1: [0.3, 0.6], 2: [0.1, 0.4], 4: [0.2, 0.2], 5: [0.4, 0.4]}
    sera = {0: [0.25, 0.4], 1: [0.3, 0.7], 2: [0.2, 0.4], 4: [0.1, 0.3], 5: [0.4, 0.6]}
    results = stats.summarize_runs({"uniform": [run(s, f) for s, f in uniform.items()],
                                    "sera": [run(s, f) for s, f in sera.items()]})
    results["start_by_seed"] = {"0": 0.5, "1": 0.5, "2": 0.5, "4": 0.7, "5": 0.7}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps(
        {"results": results, "provenance": {"command": "python -m x", "commit": "abc", "dirty": False}}))
    paired = _readme_results().render("x/results.json view=paired ks=1,4 bold=4", tmp_path)
    first = np.array([sera[s] for s in (0, 1, 2)]) - np.array([uniform[s] for s in (0, 1, 2)])
    second = np.array([sera[s] for s in (4, 5)]) - np.array([uniform[s] for s in (4, 5)])
    for number, diffs, seeds in ((1, first, "0-2"), (2, second, "4-5")):
        half = stats.mean_and_ci95(diffs)[1]
        cells = " | ".join(f"{m:+.3f} ± {h:.3f}".replace("-", "−") for m, h in zip(diffs.mean(0), half))
        assert f"| sera, start {number} ({len(diffs)} seeds: {seeds}) | {cells} |" in paired, paired
    assert "Pairs: 5 seeds, from 2 SFT starts (`start_by_seed`)." in paired
    assert "**" in paired.split("| sera |")[1].split("\n")[0]  # every method's endpoints are bold by default
    # primary=: only those methods' endpoints in bold; a method paired on one start only gets no start rows.
    rr = _readme_results()
    results["methods"]["grpo"] = rr._only_seeds(results["methods"]["sera"], [4, 5])
    results["paired_vs_uniform"] = stats.paired_differences(results["methods"])
    (tmp_path / "x" / "results.json").write_text(json.dumps({"results": results, "provenance": {}}))
    paired = rr.render("x/results.json view=paired ks=1,4 bold=4 primary=sera", tmp_path)
    grpo = paired.split("| grpo |")[1].split("\n")[0]
    assert "**" not in grpo and "(MDE " in grpo and "**" in paired.split("| sera |")[1].split("\n")[0]
    assert "grpo, start" not in paired and "sera, start 2" in paired



def test_start_change_and_calibration_views_are_final_minus_start(tmp_path):
    """The regime check (each method's final pass@k minus its start's, paired by seed) and the calibration view,
    on hand-made files: every cell is computed here by hand."""
    import json

    from sera_jax.report import stats

    def run(seed, start, final):
        evals = [{"step": 0, "k": [1, 4], "pass_at_k": start, "rollouts_spent": 0, "solved_frac": 0.5},
                 {"step": 10, "k": [1, 4], "pass_at_k": final, "rollouts_spent": 64, "solved_frac": 0.5}]
        return {"seed": seed, "rollouts_spent": 64, "evaluations": evals, "history": []}

    runs = {"uniform": [run(0, [0.1, 0.5], [0.2, 0.4]), run(1, [0.2, 0.6], [0.4, 0.6])]}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps(
        {"results": stats.summarize_runs(runs), "provenance": {"command": "c", "commit": "abc", "dirty": False}}))
    rr = _readme_results()
    table = rr.render("x/results.json view=start_change ks=1,4", tmp_path)
    # changes: pass@1 (0.1, 0.2) -> mean 0.15, sd 0.05 sqrt(2); pass@4 (-0.1, 0.0) -> mean -0.05, same sd.
    half = 12.706 * 0.05
    assert f"| uniform (MaxRL) | 2 | +0.150 ± {half:.3f} | −0.050 ± {half:.3f} |" in table
    assert "start 1" not in table
    # Seeds from two SFT starts: uniform's change on each start's seeds alone follows.
    two_starts = stats.summarize_runs(runs)
    two_starts["start_by_seed"] = {"0": 0.5, "1": 0.7}
    (tmp_path / "x" / "results.json").write_text(json.dumps({"results": two_starts, "provenance": {}}))
    table = rr.render("x/results.json view=start_change ks=1,4", tmp_path)
    assert "| uniform (MaxRL), start 1 (seeds 0) | 1 | +0.100 | −0.100 |" in table
    assert "| uniform (MaxRL), start 2 (seeds 1) | 1 | +0.200 | +0.000 |" in table
    record = {"results": {"runs": [{"name": "cal_a", "settings": {
        "rl.prompts_per_step": 8, "rollouts_per_prompt": 16.0, "rl.learning_rate": 3e-5, "sft.seed": 0},
        "methods": {"uniform": [{"seed": 7, "evaluations": runs["uniform"][1]["evaluations"]}]}}]},
        "provenance": {"command": "c", "commit": "abc", "dirty": False}}
    (tmp_path / "cal.json").write_text(json.dumps(record))
    calibration = rr.render("cal.json view=calibration ks=1,4", tmp_path)
    assert "| cal_a | 7 | 0 | 8 | 16 | 3e-05 | 10 | 0.200 / 0.600 | +0.200 / +0.000 |" in calibration


def test_the_allocation_view_reports_the_active_set_and_the_unmixed_rollouts(tmp_path):
    """Active fractions by fifth of training, the least one, and the unmixed rollouts from the totals, on a
    hand-made file: every cell computed here by hand."""
    import json

    def history(seed, active, unmixed_total):
        steps = [{"step": i, "active_frac": a, "rollouts_unmixed_frac": 0.0, "all_fail_group_fraction": 0.5,
                  "all_pass_group_fraction": 0.25} for i, a in enumerate(active)]
        return {"seed": seed, "every": 1, "steps": steps,
                "totals": {"rollouts_sampled": 100.0, "rollouts_unmixed": unmixed_total}}

    # Ten steps: fifths are steps 0-1, 4-5 and 8-9.
    seed0 = history(0, [1, 1, 0.5, 0.5, 0.8, 0.6, 0.5, 0.5, 0.4, 0.2], 30.0)
    seed1 = history(1, [1, 1, 0.5, 0.5, 0.6, 0.6, 0.5, 0.5, 0.2, 0.2], 50.0)
    results = {"methods": {"sera": {"history": [seed0, seed1]}, "uniform": {"history": []}}}
    (tmp_path / "a.json").write_text(json.dumps({"results": results, "provenance": {}}))
    table = _readme_results().render("a.json view=allocation", tmp_path)
    # middle fifth: 0.7 and 0.6 -> 0.65 ± 12.706 * 0.05 / sqrt(2) * sqrt(2); last: 0.3, 0.2; unmixed 0.3, 0.5.
    half = 12.706 * 0.05
    assert (f"| sera | 2 | 1.000 ± 0.000 | 0.650 ± {half:.3f} | 0.250 ± {half:.3f} | 0.200 ± 0.000 | "
            f"0.400 ± {12.706 * 0.1:.3f} | 0.500 ± 0.000 | 0.250 ± 0.000 |") in table
    assert "uniform" not in table  # no logged history, no row


def test_the_endpoints_view_renders_the_declared_endpoints_and_the_cosine(tmp_path):
    """A comparison's recorded endpoints, paired differences and gradient cosines, cell by cell."""
    import json

    endpoints = {"names": ["top1@50", "top1@300"], "methods": {
        "uniform": {"mean": [0.5, 0.9], "ci95": [0.1, 0.01], "seeds": [0, 1]},
        "sera": {"mean": [0.6, 0.91], "ci95": [0.2, 0.02], "seeds": [0, 1]}},
        "paired_vs_uniform": {"sera": {"mean_diff": [0.1, 0.01], "ci95": [0.05, 0.004], "mde80": [0.07, 0.005],
                                       "num_seeds": 2}}}
    cosine = {"early_step": 50, "methods": {
        "uniform": {"run_mean": {"mean": [0.6], "ci95": [0.02]}, "early_mean": {"mean": [0.5], "ci95": [0.03]}},
        "sera": {"run_mean": {"mean": [0.75], "ci95": [0.04]}, "early_mean": {"mean": [0.62], "ci95": [0.05]}}},
        "paired_vs_uniform": {"sera": {"run_mean": {"mean_diff": [0.15], "ci95": [0.02]},
                                       "early_mean": {"mean_diff": [0.12], "ci95": [0.06]}}}}
    (tmp_path / "e.json").write_text(json.dumps({"results": {"endpoints": endpoints, "gradient_cosine": cosine},
                                                 "provenance": {}}))
    table = _readme_results().render("e.json view=endpoints", tmp_path)
    assert "| uniform (MaxRL) | 2 | 0.500 ± 0.100 | 0.900 ± 0.010 |" in table
    assert "| sera | 2 | +0.100 ± 0.050 (MDE 0.070) | +0.010 ± 0.004 (MDE 0.005) |" in table
    assert "| sera | 0.750 ± 0.040 | 0.620 ± 0.050 | +0.150 ± 0.020 | +0.120 ± 0.060 |" in table
    assert "| uniform (MaxRL) | 0.600 ± 0.020 | 0.500 ± 0.030 |  |  |" in table


def _a_file_of_uniform_and_sera(path):
    """A one-seed results file of ``uniform`` and ``sera``, both at final pass@1 0.2."""
    import json

    from sera_jax.report import stats

    evals = [{"step": 0, "k": [1], "pass_at_k": [0.1], "rollouts_spent": 0, "solved_frac": 0.5},
             {"step": 10, "k": [1], "pass_at_k": [0.2], "rollouts_spent": 64, "solved_frac": 0.5}]
    runs = {m: [{"seed": 0, "rollouts_spent": 64, "evaluations": evals, "history": []}] for m in ("uniform", "sera")}
    path.write_text(json.dumps({"results": stats.summarize_runs(runs), "provenance": {}}))


def test_a_file_saved_before_the_released_rule_labels_its_sera_rows_all_active(tmp_path):
    _a_file_of_uniform_and_sera(tmp_path / "old.json")
    rr = _readme_results()
    assert "| sera_all_active (max-min, all prompts) | 0.200 |" in rr.render("old.json view=pass_at_k ks=1 rule=all_active",
                                                                            tmp_path)
    assert "| sera | 0.200 |" in rr.render("old.json view=pass_at_k ks=1", tmp_path)  # and no other marker's rows
    with pytest.raises(ValueError, match="rule='released'"):
        rr.render("old.json view=pass_at_k rule=released", tmp_path)


def test_a_file_whose_sera_ran_on_epoch_estimates_labels_its_rows_so(tmp_path):
    _a_file_of_uniform_and_sera(tmp_path / "math.json")
    rr = _readme_results()
    table = rr.render("math.json view=pass_at_k ks=1 estimates=epoch_history", tmp_path)
    assert "| sera (epoch-frozen estimates) | 0.200 |" in table and "| uniform (MaxRL) | 0.200 |" in table
    for bad in ("estimates=pilot", "rule=all_active estimates=pilot", "rule=released estimates=epoch_history"):
        with pytest.raises(ValueError, match="the only value is"):
            rr.render(f"math.json view=pass_at_k {bad}", tmp_path)
    assert "| sera | 0.200 |" in rr.render("math.json view=pass_at_k ks=1", tmp_path)  # a refused marker leaks nothing


def test_the_budgets_view_is_the_ratio_of_paired_gains(tmp_path):
    """Two hand-made files (budgets 64 and 128 rollouts a run): uniform's gain from the smaller budget to the larger,
    sera's gain over uniform at the smaller, their ratio and the budget it maps to, on the seeds with the same start;
    then every seed with uniform's gains taken from each run's own start."""
    import json

    from sera_jax.report import stats

    def run(seed, start, final, budget):
        evals = [{"step": 0, "k": [1, 4], "pass_at_k": [0.0, start], "rollouts_spent": 0},
                 {"step": 9, "k": [1, 4], "pass_at_k": [0.0, final], "rollouts_spent": budget}]
        return {"seed": seed, "rollouts_spent": budget, "evaluations": evals, "history": []}

    small = stats.summarize_runs({
        "uniform": [run(0, 0.5, 0.60, 64), run(1, 0.4, 0.52, 64), run(2, 0.5, 0.58, 64)],
        "sera": [run(0, 0.5, 0.63, 64), run(1, 0.4, 0.54, 64), run(2, 0.5, 0.62, 64)]})
    big = stats.summarize_runs({"uniform": [run(0, 0.5, 0.66, 128), run(1, 0.4, 0.57, 128),
                                            run(2, 0.3, 0.42, 128)]})
    small["start_by_seed"] = {"0": 0.17, "1": 0.17, "2": 0.17}
    big["start_by_seed"] = {"0": 0.17, "1": 0.17, "2": 0.19}  # seed 2 trained another start at the larger budget
    (tmp_path / "small.json").write_text(json.dumps({"results": small, "provenance": {"command": "s"}}))
    (tmp_path / "big.json").write_text(json.dumps({"results": big, "provenance": {"command": "b"}}))
    rr = _readme_results()
    table = rr.render("small.json view=budgets larger=big.json ks=4", tmp_path)
    with pytest.raises(ValueError, match="larger=PATH"):
        rr.render("small.json view=budgets ks=4", tmp_path)
    with pytest.raises(FileNotFoundError, match="huge.json"):
        rr.render("small.json view=budgets larger=huge.json ks=4", tmp_path)
    assert "Data: `results/small.json` (`s`" in table and "Data: `results/big.json` (`b`" in table
    # same start (seeds 0, 1): uniform's gains 0.06, 0.05; sera's 0.03, 0.02 -> r = 0.025 / 0.055.
    # all seeds: seed 2's uniform gain is (0.42 - 0.3) - (0.58 - 0.5) = 0.04, sera's 0.04 -> r = 0.09 / 0.15.
    for label, gain_u, gain_m in (("2 (same start: 0-1)", [0.06, 0.05], [0.03, 0.02]),
                                  ("3 (all, start-adjusted: 0-2)", [0.06, 0.05, 0.04], [0.03, 0.02, 0.04])):
        r, interval = stats.ratio_of_paired_means(np.array(gain_m), np.array(gain_u))
        np.testing.assert_allclose(r, sum(gain_m) / sum(gain_u))
        row = next(line for line in table.splitlines() if line.startswith(f"| pass@4 | {label} |"))
        cells = [c.strip() for c in row.split("|")[3:-1]]
        assert cells[0] == f"+{np.mean(gain_u):.3f} ± {stats.mean_and_ci95(np.array(gain_u))[1]:.3f}"
        assert cells[1] == f"+{np.mean(gain_m):.3f} ± {stats.mean_and_ci95(np.array(gain_m))[1]:.3f}"
        assert cells[2].startswith(f"{r:.2f} ")
        if interval is None:
            assert cells[3] == "not determined"
        else:
            assert cells[3].startswith(f"{64 * 2 ** r:,.0f} [{64 * 2 ** interval[0]:,.0f}, ")


def test_the_attenuation_view_is_maxrls_factor_at_the_starts_p_quantiles(tmp_path):
    """p quantiles of two seeds' start evaluations (averaged: 0.1 and 0.5 at the median) and MaxRL's factor
    1 - (1-p)^(N-1) at N̄ = 2 and 5, by hand; later evaluations are not the start."""
    import json

    from sera_jax.report import stats

    def run(seed, p_median, solved):
        evals = [{"step": 0, "k": [1], "pass_at_k": [0.1], "rollouts_spent": 0, "solved_frac": solved,
                  "p_quantiles": {"0.1": 0.0, "0.5": p_median}},
                 {"step": 9, "k": [1], "pass_at_k": [0.2], "rollouts_spent": 64, "solved_frac": 1.0,
                  "p_quantiles": {"0.1": 0.9, "0.5": 0.9}}]
        return {"seed": seed, "rollouts_spent": 64, "evaluations": evals, "history": []}

    runs = {"uniform": [run(0, 0.0, 0.8), run(1, 0.2, 0.9)]}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps({"results": stats.summarize_runs(runs), "provenance": {}}))
    table = _readme_results().render("x/results.json view=attenuation budgets=2,5", tmp_path)
    assert "| 10% | 0.000 | 0.00 | 0.00 |" in table
    assert f"| 50% | 0.100 | {0.1:.2f} | {1 - 0.9 ** 4:.2f} |" in table  # 0.10 and 0.34
    assert "15.0% of the held-out prompts had no success" in table


def test_the_headline_view_is_each_files_paired_difference_at_its_endpoints(tmp_path, monkeypatch):
    """One headline row on a hand-made file: seeds, and sera − uniform paired by seed at the endpoints, by hand."""
    import json

    from sera_jax.report import stats

    def run(seed, finals):
        return {"seed": seed, "rollouts_spent": 64, "history": [],
                "evaluations": [{"k": [1, 4], "pass_at_k": finals, "rollouts_spent": 64}]}

    runs = {"uniform": [run(0, [0.2, 0.5]), run(1, [0.3, 0.6])], "sera": [run(0, [0.25, 0.4]), run(1, [0.3, 0.7])]}
    (tmp_path / "cpu" / "x").mkdir(parents=True)
    (tmp_path / "cpu" / "x" / "results.json").write_text(json.dumps(
        {"results": stats.summarize_runs(runs), "provenance": {"command": "c", "commit": "abc", "dirty": False}}))
    rr = _readme_results()
    monkeypatch.setattr(rr, "HEADLINE", (dict(label="X", anchor="x-section", file="x/results.json", method="sera",
                                              rule=None, estimates="true p", endpoints=("pass@1", "pass@4")),))
    table = rr.render("cpu view=headline", tmp_path)
    # sera - uniform per seed: pass@1 (0.05, 0.0); pass@4 (-0.1, 0.1).
    assert (f"| [X](docs/results.md#x-section) | released (`sera`) | true p | 2 | pass@1 +0.025 ± {12.706 * 0.025:.3f}; "
            f"pass@4 +0.000 ± {12.706 * 0.1:.3f} |") in table
    assert "Data: `results/cpu/x/results.json` (each file's command and commit: docs/results.md)." in table
