"""The result tables of README.md and docs/results.md, rendered from the ``results.json`` files under ``results/``.

    python scripts/readme_results.py          # rewrite every generated table from the files
    python scripts/readme_results.py --check  # exit 1, naming the file and the table, if one differs from the files
    python scripts/readme_results.py FILE.md  # only these markdown files (default: README.md and docs/*.md)

A generated table sits in a markdown file between a marker and ``<!-- end results -->``::

    <!-- results: cpu/maze/results.json view=pass_at_k ks=1,4,16,64,128 bold=1,128 -->
    ...
    <!-- end results -->

``view`` is one of ``VIEWS``: ``pass_at_k`` (each method's final pass@k, mean ± 95% t-interval over seeds, with the
SFT start's row), ``paired`` (minus uniform MaxRL, or the ``baseline`` method, paired by seed, with the minimum detectable effect at the ``bold``
primary endpoints, of the ``primary`` methods only if given; then, when the file pooled seeds from several SFT
starts, ``start_by_seed``, each start's pairs alone for the methods paired on more than one), ``alignment`` (cosines with the exact likelihood gradient at checkpoint ``step``), ``weights``
(each method's weight on a prompt relative to the exact likelihood objective's, per bin of p, at checkpoint ``step``
and N̄ = ``budget``), ``training`` (the alignment experiment's training dynamics: final validation pass@k per
method), ``start_change`` (each method's final pass@k minus its SFT start's, paired by seed) or ``calibration``
(calibration runs collected by ``scripts/calibration_record.py``: each run's start and
its change at the last evaluation, at the ``ks``) or ``budgets`` (the rollouts ``method`` saves: its gain over uniform
at this file's budget as a fraction of uniform's gain up to the ``larger`` file's budget, with the uniform budget
that fraction maps to) or ``attenuation`` (MaxRL's factor ``s(p, N̄)`` at the quantiles of the SFT start's
per-prompt p, for each N̄ of ``budgets``), ``allocation``, ``endpoints``,
``matched`` (pass@k at matched pass@1: a treated run's final pass@k against the reference runs' pass@k where they
reach its final pass@1), or ``headline`` (the README's summary: one
row per comparison of ``HEADLINE``, read from the files under the marker's folder, e.g. ``<!-- results: cpu
view=headline -->``). ``rule=all_active`` relabels the SERA rows of a file saved before ``sera`` became the
authors' released rule; ``digits=D`` prints the paired and start_change views' cells with D decimals (default 3;
a ``HEADLINE`` row's ``digits`` does the same for its cells); ``estimates=epoch_history`` labels a file's ``sera``
rows as run on epoch-frozen estimates (math names the released rule on them ``sera``, the maze ``sera_epochs``). Every block ends with the file's
provenance (command and commit). A table the repository has no data for is marked
``<!-- no data in the repository: WHY -->`` ... ``<!-- end no data -->`` instead; ``tests/test_readme.py`` checks
that every table of docs/results.md and of the README's results section is one or the other, and that the generated
ones are current.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
RESULTS = REPO / "results"
BLOCK = re.compile(r"(<!-- results: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)
NAMES = {"uniform": "uniform (MaxRL)", "cross_entropy": "cross-entropy", "sera_no_correction": "sera, no multiplicity correction",
         "sera_pilot": "sera, pilot estimates", "sera_pilot_no_correction": "sera, pilot estimates, no correction",
         "sera_tokens": "sera, token budget", "sera_epochs": "sera (epoch-frozen estimates)",
         "sera_all_active_epochs": "sera_all_active (epoch-frozen estimates)"}
# ``rule=all_active`` markers: files whose SERA methods ran the all-active max-min (today's ``sera_all_active``), saved
# before ``sera`` became the authors' released rule; their rows say so.
ALL_ACTIVE_NAMES = {"sera": "sera_all_active (max-min, all prompts)",
                    "sera_no_correction": "sera_all_active, no multiplicity correction",
                    "sera_pilot": "sera_all_active, pilot estimates",
                    "sera_pilot_no_correction": "sera_all_active, pilot estimates, no correction",
                    "sera_tokens": "sera_all_active, token budget", "sera_sum": "sera_sum (all prompts)"}
# ``estimates=epoch_history`` markers: files whose ``sera`` ran the released rule on epoch-frozen estimates.
EPOCH_NAMES = {"sera": NAMES["sera_epochs"],
               "sera_no_correction": "sera, no multiplicity correction (epoch-frozen estimates)"}
ORDER = ("uniform", "sera", "sera_epochs", "sera_all_active", "sera_all_active_epochs", "sera_pilot",
         "sera_no_correction", "sera_pilot_no_correction", "sera_tokens", "sera_sum", "cross_entropy", "dynamo", "knapsack", "dars_et", "dars", "dapo", "pods", "reinforce_ada", "mopps", "greso", "grpo")


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"cpu/maze/results.json view=pass_at_k ks=1,4"`` -> (path, {"view": ..., "ks": ...})."""
    path, *options = spec.split()
    fields = dict(option.split("=", 1) for option in options)
    if fields.get("view") not in VIEWS:
        raise ValueError(f"results marker {spec!r}: view must be one of {sorted(VIEWS)}")
    return path, fields


def _ints(text: str | None) -> list[int]:
    return [int(v) for v in text.split(",")] if text else []


def _cell(mean: float, half, signed: bool = False, digits: int = 3) -> str:
    mean = 0.0 if round(mean, digits) == 0 else mean  # one zero at this precision: no "−0.000" from a sum's last bits
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    text = text.replace("-", "−")
    return text if half is None else f"{text} ± {half:.{digits}f}"


def _digits(fields: dict) -> int:
    """A marker's ``digits=D`` (default 3): the decimals of its cells, for differences smaller than 0.001."""
    return int(fields.get("digits", 3))


def _ordered(methods: dict) -> list[str]:
    return sorted(methods, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m))


def _ks(results: dict, fields: dict) -> list[int]:
    entry = next(e for e in results["methods"].values() if "pass_at_k" in e)
    return _ints(fields.get("ks")) or entry["pass_at_k"]["k"]


