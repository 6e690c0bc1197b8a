"""Statistics over seeds (or draws): means with 95% Student-t intervals, and pass@k runs summarised per method.

Imports only NumPy and ``scipy.special`` (the t quantile ``stdtrit``): ``scipy.stats`` would add seconds to
every start-up that reaches this module.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from scipy.special import stdtrit


def mean_and_ci95(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Mean over ``axis`` and the half-width of its 95% Student-t confidence interval.

    ``half = t_{0.975, n-1} * sd / sqrt(n)`` with the sample standard deviation ``sd`` (ddof = 1) of the n
    values along ``axis``; None when n < 2 (no interval from one value).
    """
    values = np.asarray(values, np.float64)
    n = values.shape[axis]
    mean = values.mean(axis=axis)
    if n < 2:
        return mean, None
    half = stdtrit(n - 1, 0.975) * values.std(axis=axis, ddof=1) / np.sqrt(n)
    return mean, half


def ci95_from_se(se, n: int) -> np.ndarray:
    """The half-width ``t_{0.975, n-1} * se`` of the 95% Student-t interval of a mean of ``n`` >= 2 independent
    values whose standard error is ``se`` (as :func:`mean_and_ci95` gives from the values themselves)."""
    return stdtrit(n - 1, 0.975) * np.asarray(se, np.float64)


def mean_and_interval95(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, Optional[list[np.ndarray]]]:
    """Mean over ``axis`` and its 95% Student-t interval ``[mean - half, mean + half]`` (see
    :func:`mean_and_ci95`); None instead of the interval when there are fewer than 2 values."""
    mean, half = mean_and_ci95(values, axis)
    return mean, None if half is None else [mean - half, mean + half]


def minimum_detectable_effect(sd: np.ndarray, n: int, power: float = 0.8, alpha: float = 0.05) -> Optional[np.ndarray]:
    """The smallest true mean difference a two-sided paired t-test at level ``alpha`` detects with probability
    ``power`` from ``n`` pairs whose differences have standard deviation ``sd``:

        MDE = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)

    (the usual t approximation to the noncentral-t power; within a point or two of ``power`` from n = 5 on,
    checked by simulation in the tests). None when n < 2."""
    if n < 2:
        return None
    return (stdtrit(n - 1, 1 - alpha / 2) + stdtrit(n - 1, power)) * np.asarray(sd, np.float64) / np.sqrt(n)


def ratio_of_paired_means(numerator: np.ndarray, denominator: np.ndarray
                          ) -> tuple[float, Optional[tuple[float, float]]]:
    """``mean(numerator) / mean(denominator)`` over n paired values, with Fieller's 95% interval.

    Fieller's interval is the set of ratios r that a t-test of ``mean(numerator - r * denominator) = 0`` does not
    reject at the 5% level: the r with ``(a - r b)^2 <= t^2 (v_aa - 2 r v_ab + r^2 v_bb)``, where a, b are the means
    and v the (co)variances of the means (sample covariance / n, ddof 1), t = t_{0.975, n-1}. It is bounded only
    when the denominator's mean is itself significantly away from 0 (``b^2 > t^2 v_bb``); otherwise the data allow
    ratios of either sign without bound, and the interval is None (so is it with fewer than 2 pairs).
    """
    a_values, b_values = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    if a_values.shape != b_values.shape or a_values.ndim != 1:
        raise ValueError(f"ratio_of_paired_means needs two 1-d arrays of one length, got shapes "
                         f"{a_values.shape} and {b_values.shape}")
    n = len(a_values)
    a, b = a_values.mean(), b_values.mean()
    ratio = a / b if b != 0 else float("nan")
    if n < 2:
        return float(ratio), None
    cov = np.cov(a_values, b_values, ddof=1) / n
    t2 = stdtrit(n - 1, 0.975) ** 2
    quad, half_lin, const = b * b - t2 * cov[1, 1], a * b - t2 * cov[0, 1], a * a - t2 * cov[0, 0]
    disc = half_lin * half_lin - quad * const
    if quad <= 0 or disc < 0:
        return float(ratio), None
    root = np.sqrt(disc)
    return float(ratio), (float((half_lin - root) / quad), float((half_lin + root) / quad))