def pass_at_k_table(results: dict, fields: dict) -> list[str]:
    """Final pass@k per method (mean ± 95% t over seeds), after the SFT start's mean step-0 evaluation."""
    ks = _ks(results, fields)
    rows = ["| method | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    methods = {m: e for m, e in results["methods"].items() if "pass_at_k" in e}
    starts = [c["evaluations"][0] for e in methods.values() for c in e["curves"] if c["evaluations"]
              and c["evaluations"][0].get("rollouts_spent", 1) == 0]
    if starts:
        index = starts[0]["k"]
        mean = np.mean([[s["pass_at_k"][index.index(k)] for k in ks] for s in starts], axis=0)
        rows.append("| SFT start (step 0, mean over the runs) | " + " | ".join(f"{v:.3f}" for v in mean) + " |")
    for method in _ordered(methods):
        pk = methods[method]["pass_at_k"]
        cells = [_cell(pk["mean"][pk["k"].index(k)], None if pk["ci95"] is None else pk["ci95"][pk["k"].index(k)])
                 for k in ks]
        rows.append(f"| {NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    return rows


def paired_table(results: dict, fields: dict) -> list[str]:
    """Paired by seed, minus uniform (or the ``baseline`` method): mean ± 95% t; the ``bold`` primary endpoints in
    bold with their MDE."""
    from sera_jax.report import stats

    ks, bold = _ks(results, fields), set(_ints(fields.get("bold")))
    primary = set(fields["primary"].split(",")) if fields.get("primary") else set()  # default: every method
    baseline, digits = fields.get("baseline", "uniform"), _digits(fields)
    evaluated = {m: e for m, e in results["methods"].items() if "pass_at_k" in e}
    paired = (results.get("paired_vs_uniform", {}) if baseline == "uniform"
              else stats.paired_differences(evaluated, baseline))
    rows = [f"| method − {baseline} | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for method in _ordered(paired):
        d = paired[method]
        cells = _paired_cells(d, ks, digits)
        for j, k in ((j, k) for j, k in enumerate(ks) if k in bold):
            mde = d.get("mde80")
            cells[j] = cells[j] if primary and method not in primary else f"**{cells[j]}**"
            cells[j] += "" if mde is None else f" (MDE {mde[d['k'].index(k)]:.{digits}f})"
        rows.append(f"| {NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    starts = seeds_by_start(results)
    if len(starts) > 1:  # the pairs of each start alone, for the methods paired on several: do the starts agree?
        by_start = [stats.paired_differences({m: _only_seeds(e, seeds) for m, e in evaluated.items()}, baseline)
                    for seeds in starts]
        for method in _ordered(paired):
            if sum(method in diffs for diffs in by_start) < 2:
                continue
            for number, (seeds, diffs) in enumerate(zip(starts, by_start), 1):
                if method not in diffs:
                    continue
                d = diffs[method]
                label = f"{NAMES.get(method, method)}, start {number} ({d['num_seeds']} seeds: {_ranges(seeds)})"
                rows.append(f"| {label} | " + " | ".join(_paired_cells(d, ks, digits)) + " |")
    num = sorted({d["num_seeds"] for d in paired.values()})
    from_starts = f", from {len(starts)} SFT starts (`start_by_seed`)" if len(starts) > 1 else ""
    rows += ["", f"Pairs: {'/'.join(map(str, num))} seeds{from_starts}. Primary endpoints in bold."]
    return rows


def _paired_cells(d: dict, ks: list[int], digits: int = 3) -> list[str]:
    """A ``paired_differences`` entry's mean ± 95% t at each of ``ks``."""
    return [_cell(d["mean_diff"][d["k"].index(k)], None if d["ci95"] is None else d["ci95"][d["k"].index(k)],
                  signed=True, digits=digits) for k in ks]


def seeds_by_start(results: dict) -> list[list[int]]:
    """The seeds of each SFT start a results.json pooled (``start_by_seed``), starts in order of their first seed."""
    groups: dict = {}
    for seed, start in sorted(results.get("start_by_seed", {}).items(), key=lambda i: int(i[0])):
        groups.setdefault(start, []).append(int(seed))
    return list(groups.values())


def _only_seeds(entry: dict, seeds: list[int]) -> dict:
    """A method entry's final pass@k restricted to ``seeds`` (what ``paired_differences`` reads)."""
    pk = entry["pass_at_k"]
    keep = [j for j, s in enumerate(pk["seeds"]) if s in seeds]
    return {"pass_at_k": {"k": pk["k"], "seeds": [pk["seeds"][j] for j in keep],
                          "per_seed": [pk["per_seed"][j] for j in keep]}}


def _ranges(seeds: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _expected(value) -> str:
    """An expected cosine, or "—" for a method without a closed form (sampled only)."""
    return "—" if value is None or not np.isfinite(value) else f"{value:.3f}"


def _checkpoint(results: dict, step: int) -> dict:
    found = [c for c in results["checkpoints"] if c["step"] == step]
    if not found:
        raise ValueError(f"no analysed checkpoint at step {step}: {[c['step'] for c in results['checkpoints']]}")
    return found[0]


def alignment_table(results: dict, fields: dict) -> list[str]:
    """Cosine with the exact likelihood gradient at checkpoint ``step``, per N̄: expected, and sampled mean with
    its 95% interval over draws, for the ``methods`` listed."""
    step = int(fields["step"])
    ckpt = _checkpoint(results, step)
    methods = fields["methods"].split(",") if "methods" in fields else _ordered(ckpt["methods"])
    rows = [f"Checkpoint at step {step}: accuracy {ckpt['accuracy']:.2f}, per-image p quantiles "
            + ", ".join(f"{float(q) * 100:g}%: {v:.2f}" for q, v in ckpt["p_quantiles"].items())
            + ". Each cell: expected / sampled mean ± 95% half-width over the draws (—: no closed form).", "",
            "| N̄ | " + " | ".join(NAMES.get(m, m) for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for j, budget in enumerate(ckpt["budgets"]):
        cells = []
        for m in methods:
            entry = ckpt["methods"][m]
            ci = (entry.get("cos_sampled_ci95") or [None] * len(ckpt["budgets"]))[j]
            half = None if ci is None else (ci[1] - ci[0]) / 2
            cells.append(_expected(entry["cos_expected"][j]) + " / " + _cell(entry["cos_sampled_mean"][j], half))
        rows.append(f"| {budget} | " + " | ".join(cells) + " |")
    active = {m: ckpt["methods"][m]["active_frac"] for m in methods if "active_frac" in ckpt["methods"][m]}
    if active:  # recorded by analyses since the released SERA (which gives hopeless images no rollouts)
        rows += ["", "Images sampled at all (active fraction) per N̄: " + "; ".join(
            f"{NAMES.get(m, m)} " + ", ".join(f"{v:.2f}" for v in values) for m, values in active.items()) + "."]
    return rows


def weights_table(results: dict, fields: dict) -> list[str]:
    """Each method's effective weight on a prompt relative to the exact likelihood objective's (1), the mean over
    the prompts of each bin of p (columns), at checkpoint ``step`` and N̄ = ``budget`` for the ``estimator`` (default
    the primary one): the closed form where there is one, else the sampled estimate with its 95% interval over the
    draws; then the prompt-weighted mean over every bin. Above the methods: the prompts in each bin and SERA's
    mean rollouts there (its oracle allocation, and with pilot estimates its mean over pilot outcomes)."""
    from sera_jax.report.stats import ci95_from_se

    step, budget = int(fields["step"]), str(int(fields["budget"]))
    ckpt = _checkpoint(results, step)
    estimator = fields.get("estimator", ckpt["estimator"])
    profiles = ckpt["estimators"][estimator]["weight_profile"]
    if budget not in profiles["budgets"]:
        raise ValueError(f"no weight profiles at N̄ = {budget}: {list(profiles['budgets'])}")
    by_method = profiles["budgets"][budget]
    methods = fields["methods"].split(",") if "methods" in fields else _ordered(by_method)
    edges, count = profiles["edges"], np.asarray(profiles["count"])
    filled = [k for k in range(len(count)) if count[k] > 0]
    names = [f"[{edges[k]:g}, {edges[k + 1]:g}{']' if k == len(count) - 1 else ')'}" for k in filled]
    rows = [f"Checkpoint at step {step}, N̄ = {budget}, estimator `{estimator}`. Columns: bins of p. Each cell: the "
            "method's mean weight over the bin's prompts, relative to the exact likelihood objective (1); closed form, "
            "or, for the methods marked sampled, the mean of the draws' projections ± its 95% half-width.", "",
            "| p | " + " | ".join(names) + " | all prompts |", "|---|" + "---|" * (len(filled) + 1),
            "| prompts | " + " | ".join(str(count[k]) for k in filled) + f" | {int(count.sum())} |"]
    allocation = ckpt["estimators"][estimator]["allocation"].get(budget, {})
    p = np.asarray(ckpt["p"], np.float64)
    inside = [(p >= edges[k]) & ((p < edges[k + 1]) | (k == len(count) - 1)) for k in filled]
    for name, label in (("sera", "SERA's rollouts per prompt (mean)"),
                        ("sera_pilot", "SERA's with pilot p (mean over pilots)")):
        if name in allocation:
            n = np.asarray(allocation[name], np.float64)
            rows.append(f"| {label} | " + " | ".join(f"{n[b].mean():.1f}" for b in inside) + f" | {n.mean():.1f} |")
    for m in methods:
        entry = by_method[m]
        if "expected" in entry:
            mean, half, note = np.asarray(entry["expected"]["mean"], np.float64), None, ""
        else:
            s = entry["sampled"]
            mean = np.asarray(s["mean"], np.float64)
            half, note = ci95_from_se(s["se"], s["draws"]), f" (sampled, {s['draws']} draws)"
        overall = float(np.sum(mean[filled] * count[filled]) / count.sum())
        cells = [f"{mean[k]:#.3g}" + ("" if half is None else f" ± {half[k]:.2g}") for k in filled]
        rows.append(f"| {NAMES.get(m, m)}{note} | " + " | ".join(cells) + f" | {overall:#.3g} |")
    return rows


def training_table(results: dict, fields: dict) -> list[str]:
    """The alignment experiment's training dynamics: each method's final validation pass@k, mean ± 95% t over
    seeds."""
    from sera_jax.report.stats import mean_and_ci95

    training = results["training"]
    ks = _ints(fields.get("ks")) or training["pass_k"]
    rows = ["| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    for method in sorted(training["methods"], key=lambda m: (m != "ce", ORDER.index(m) if m in ORDER else 99)):
        m = training["methods"][method]
        finals = [np.array([curve[-1] for curve in m["pass_at_k"][str(k)]]) for k in ks]
        cells = [_cell(*map(lambda v: None if v is None else float(v), mean_and_ci95(f))) for f in finals]
        rows.append(f"| {'cross-entropy' if method == 'ce' else NAMES.get(method, method)} | {len(finals[0])} | "
                    + " | ".join(cells) + " |")
    return rows


def _start_and_change(evaluations: list[dict], ks: list[int]) -> tuple[list[float], list[float]]:
    """A run's first evaluated pass@k at the ``ks`` and its last minus its first."""
    first, last = evaluations[0], evaluations[-1]
    start = [first["pass_at_k"][first["k"].index(k)] for k in ks]
    return start, [last["pass_at_k"][last["k"].index(k)] - v for k, v in zip(ks, start)]


def start_change_table(results: dict, fields: dict) -> list[str]:
    """Each method's change from its SFT start to its final evaluation, paired by seed (the same start and
    evaluation key): mean ± 95% t over seeds; the regime check is uniform MaxRL's row. When the file
    pooled seeds from several SFT starts (``start_by_seed``), uniform's change on each start's seeds follows: does
    the regime hold on each start?"""
    from sera_jax.report.stats import mean_and_ci95

    ks = _ks(results, fields)
    rows = ["| method: final − start | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |",
            "|---|---|" + "---|" * len(ks)]
    methods = {m: e for m, e in results["methods"].items() if "pass_at_k" in e}

    def row(label: str, method: str, seeds=None) -> None:
        changes = [final - start for seed, (start, final) in _start_and_final_by_seed(methods[method], ks).items()
                   if seeds is None or seed in seeds]
        if not changes:
            return  # no run of this method evaluated its start
        mean, half = mean_and_ci95(np.asarray(changes, np.float64))
        halves = [None] * len(ks) if half is None else [float(h) for h in half]
        cells = [_cell(float(m), h, signed=True, digits=_digits(fields)) for m, h in zip(mean, halves)]
        rows.append(f"| {label} | {len(changes)} | " + " | ".join(cells) + " |")

    for method in _ordered(methods):
        row(NAMES.get(method, method), method)
    starts = seeds_by_start(results)
    if len(starts) > 1 and "uniform" in methods:
        for number, seeds in enumerate(starts, 1):
            row(f"{NAMES['uniform']}, start {number} (seeds {_ranges(seeds)})", "uniform", seeds)
    return rows


def calibration_table(results: dict, fields: dict) -> list[str]:
    """Calibration runs (``scripts/calibration_record.py``): per run and seed, its settings, the start's pass@k at
    the ``ks`` and the change at the last evaluation (``method``, default uniform)."""
    method = fields.get("method", "uniform")
    ks = _ints(fields.get("ks"))
    rows = ["| run | RL seed | SFT seed | prompts a step | N̄ | lr | steps | start: " + " / ".join(f"pass@{k}" for k in ks)
            + " | change at the end |", "|---|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        s = run["settings"]
        for curve in run["methods"].get(method, []):
            start, change = _start_and_change(curve["evaluations"], ks)
            last = curve["evaluations"][-1]
            # Before sft.seed existed a shared start was made with the first seed, the run's only one here.
            rows.append(f"| {run['name']} | {curve['seed']} | {s.get('sft.seed', curve['seed'])} "
                        f"| {s['rl.prompts_per_step']} | {s['rollouts_per_prompt']:g} "
                        f"| {s['rl.learning_rate']:g} | {last['step']} | " + " / ".join(f"{v:.3f}" for v in start)
                        + " | " + " / ".join(f"{v:+.3f}".replace("-", "−") for v in change) + " |")
    return rows


def active_set_calibration_table(results: dict, fields: dict) -> list[str]:
    """Calibrations of a set where the released rule's active set should fire (``scripts/calibration_record.py``,
    with each run's active fraction at every step): per run and seed its set and learning rate, sera's active
    fraction averaged over the steps after epoch 0 (``maze.num_train / rl.prompts_per_step`` steps), and uniform's
    change in pass@1 and pass@``k`` (default 32) from its start to its last evaluation."""
    k = int(fields.get("k", 32))
    rows = [f"| run | RL seed | mazes | hopeless | near-certain | lr | sera active after epoch 0 | uniform pass@1 "
            f"| uniform pass@{k} |", "|---|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        s, methods = run["settings"], run["methods"]
        epoch0 = s["maze.num_train"] // s["rl.prompts_per_step"]
        for seed in sorted({c["seed"] for curves in methods.values() for c in curves}):
            sera = next((c for c in methods.get("sera", []) if c["seed"] == seed), {})
            uniform = next((c for c in methods.get("uniform", []) if c["seed"] == seed), {})
            cells = [f"{np.mean(sera['active_frac'][epoch0:]):.3f}" if "active_frac" in sera else ""]
            evaluations = uniform.get("evaluations", [])
            changes = _start_and_change(evaluations, [1, k])[1] if len(evaluations) > 1 else ["", ""]
            cells += [f"{c:+.3f}".replace("-", "−") if c != "" else "" for c in changes]
            rows.append(f"| {run['name']} | {seed} | {s['maze.size']}x{s['maze.size']}, {s['maze.num_train']} "
                        f"| {s['maze.hard_fraction']:g} | {s.get('maze.easy_fraction', 0):g} "
                        f"| {s['rl.learning_rate']:g} | " + " | ".join(cells) + " |")
    return rows


def _start_and_final_by_seed(entry: dict, ks: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """seed -> (the start's pass@k, the final pass@k) at the ``ks``, for the runs that evaluated their start."""
    out = {}
    for curve in entry["curves"]:
        evaluations = curve["evaluations"]
        if len(evaluations) > 1 and evaluations[0].get("rollouts_spent", 0) == 0:
            first, last = evaluations[0], evaluations[-1]
            out[curve["seed"]] = tuple(np.array([e["pass_at_k"][e["k"].index(k)] for k in ks]) for e in (first, last))
    return out


def budgets_table(results: dict, fields: dict) -> list[str]:
    """How many rollouts ``method`` (default sera) saves: uniform's gain from this file's budget to the
    ``larger`` file's, against ``method``'s gain over uniform at this budget, paired by seed.

    With uniform's pass@k taken as linear in log(budget) between the two budgets, ``method`` at the smaller budget
    matches uniform at ``B_small * (B_big / B_small) ** r``, r = (method − uniform at B_small) / (uniform's gain
    from B_small to B_big): a ratio of paired means, with Fieller's 95% interval (unbounded when uniform's gain is
    not itself significant). Budgets are training rollouts per run. Uniform's gain is the change from each run's
    own SFT start (the plain difference where both budgets' runs of a seed share their start); a row pools the
    seeds whose start is the same in both files, a second every paired seed when some are not (start-adjusted).
    "Rollouts saved" reads off only where uniform gains with the budget; where it loses (pass@1 can: more rollouts
    a prompt move MaxRL towards the likelihood objective, away from pass@1), r says how much of that move
    ``method`` makes at the smaller budget.
    """
    from sera_jax.report.stats import mean_and_ci95, ratio_of_paired_means

    if "larger_results" not in fields:
        raise ValueError("results marker: view=budgets needs larger=PATH, the results.json of the larger budget")
    larger, method, ks = fields["larger_results"], fields.get("method", "sera"), _ks(results, fields)
    small_u = _start_and_final_by_seed(results["methods"]["uniform"], ks)
    small_m = _start_and_final_by_seed(results["methods"][method], ks)
    big_u = _start_and_final_by_seed(larger["methods"]["uniform"], ks)
    b_small = float(np.mean(results["methods"]["uniform"]["train_rollouts"]))
    b_big = float(np.mean(larger["methods"]["uniform"]["train_rollouts"]))
    seeds = sorted(set(small_u) & set(small_m) & set(big_u))
    starts_small, starts_big = results.get("start_by_seed", {}), larger.get("start_by_seed", {})
    same = [s for s in seeds if starts_small.get(str(s)) is not None
            and starts_small.get(str(s)) == starts_big.get(str(s))]
    groups = [("same start", same)] + ([("all, start-adjusted", seeds)] if len(same) < len(seeds) else [])
    name = NAMES.get(method, method)

    def budget(r: float) -> float:  # uniform's budget at fraction r of its gain, log-linear between the two
        return b_small * (b_big / b_small) ** r

    rows = [f"| pass@k | seeds | uniform: {b_big:,.0f} − {b_small:,.0f} rollouts | {name} − uniform at "
            f"{b_small:,.0f} | r = ratio of the two | uniform's budget that matches {name} at {b_small:,.0f} |",
            "|---|---|---|---|---|---|"]
    for j, k in enumerate(ks):
        for label, group in groups:
            if len(group) < 2:
                continue
            gain_u = np.array([(big_u[s][1] - big_u[s][0])[j] - (small_u[s][1] - small_u[s][0])[j] for s in group])
            gain_m = np.array([small_m[s][1][j] - small_u[s][1][j] for s in group])
            cells = [_cell(*map(float, mean_and_ci95(g)), signed=True) for g in (gain_u, gain_m)]
            r, interval = ratio_of_paired_means(gain_m, gain_u)
            if interval is None:
                r_cell, budget_cell = f"{r:.2f} (interval unbounded)", "not determined"
            else:
                lo, hi = interval
                r_cell = f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
                budget_cell = f"{budget(r):,.0f} [{budget(lo):,.0f}, {budget(hi):,.0f}]"
                budget_cell += "" if 0 <= r <= 1 else " (extrapolated)"
                budget_cell += " (uniform loses with the budget)" if gain_u.mean() < 0 else ""
            rows.append(f"| pass@{k} | {len(group)} ({label}: {_ranges(group)}) | " + " | ".join(cells)
                        + f" | {r_cell.replace('-', '−')} | {budget_cell.replace('-', '−')} |")
    return rows


def attenuation_table(results: dict, fields: dict) -> list[str]:
    """How much MaxRL's estimator attenuates the held-out prompts of the SFT start at uniform budgets: at each
    quantile of the start's per-prompt success rate (step-0 evaluations of ``method``'s runs, default uniform,
    averaged over seeds), the factor ``s(p, N) = 1 - (1-p)^(N-1)`` at each N̄ of ``budgets``. SERA can only
    reallocate where s is well below 1 for some prompts and not others."""
    from sera_jax import core

    budgets = _ints(fields.get("budgets"))
    starts = [curve["evaluations"][0] for curve in results["methods"][fields.get("method", "uniform")]["curves"]
              if curve["evaluations"] and curve["evaluations"][0].get("rollouts_spent", 0) == 0]
    if not starts:
        raise ValueError("view=attenuation: no run of this file evaluated its start")
    quantiles = sorted(starts[0]["p_quantiles"], key=float)
    p_by_q = {q: float(np.mean([e["p_quantiles"][q] for e in starts])) for q in quantiles}
    rows = ["| quantile of p over the held-out prompts | p at the start | "
            + " | ".join(f"s(p, {n}): uniform N̄ = {n}" for n in budgets) + " |",
            "|---|---|" + "---|" * len(budgets)]
    for q in quantiles:
        p = p_by_q[q]
        factors = [float(core.scale_factor(np.float32(p), n, "maxrl")) for n in budgets]
        rows.append(f"| {float(q):.0%} | {p:.3f} | " + " | ".join(f"{v:.2f}" for v in factors) + " |")
    unsolved = 1.0 - float(np.mean([e["solved_frac"] for e in starts]))
    rows += ["", f"The start's evaluations on {len(starts)} seeds; {unsolved:.1%} of the held-out prompts had no "
             "success in any of their samples (p about 0 at the lowest quantiles)."]
    return rows


def allocation_table(results: dict, fields: dict) -> list[str]:
    """Where each method's rollouts went, mean ± 95% t over seeds: the fraction of prompts given rollouts (the
    active set) in the first, middle and last fifth of training and its least logged value, the fraction of
    training rollouts spent on unmixed groups (all fail or all pass: no learning signal), and the fractions of
    groups that all fail and all pass. With ``after=S`` (the first step of epoch 1, on a fixed set revisited in
    epochs) also the fraction of groups that were mixed from step S on: the groups a step trains on. From each
    run's allocation diagnostics at every step where results.json has them (``history.allocation``), else from its
    thinned history (every ``every``-th step and the last: the table says which); the unmixed rollouts from the
    run's totals where it has them. Where every run logged which prompts it gave no rollouts at every step, also how
    many a step from step S on, by the side of their estimate (``dropped_hard``: p-hat below 1/2, which under
    epoch-frozen estimates is a prompt that failed every rollout of its last visit; ``dropped_easy``: passed every
    one)."""
    from sera_jax.report.stats import mean_and_ci95

    after = int(fields["after"]) if "after" in fields else None
    histories_of = {m: [h for h in e.get("history", []) if h.get("steps") and "active_frac" in h["steps"][0]]
                    for m, e in results["methods"].items()}
    # Which prompts a rule dropped, where every run logged it at every step (a file from before that was logged has
    # none, and its table is as it was).
    dropped = after is not None and all("dropped_hard" in (h.get("allocation") or {})
                                        for hs in histories_of.values() for h in hs)

    def logged(history: dict) -> list[dict]:
        by_step = history.get("allocation")
        if not by_step:
            return history["steps"]
        names = [k for k in by_step if k != "steps"]
        return [{"step": s, **{k: by_step[k][i] for k in names}} for i, s in enumerate(by_step["steps"])]

    def per_seed(history: dict) -> list[float]:
        steps = logged(history)
        n = len(steps)
        fifths = [steps[:max(1, n // 5)], steps[2 * n // 5:max(2 * n // 5 + 1, 3 * n // 5)], steps[-max(1, n // 5):]]
        active = [float(np.mean([h["active_frac"] for h in part])) for part in fifths]
        totals = history.get("totals") or {}
        if "rollouts_unmixed" in totals and totals.get("rollouts_sampled"):
            unmixed = totals["rollouts_unmixed"] / totals["rollouts_sampled"]
        else:
            unmixed = float(np.mean([h["rollouts_unmixed_frac"] for h in steps]))
        row = [*active, min(h["active_frac"] for h in steps), unmixed,
               float(np.mean([h["all_fail_group_fraction"] for h in steps])),
               float(np.mean([h["all_pass_group_fraction"] for h in steps]))]
        if after is not None:
            later = [h for h in steps if h["step"] >= after]
            row.append(float(np.mean([h["useful_group_fraction"] for h in later])))
            if dropped:
                row += [float(np.mean([h[name] for h in later])) for name in ("dropped_hard", "dropped_easy")]
        return row

    header = ["active, first fifth", "active, middle fifth", "active, last fifth", "least active",
              "rollouts on unmixed groups", "all-fail groups", "all-pass groups"]
    if after is not None:
        header.append(f"mixed groups from step {after} (after epoch 0)")
    if dropped:
        header += [f"prompts dropped a step from step {after}: all failed at last visit",
                   "prompts dropped a step: all passed at last visit"]
    rows = ["| method | seeds | " + " | ".join(header) + " |", "|---|---|" + "---|" * len(header)]
    strides = set()
    for method in _ordered(results["methods"]):
        histories = histories_of[method]
        if not histories:
            continue
        strides |= {1 if h.get("allocation") else h.get("every", 1) for h in histories}
        values = np.array([per_seed(h) for h in histories])
        mean, half = mean_and_ci95(values)
        cells = [_cell(float(m), None if half is None else float(h)) for m, h in
                 zip(mean, half if half is not None else [None] * len(mean))]
        rows.append(f"| {NAMES.get(method, method)} | {len(histories)} | " + " | ".join(cells) + " |")
    if strides and strides != {1}:
        every = ", ".join(str(s) for s in sorted(strides))
        rows += ["", f"From the history as results.json keeps it: one step in {every} and each run's last (the "
                 "rollouts on unmixed groups from every step's totals)."]
    return rows


def endpoints_table(results: dict, fields: dict) -> list[str]:
    """The declared endpoints of a comparison that records them (``results["endpoints"]``: e.g. held-out top-1 and
    pass@k at an early and the final step): each method's mean ± 95% t over seeds, then each method minus uniform
    paired by seed with its MDE at 80% power; with ``results["gradient_cosine"]``, the cosine of each method's
    gradient to the exact one (mean over the run and up to the early step), absolute and paired."""
    e = results["endpoints"]
    names = e["names"]
    rows = ["| method | seeds | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for method in _ordered(e["methods"]):
        m = e["methods"][method]
        cells = [_cell(v, None if m["ci95"] is None else h) for v, h in
                 zip(m["mean"], m["ci95"] or [None] * len(names))]
        rows.append(f"| {NAMES.get(method, method)} | {len(m['seeds'])} | " + " | ".join(cells) + " |")
    rows += ["", "| method − uniform (paired) | seeds | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for method in _ordered(e.get("paired_vs_uniform", {})):
        d = e["paired_vs_uniform"][method]
        cells = [_cell(v, None if d["ci95"] is None else h, signed=True)
                 + ("" if d.get("mde80") is None else f" (MDE {d['mde80'][j]:.3f})")
                 for j, (v, h) in enumerate(zip(d["mean_diff"], d["ci95"] or [None] * len(names)))]
        rows.append(f"| {NAMES.get(method, method)} | {d['num_seeds']} | " + " | ".join(cells) + " |")
    cosine = results.get("gradient_cosine")
    if cosine:
        early = cosine["early_step"]
        rows += ["", f"| gradient cosine to cross-entropy's | run mean | mean to step {early} | run mean − uniform | "
                     f"to step {early} − uniform |", "|---|---|---|---|---|"]
        paired = cosine.get("paired_vs_uniform", {})
        for method in _ordered(cosine["methods"]):
            m, d = cosine["methods"][method], paired.get(method)
            cells = [_cell(m[k]["mean"][0], None if m[k]["ci95"] is None else m[k]["ci95"][0])
                     for k in ("run_mean", "early_mean")]
            cells += ["" if d is None else _cell(d[k]["mean_diff"][0], None if d[k]["ci95"] is None else d[k]["ci95"][0],
                                                 signed=True) for k in ("run_mean", "early_mean")]
            rows.append(f"| {NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    return rows


def _matched_readings(results: dict) -> list[dict]:
    """The primary matched-pass@1 reading of a file, then its secondary ones (treated run x k)."""
    m = results["matched_pass_at_1"]
    return [m, *m.get("secondary", [])]


def matched_table(results: dict, fields: dict) -> list[str]:
    """Coverage at matched pass@1 (``results["matched_pass_at_1"]``, ``sera_jax.report.matched``): per treated run
    and k, its final pass@1 and pass@k, the references' pass@k at that pass@1, and the difference paired by seed
    (mean ± 95% t), with how many seeds' pass@1 fell outside every reference path (read off its nearest end)."""
    m = results["matched_pass_at_1"]
    refs = ", ".join(NAMES.get(r, r) for r in m["references"])
    rows = [f"| treated run | k | seeds | its final pass@1 | its final pass@k | references' pass@k at that pass@1 | "
            f"difference (paired, 95% t) | seeds read off an end (above / below) |",
            "|---|---|---|---|---|---|---|---|"]
    for found in _matched_readings(results):
        per_seed = found["per_seed"]
        means = [float(np.mean([s[key] for s in per_seed]))
                 for key in ("pass_at_1", "pass_at_k", "reference_pass_at_k")]
        ends = [sum(s["clamped"] == side for s in per_seed) for side in ("above", "below")]
        label = NAMES.get(found["treated"], found["treated"]) + (" (primary)" if found is m else "")
        rows.append(f"| {label} | {found['k']} | {found['num_seeds']} | "
                    + " | ".join(_cell(v, None) for v in means)
                    + f" | {_cell(found['mean_diff'], found['ci95'], signed=True)} | {ends[0]} / {ends[1]} |")
    return rows + ["", f"References: {refs}, each evaluated along its run; a treated run's pass@k is compared with "
                       "theirs where their paths first reach its final pass@1 (linear between evaluations)."]


# The README's headline (``view=headline``): one row per comparison, SERA against uniform MaxRL at its primary
# endpoints, each linking to its section of docs/results.md (``anchor``: the section heading's GitHub slug, checked
# by tests/test_docs.py). ``file`` is relative to the marker's folder; ``rule`` says which SERA ran (``all_active``:
# the max-min over every prompt, saved under the name ``sera`` before ``sera`` became the released rule; None: the
# released rule); ``endpoints`` are pass@k or a recorded endpoint's name (paired by seed, mean ± 95% t), or
# ``cosine@N`` (the alignment analysis' expected cosine with the exact gradient at N̄ = N, checkpoint ``step``), or
# ``matched@K`` (pass@K at matched pass@1, ``view=matched``: ``method`` is a treated run of the file's spec).
# ``regime=True`` adds uniform MaxRL's own change from its start at those endpoints: did the baseline hold the
# regime?
HEADLINE = (
    dict(label="Maze 11x11, N̄ = 32", anchor="maze-at-32-rollouts-a-prompt", file="maze_n32/results.json",
         method="sera", rule="all_active", estimates="2-rollout pilot", endpoints=("pass@1", "pass@32")),
    dict(label="Maze 11x11, N̄ = 64", anchor="maze-at-64-rollouts-a-prompt", file="maze_n64/results.json",
         method="sera", rule="all_active", estimates="2-rollout pilot", endpoints=("pass@1", "pass@32")),
    dict(label="Maze 11x11 over 12.5 epochs, N0 = 16", anchor="maze-over-epochs-128-fixed-mazes",
         file="maze_epochs/results.json", method="sera_epochs", rule=None, estimates="epoch-frozen history",
         endpoints=("pass@1", "pass@32"), regime=True),
    dict(label="Maze 11x11 over 12.5 epochs, coverage at matched pass@1, N0 = 16",
         anchor="maze-over-epochs-coverage-at-matched-pass1", file="maze_frontier/results.json", method="sera",
         rule=None, estimates="epoch-frozen history", endpoints=("matched@32",)),
    dict(label="Maze 11x11 over 12.5 epochs, 3/8 hopeless, N0 = 16", anchor="maze-over-epochs-with-hopeless-mazes",
         file="maze_epochs_hard/results.json", method="sera_epochs", rule=None, estimates="epoch-frozen history",
         endpoints=("pass@1", "pass@32"), regime=True),
    dict(label="Maze 9x9 over 12 epochs, 1/2 hopeless, N0 = 128 (the active set fires)",
         anchor="the-released-rule-where-its-active-set-fires-the-maze-at-n0--128", file="maze_active_set/results.json",
         method="sera", rule=None, estimates="epoch-frozen history", endpoints=("pass@1", "pass@32"), regime=True,
         digits=4),
    dict(label="Arithmetic word problems, N̄ = 64", anchor="math-at-64-rollouts-a-problem",
         file="math_reasoning_n64/results.json", method="sera_pilot", rule="all_active", estimates="2-rollout pilot",
         endpoints=("pass@1", "pass@16")),
    dict(label="Arithmetic word problems over 10 epochs, N0 = 16", anchor="math-over-epochs-256-fixed-problems",
         file="math_epochs/results.json", method="sera", rule=None, estimates="epoch-frozen history",
         endpoints=("pass@1", "pass@16"), regime=True),
    dict(label="Digit classification, N0 = 4", anchor="classification-at-4-labels-an-image",
         file="classification/results.json", method="sera", rule=None, estimates="true p",
         endpoints=("top1@50", "top1@300")),
    dict(label="Digit classification, N0 = 16", anchor="classification-at-16-labels-an-image",
         file="classification_n16/results.json", method="sera", rule=None, estimates="true p",
         endpoints=("top1@50", "top1@300")),
    dict(label="Gradient alignment on digits, N̄ = 4", anchor="gradient-alignment-on-digits",
         file="imagenet_alignment/results.json", method="sera", rule="all_active", estimates="true p",
         endpoints=("cosine@4",), step=40),
)
HEADLINE_DOC = "docs/results.md"


def _headline_cells(results: dict, row: dict) -> tuple[str, list[str]]:
    """(seeds, one cell per endpoint) of a ``HEADLINE`` row."""
    method, cells, seeds, digits = row["method"], [], set(), row.get("digits", 3)
    for name in row["endpoints"]:
        if name.startswith("cosine@"):
            ckpt = _checkpoint(results, int(row["step"]))
            j = ckpt["budgets"].index(int(name.split("@")[1]))
            ours, uniform = (ckpt["methods"][m]["cos_expected"][j] for m in (method, "uniform"))
            cells.append(f"cosine with the exact gradient {ours:.3f} (uniform {uniform:.3f}; expected, "
                         f"checkpoint at step {row['step']})")
            continue
        if name.startswith("matched@"):  # pass@k at matched pass@1 (view=matched)
            k = int(name.split("@")[1])
            found = next((f for f in _matched_readings(results) if f["treated"] == method and f["k"] == k), None)
            if found is None:
                raise ValueError(f"headline {row['label']!r}: the file has no matched-pass@1 reading of {method} at "
                                 f"k = {k}")
            seeds.add(found["num_seeds"])
            cells.append(f"pass@{k} at matched pass@1 " + _cell(found["mean_diff"], found["ci95"], signed=True))
            continue
        if "endpoints" in results and name in results["endpoints"]["names"]:
            d, index = results["endpoints"]["paired_vs_uniform"][method], results["endpoints"]["names"].index(name)
        else:
            d = results["paired_vs_uniform"][method]
            index = d["k"].index(int(name.removeprefix("pass@")))
        seeds.add(d["num_seeds"])
        cells.append(f"{name} " + _cell(d["mean_diff"][index], None if d["ci95"] is None else d["ci95"][index],
                                        signed=True, digits=digits))
    if row.get("regime"):
        cells[-1] += " (" + _uniform_change(results, row["endpoints"], digits) + ")"
    return "/".join(map(str, sorted(seeds))) or "—", cells


def _uniform_change(results: dict, endpoints: tuple[str, ...], digits: int = 3) -> str:
    """Uniform MaxRL's own change from its start at pass@k ``endpoints`` (the regime check), mean ± 95% t."""
    from sera_jax.report.stats import mean_and_ci95

    ks = [int(name.removeprefix("pass@")) for name in endpoints]
    changes = [final - start for start, final in _start_and_final_by_seed(results["methods"]["uniform"], ks).values()]
    mean, half = mean_and_ci95(np.asarray(changes, np.float64))
    return "uniform MaxRL's own change: " + ", ".join(
        f"pass@{k} " + _cell(float(m), None if half is None else float(h), signed=True, digits=digits)
        for k, m, h in zip(ks, mean, half if half is not None else [None] * len(ks)))


def headline_table(results_dir: pathlib.Path, folder: str) -> tuple[list[str], list[str]]:
    """The README's headline from the files of ``HEADLINE`` under ``results_dir / folder``: (table lines, provenance
    lines)."""
    rows = ["| comparison (details) | SERA that ran | estimates of p | seeds | SERA against uniform MaxRL at the "
            "primary endpoints (paired by seed, 95% t-interval) |", "|---|---|---|---|---|"]
    files = []
    for row in HEADLINE:
        file = results_dir / folder / row["file"]
        if not file.is_file():
            raise FileNotFoundError(f"results marker view=headline: {file} does not exist")
        results = json.loads(file.read_text())["results"]
        seeds, cells = _headline_cells(results, row)
        rule = "all-active max–min (`sera_all_active`)" if row["rule"] == "all_active" else "released (`sera`)"
        rows.append(f"| [{row['label']}]({HEADLINE_DOC}#{row['anchor']}) | {rule} | {row['estimates']} | {seeds} | "
                    + "; ".join(cells) + " |")
        files.append(f"`results/{folder}/{row['file']}`")
    return rows, ["Data: " + ", ".join(files) + f" (each file's command and commit: {HEADLINE_DOC})."]


VIEWS = {"pass_at_k": pass_at_k_table, "allocation": allocation_table, "endpoints": endpoints_table, "paired": paired_table, "alignment": alignment_table,
         "weights": weights_table, "training": training_table, "calibration": calibration_table,
         "active_set_calibration": active_set_calibration_table, "matched": matched_table,
         "start_change": start_change_table, "budgets": budgets_table, "attenuation": attenuation_table,
         "headline": headline_table}


def provenance_line(path: str, saved: dict) -> str:
    prov = saved.get("provenance") or {}
    commit = (prov.get("commit") or "unknown")[:10] + (" (uncommitted changes)" if prov.get("dirty") else "")
    return f"Data: `results/{path}` (`{prov.get('command', 'command not recorded')}`, commit {commit})."


def render(spec: str, results_dir: pathlib.Path = RESULTS) -> str:
    """The body of the block with marker ``spec``: the table, then its provenance line."""
    path, fields = parse_spec(spec)
    if fields["view"] == "headline":  # several files, under the folder ``path``
        lines, provenance = headline_table(results_dir, path.rstrip("/"))
        return "\n".join([*lines, "", *provenance]) + "\n"
    file = results_dir / path
    if not file.is_file():
        raise FileNotFoundError(f"results marker {spec!r}: {file} does not exist")
    saved = json.loads(file.read_text())
    provenance = [provenance_line(path, saved)]
    if "larger" in fields:  # the budgets view reads a second file
        if not (results_dir / fields["larger"]).is_file():
            raise FileNotFoundError(f"results marker {spec!r}: {results_dir / fields['larger']} does not exist")
        larger = json.loads((results_dir / fields["larger"]).read_text())
        fields = {**fields, "larger_results": larger["results"]}
        provenance.append(provenance_line(fields["larger"], larger))
    # Markers that relabel the SERA rows: ``rule=all_active`` (a file from before the released rule: its "sera" rows
    # ran the max-min) and ``estimates=epoch_history`` (its "sera" ran the released rule on epoch-frozen estimates).
    relabel = {}
    for field, value, names in (("rule", "all_active", ALL_ACTIVE_NAMES), ("estimates", "epoch_history", EPOCH_NAMES)):
        if field in fields and fields[field] != value:
            raise ValueError(f"results marker {spec!r}: {field}={fields[field]!r}; the only value is {value}")
        relabel.update(names if field in fields else {})
    global NAMES
    released = NAMES
    NAMES = {**NAMES, **relabel}
    try:
        lines = VIEWS[fields["view"]](saved["results"], fields)
    finally:
        NAMES = released
    return "\n".join([*lines, "", *provenance]) + "\n"


def regenerate(text: str, results_dir: pathlib.Path = RESULTS) -> str:
    """``text`` with every results block's body rendered afresh from the files."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("spec"), results_dir) + m.group(4), text)


def stale_blocks(text: str, results_dir: pathlib.Path = RESULTS) -> list[str]:
    """The markers whose body differs from what the files give."""
    return [m.group("spec") for m in BLOCK.finditer(text) if m.group("body") != render(m.group("spec"), results_dir)]


def documents() -> list[pathlib.Path]:
    """The markdown files whose generated tables are kept current: README.md and every docs/*.md with a marker."""
    return [README, *(p for p in sorted(DOCS.glob("*.md")) if BLOCK.search(p.read_text()))]


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from experiments import platforms

    platforms.quiet_absent_accelerators()  # before this process imports JAX (through sera_jax)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated table is out of date")
    parser.add_argument("files", nargs="*", type=pathlib.Path,
                        help="markdown files with result markers (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    stale_any = False
    for path in [p.resolve() for p in args.files] or documents():
        text = path.read_text()
        if args.check:
            for spec in stale_blocks(text):
                stale_any = True
                print(f"{_name(path)}: the table of <!-- results: {spec} --> differs from the file; run "
                      "python scripts/readme_results.py", file=sys.stderr)
            continue
        new = regenerate(text)
        if new != text:
            path.write_text(new)
            print(f"{_name(path)}: {len(BLOCK.findall(text))} result tables regenerated")
    return 1 if stale_any else 0


if __name__ == "__main__":
    sys.exit(main())