#: Per-step training metrics whose sum over a run is one of its totals (rollouts and tokens spent, seconds).
ADDITIVE_METRICS = ("rollouts_sampled", "rollouts_trained", "tokens_sampled", "tokens_trained", "step_seconds",
                    "sampling_rounds", "update_skipped", "rollouts_unmixed")
#: About how many steps of a run's training history a summary keeps (the workdir's metrics keep them all).
HISTORY_POINTS = 20
#: Per-step allocation diagnostics a summary keeps at every step (``allocation_by_step``): a few numbers a step,
#: and what an allocation table reads (which prompts got rollouts, which groups were mixed).
ALLOCATION_METRICS = ("active_frac", "useful_group_fraction", "all_fail_group_fraction", "all_pass_group_fraction",
                      "rollouts_unmixed_frac", "counts_min", "counts_max", "prompts_trained", "dropped_hard",
                      "dropped_easy")


def allocation_by_step(steps: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """``{"steps": [...], metric: [value at each step]}`` for the ``ALLOCATION_METRICS`` that every step logs;
    None unless the history holds every step 0, 1, ..., n - 1 (a thinned one cannot give them)."""
    if not steps or [int(h["step"]) for h in steps] != list(range(len(steps))):
        return None
    names = [m for m in ALLOCATION_METRICS if all(m in h for h in steps)]
    if not names:
        return None
    return {"steps": [int(h["step"]) for h in steps], **{m: [float(h[m]) for h in steps] for m in names}}


def history_stride(steps: list[dict[str, Any]], points: int = HISTORY_POINTS) -> int:
    """The step stride that keeps about ``points`` of a history: ceil((last step + 1) / points), at least 1."""
    if not steps:
        return 1
    return max(1, -(-(int(steps[-1]["step"]) + 1) // points))


def thin_history(steps: list[dict[str, Any]], stride: int) -> list[dict[str, Any]]:
    """The steps whose number is a multiple of ``stride``, and the last: thinning twice keeps the same steps,
    so runs pooled from an earlier summary are not thinned further."""
    return [h for i, h in enumerate(steps) if int(h["step"]) % stride == 0 or i == len(steps) - 1]


def history_totals(steps: list[dict[str, Any]]) -> Optional[dict[str, float]]:
    """Sums of the ``ADDITIVE_METRICS`` a history logs, over its steps; None unless it holds every step
    0, 1, ..., n - 1 (a thinned or sparsely logged history cannot be summed)."""
    if [int(h["step"]) for h in steps] != list(range(len(steps))):
        return None
    return {name: float(sum(h[name] for h in steps)) for name in ADDITIVE_METRICS
            if steps and all(name in h for h in steps)}


def summarize_runs(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per method: training rollouts spent, final pass@k (mean, ci95, per seed) and the eval curves.

    ``runs[method]`` is a list of runs ``{"seed", "history", "evaluations", "rollouts_spent"}`` (as
    ``sera_jax.rl.comparison`` collects them from ``train_rl``; a run read back by :func:`runs_from_summary`
    also has its ``totals``). Returns
    ``{"methods": {method: entry}, "paired_vs_uniform": paired_differences(methods)}``; ``entry`` holds
    ``seeds``, ``train_rollouts``, ``curves``, ``history`` (per run ``{"seed", "every", "steps", "totals"}``: every
    ``every``-th step and the last, about ``HISTORY_POINTS`` of them, and the sums of the additive metrics over all
    steps, so that a results.json stays small whatever the grid) and, when the runs evaluated,
    ``pass_at_k = {"k", "mean", "ci95" (half-widths or None), "per_seed", "seeds"}`` (``per_seed[j]`` is seed
    ``seeds[j]``'s: the runs that evaluated, which may be fewer than the entry's ``seeds``).
    """
    methods = {}
    for method, seed_runs in runs.items():
        evaluated = [r for r in seed_runs if r["evaluations"]]
        finals = [r["evaluations"][-1] for r in evaluated]
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in seed_runs],
            "train_rollouts": [int(r["rollouts_spent"]) for r in seed_runs],
            "curves": [{"seed": r["seed"], "evaluations": r["evaluations"]} for r in seed_runs],
            "history": [summarize_history(r) for r in seed_runs],
        }
        if finals:
            per_seed = np.array([f["pass_at_k"] for f in finals])
            mean, ci = mean_and_ci95(per_seed)
            entry["pass_at_k"] = {"k": finals[0]["k"], "mean": mean.tolist(),
                                  "ci95": None if ci is None else ci.tolist(), "per_seed": per_seed.tolist(),
                                  "seeds": [r["seed"] for r in evaluated]}
        methods[method] = entry
    return {"methods": methods, "paired_vs_uniform": paired_differences(methods)}


def summarize_history(run: dict[str, Any]) -> dict[str, Any]:
    """A run's history as a summary keeps it: ``{"seed", "every", "steps", "totals"}`` and, where every step was
    logged, ``"allocation"`` (``allocation_by_step``: the allocation diagnostics at every step; see summarize_runs)."""
    stride = history_stride(run["history"])
    totals = run["totals"] if run.get("totals") is not None else history_totals(run["history"])
    summary = {"seed": run["seed"], "every": stride, "steps": thin_history(run["history"], stride), "totals": totals}
    allocation = run["allocation"] if run.get("allocation") is not None else allocation_by_step(run["history"])
    if allocation is not None:
        summary["allocation"] = allocation
    return summary


def paired_differences(methods: dict[str, Any], baseline: str = "uniform") -> dict[str, Any]:
    """Per method, final pass@k minus the baseline's on the same seed: mean and 95% CI over seeds.

    Seeds share the starting (SFT) policy and data across methods, so pairing removes the between-seed
    spread that dominates the unpaired intervals. Only the seeds both runs have are paired. Returns
    ``{method: {"k", "mean_diff", "ci95" (half-widths or None), "mde80" (minimum_detectable_effect at 80% power
    from the observed spread, or None), "num_seeds"}}``.
    """
    if baseline not in methods or "pass_at_k" not in methods[baseline]:
        return {}
    base_by_seed = final_pass_at_k_by_seed(methods[baseline])
    out = {}
    for method, entry in methods.items():
        if method == baseline or "pass_at_k" not in entry:
            continue
        pairs = [np.array(v) - np.array(base_by_seed[s])
                 for s, v in final_pass_at_k_by_seed(entry).items() if s in base_by_seed]
        if not pairs:
            continue
        pairs = np.array(pairs)
        mean, ci = mean_and_ci95(pairs)
        mde = None if len(pairs) < 2 else minimum_detectable_effect(pairs.std(axis=0, ddof=1), len(pairs))
        out[method] = {"k": entry["pass_at_k"]["k"], "mean_diff": mean.tolist(),
                       "ci95": None if ci is None else ci.tolist(), "mde80": None if mde is None else mde.tolist(),
                       "num_seeds": len(pairs)}
    return out


def final_pass_at_k_by_seed(entry: dict[str, Any]) -> dict[int, list[float]]:
    """seed -> final pass@k of a ``summarize_runs`` method entry (only the seeds whose runs evaluated)."""
    pk = entry["pass_at_k"]
    if len(pk["seeds"]) != len(pk["per_seed"]):
        raise ValueError(f"pass_at_k has {len(pk['per_seed'])} per-seed rows for seeds {pk['seeds']}")
    return dict(zip(pk["seeds"], pk["per_seed"]))


def runs_from_summary(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The runs a ``summarize_runs`` result was made from (its inverse): ``{method: [run]}`` with each run
    ``{"seed", "history", "evaluations", "rollouts_spent", "totals"}`` (the history as the summary kept it; its totals
    None in a summary written before they were kept, whose history holds every step)."""
    runs = {}
    for method, entry in results["methods"].items():
        curves = {c["seed"]: c["evaluations"] for c in entry["curves"]}
        history = {h["seed"]: h for h in entry["history"]}
        runs[method] = [{"seed": seed, "history": history[seed]["steps"], "evaluations": curves[seed],
                         "rollouts_spent": spent, "totals": history[seed].get("totals"),
                         **({"allocation": history[seed]["allocation"]} if "allocation" in history[seed] else {})}
                        for seed, spent in zip(entry["seeds"], entry["train_rollouts"])]
    return runs
