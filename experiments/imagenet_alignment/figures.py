"""Figures of the alignment experiment, drawn from the results dict (the content of results.json's "results").

Each function returns a ``matplotlib.figure.Figure`` (shown inline by Jupyter); ``make_all`` writes them all. They
draw as every figure of the house does (``sera_jax.report.figures``): each method in its own colour
(``method_color``), seed counts in words, bands clipped to the range of what they bound, one legend beside the
panels.

* ``cosine_vs_budget.png``: cosine similarity to the exact gradient against N_bar, one panel per checkpoint;
  lines are the expected gradient, markers with bars the sampled estimates (mean and 95% CI).
* ``allocation_vs_p.png``: rollouts per prompt against p, one row per analysed allocator (oracle p; SERA's row
  also shows its pilot allocation; Reinforce-Ada's and DARS's rows their mean counts over the draws), one column
  per checkpoint, uniform as lines; a prompt without rollouts (the released SERA's) on a dotted line below 1.
* ``p_histogram.png``: the distribution of p on the analysis set at each checkpoint.
* ``grad_norms.png``: per-prompt gradient norms against p for CE, uniform MaxRL and SERA.
* ``effective_weights.png``: each method's weight on a prompt relative to the exact likelihood objective's (1),
  averaged over bins of p (results' ``weight_profile``), against p, at the checkpoint where p is most spread
  (``spread_checkpoint``) and N_bar = 4, 16, 64; ``effective_weights_caption`` says what it shows, in words.
* ``training_curves.png``: validation pass@k over training steps (mean over seeds, seeds shaded).

Training mode (``comparison.py``) draws ``comparison_curves.png`` (``make_comparison``): validation top-1 and
pass@k at the declared k against the step, and the gradient cosine with the exact cross-entropy gradient against
the update, each method's mean over seeds with its 95% interval shaded.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

from sera_jax.report.figures import fill_band, legend_outside, method_color, new_figure, seeds_label

if TYPE_CHECKING:
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

# The online / train-mask peers (config.ONLINE_METHODS) train on the rollouts they keep, with the plain mean over
# them; only DAPO has a closed-form expectation (a line), the others are drawn as sampled markers alone.
LABELS = {"uniform": "MaxRL uniform", "sera": "SERA (oracle p)", "sera_pilot": "SERA (pilot p)",
          "sera_no_correction": "SERA, no multiplicity correction",
          "sera_pilot_no_correction": "SERA (pilot p), no multiplicity correction; sampled only",
          "sera_sum": "SERA sum objective (oracle p)",
          "dynamo": "DynaMO (oracle p, uncorrected)", "knapsack": "Knapsack RL (oracle p, uncorrected)",
          "dapo": "DAPO (uniform, mixed groups train)", "pods": "PODS (uniform, max-variance m train; sampled only)",
          "reinforce_ada": "Reinforce-Ada (rounds, balanced m train; sampled only)",
          "dars_et": "DARS-ET (pilot p, mixed groups train; sampled only)", "ce": "cross-entropy",
          "sera_all_active": "SERA all-active (oracle p)", "cross_entropy": "cross-entropy"}


def _ordered(methods) -> list:
    """Method names in the analysis's order (LABELS'), whatever order results.json keeps them in."""
    rank = {m: i for i, m in enumerate(LABELS)}
    return sorted(methods, key=lambda m: (rank.get(m, len(rank)), m))


def _panels(n: int, width: float = 3.6, height: float = 3.2, rows: int = 1, legend: float = 0.0):
    """A figure with n panels in a row (``rows`` rows of them: then a rows x n array of axes), in the constrained
    layout (``new_figure``: off-screen, room for ``legend_outside``), ``legend`` inches wider for the legend.
    matplotlib's object API leaves the pyplot state (and a notebook's backend) alone, and is only imported when a
    figure is made."""
    fig = new_figure(figsize=(width * n + legend, height * rows))
    axes = fig.subplots(rows, n, squeeze=False)
    return fig, (axes[0] if rows == 1 else axes)


def shades(method: str) -> Colormap:
    """White to ``method``'s colour (``method_color``): the allocation figure's shade of it per N_bar."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list(f"shades_{method}", ["white", method_color(method)])


def cosine_vs_budget(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints), legend=3.2)
    for ax, ck in zip(axes, checkpoints):
        budgets = np.asarray(ck["budgets"])
        for method in _ordered(ck["methods"]):
            stats = ck["methods"][method]
            color = method_color(method)
            ax.plot(budgets, stats["cos_expected"], "-", color=color, label=LABELS.get(method, method))
            mean = np.asarray(stats["cos_sampled_mean"])
            low, high = np.clip(np.asarray(stats["cos_sampled_ci95"]), -1.0, 1.0).T  # a cosine's range
            ax.errorbar(budgets, mean, yerr=[np.maximum(mean - low, 0), np.maximum(high - mean, 0)], fmt="o", ms=3,
                        color=color, capsize=2, alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("average rollouts per prompt N_bar")
        ax.set_title(f"step {ck['step']} (median p {ck['p_quantiles']['0.5']:.2f})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"cosine to exact gradient ({checkpoints[0]['estimator']})")
    legend_outside(fig, fontsize=7)
    fig.suptitle("lines: expected gradient (none without a closed form); markers: sampled estimates (mean, 95% CI)",
                 fontsize=9)
    return fig


# Where the allocation figure draws a prompt without rollouts (its log axis has no 0): a grey line below 1.
ZERO_ROLLOUTS = 0.5


def allocation_vs_p(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    # One row per allocator with its own counts (sera_pilot is drawn in SERA's row; uniform as lines in each).
    names = [m for m in _ordered(checkpoints[0]["allocation"][str(checkpoints[0]["budgets"][0])])
             if m not in ("uniform", "sera_pilot")]
    fig, axes = _panels(len(checkpoints), rows=max(len(names), 1), legend=1.6)
    for column, ck in enumerate(checkpoints):
        p = np.asarray(ck["p"])
        for row, name in enumerate(names):
            ax = axes[row, column] if len(names) > 1 else axes[column]
            skipped = False
            for n_bar, counts in sorted(ck["allocation"].items(), key=lambda item: int(item[0])):  # JSON keys
                shade = 0.3 + 0.7 * np.log2(int(n_bar)) / max(np.log2(max(ck["budgets"])), 1)
                n_i = np.asarray(counts[name], np.float64)
                skipped |= bool(np.any(n_i <= 0))
                ax.scatter(p, np.where(n_i > 0, n_i, ZERO_ROLLOUTS), s=6, color=shades(name)(shade))
                if name == "sera" and "sera_pilot" in counts:
                    ax.scatter(p, counts["sera_pilot"], s=4, marker="x", color=shades("sera_pilot")(shade),
                               alpha=0.6)
                ax.axhline(int(n_bar), color=shades("uniform")(shade), lw=0.8, label=f"uniform, N_bar={n_bar}")
            if skipped:  # the released SERA's skipped prompts, on a line of their own
                ax.axhline(ZERO_ROLLOUTS, color="0.6", lw=0.5, ls=":")
            ax.set_yscale("log", base=2)
            ax.set_xlabel("p (oracle)")
            ax.set_title(f"{LABELS.get(name, name)}, step {ck['step']}" + (" (dotted: 0 rollouts)" if skipped else ""),
                         fontsize=8)
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel("rollouts N_i")
    legend_outside(fig, fontsize=7)
    fig.suptitle("allocations on the oracle p (dots; x: SERA's mean over pilots; Reinforce-Ada, DARS: mean over draws)\n"
                 "and uniform (lines); darker: larger N_bar", fontsize=9)
    return fig


def p_histogram(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints), height=2.6)
    for ax, ck in zip(axes, checkpoints):
        edges = np.asarray(ck["p_histogram"]["edges"])
        # Grey, edged in white: images are not methods, and the methods' colours mean methods in every figure.
        ax.bar(edges[:-1], ck["p_histogram"]["counts"], width=np.diff(edges), align="edge", color="#a0a0a0",
               edgecolor="white")
        ax.set_title(f"step {ck['step']}: accuracy {ck['accuracy']:.2f}", fontsize=9)
        ax.set_xlabel("p = softmax[y]")
    axes[0].set_ylabel("analysis images")
    return fig


def grad_norms(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints), legend=1.6)
    for ax, ck in zip(axes, checkpoints):
        g = ck["grad_norms"]
        p = np.asarray(g["p"])
        ce, uniform, sera = method_color("ce"), method_color("uniform"), method_color("sera")
        series = {"ce": ("CE |grad log p|", ce, "o", 6, 1.0),
                  "uniform_expected": ("uniform, expected", uniform, "o", 6, 1.0),
                  "sera_expected": ("SERA, expected", sera, "o", 6, 1.0),
                  "uniform_sampled": ("uniform, one draw", uniform, "x", 5, 0.4),
                  "sera_sampled": ("SERA, one draw", sera, "x", 5, 0.4)}
        values = {k: np.asarray(g[k]) for k in series}
        positive = np.concatenate([v[v > 0] for v in values.values()])
        floor = positive.min() / 3 if positive.size else 1e-6  # where zero norms (no success) are drawn
        for k, (label, color, marker, size, alpha) in series.items():
            ax.scatter(p, np.maximum(values[k], floor), s=size, marker=marker, color=color, alpha=alpha, label=label)
        ax.axhline(floor, color="0.7", lw=0.5)
        ax.set_yscale("log")
        ax.set_xlim(0, 1)
        ax.set_xlabel("p")
        ax.set_title(f"step {ck['step']}, N_bar={g['budget']} (bottom line: zero)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("per-prompt gradient norm")
    legend_outside(fig, fontsize=7)
    return fig


def training_curves(results: dict[str, Any]) -> Figure:
    train = results["training"]
    ks = [str(k) for k in train["pass_k"]]
    fig, axes = _panels(len(ks), legend=1.8)
    for ax, k in zip(axes, ks):
        for method, run in train["methods"].items():
            steps = np.asarray(run["step"])
            curves = np.asarray(run["pass_at_k"][k])
            color = method_color(method)
            label = f"{LABELS.get(method, method)} ({seeds_label(len(curves))})"
            ax.plot(steps, curves.mean(axis=0), color=color, label=label)
            fill_band(ax, steps, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.15)
        ax.set_xlabel("training step")
        ax.set_title(f"validation pass@{k}", fontsize=9)
        ax.grid(alpha=0.3)
    legend_outside(fig, fontsize=7)
    fig.suptitle(f"{train['rollouts_per_step']} rollouts per step for the RL runs (N_bar = "
                 f"{train['rollouts_per_prompt']}, {train['estimator']}); shaded: the seeds' range", fontsize=9)
    return fig


# The effective-weight figure: SERA and its variants in one row, the published peers in the other, each with
# uniform MaxRL; at these N_bar where analysed (else at every analysed one).
WEIGHT_GROUPS = (("uniform", "sera", "sera_pilot", "sera_no_correction", "sera_pilot_no_correction", "sera_sum"),
                 ("uniform", "dynamo", "knapsack", "dapo", "pods", "reinforce_ada", "dars_et"))
WEIGHT_BUDGETS = (4, 16, 64)


def spread_checkpoint(results: dict[str, Any]) -> dict[str, Any]:
    """The analysed checkpoint whose p is most spread (widest interquartile range; the cpu config's step 40)."""
    def iqr(ck):
        return ck["p_quantiles"]["0.75"] - ck["p_quantiles"]["0.25"]

    return max(results["checkpoints"], key=iqr)


def weight_profiles(ck: dict[str, Any], estimator: str | None = None) -> dict[str, Any]:
    """The checkpoint's weight profiles (``weight_profiles.profile_bins`` and, per N_bar and method, the
    ``expected`` and ``sampled`` profiles) for ``estimator`` (default: the primary one)."""
    return ck["estimators"][estimator or ck["estimator"]]["weight_profile"]


def profile_curve(entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(mean, low, high, sampled) per bin of one method's profiles: the closed form's mean with its 10-90% range
    over the bin's prompts where there is one, else the sampled mean with its 95% interval over the draws."""
    from sera_jax.report.stats import ci95_from_se

    if "expected" in entry:
        e = entry["expected"]
        return np.asarray(e["mean"], float), np.asarray(e["q10"], float), np.asarray(e["q90"], float), False
    s = entry["sampled"]
    mean = np.asarray(s["mean"], float)
    half = ci95_from_se(s["se"], s["draws"])
    return mean, mean - half, mean + half, True


def _bin_names(edges) -> list[str]:
    return [f"[{lo:g}, {hi:g}{']' if k == len(edges) - 2 else ')'}" for k, (lo, hi) in enumerate(zip(edges, edges[1:]))]


def _weight_budgets(profiles: dict[str, Any]) -> list[str]:
    present = [str(n) for n in WEIGHT_BUDGETS if str(n) in profiles["budgets"]]
    return present or list(profiles["budgets"])


def effective_weights(results: dict[str, Any], step: int | None = None) -> Figure:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ck = (spread_checkpoint(results) if step is None
          else next(c for c in results["checkpoints"] if c["step"] == step))
    profiles = weight_profiles(ck)
    budgets = _weight_budgets(profiles)
    count = np.asarray(profiles["count"])
    filled = count > 0
    x = np.asarray(profiles["p_mean"], float)[filled]
    fig, axes = _panels(len(budgets), width=4.2, height=3.4, rows=len(WEIGHT_GROUPS), legend=3.4)
    axes = np.asarray(axes).reshape(len(WEIGHT_GROUPS), len(budgets))
    floor = 1e-3  # where a non-positive weight is drawn (log scale)
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.2, 0.5, 1, 2 rather than 2 x 10^-1
    for row, group in enumerate(WEIGHT_GROUPS):
        for column, n_bar in enumerate(budgets):
            ax = axes[row, column]
            by_method = profiles["budgets"][n_bar]
            for method in (m for m in group if m in by_method):
                mean, lo, hi, sampled = (v[filled] if isinstance(v, np.ndarray) else v
                                         for v in profile_curve(by_method[method]))
                color = method_color(method)
                label = LABELS.get(method, method)
                label += " [sampled]" if sampled and "sampled" not in label else ""
                if sampled:
                    ax.errorbar(x, np.maximum(mean, floor), yerr=[np.maximum(mean, floor) - np.maximum(lo, floor),
                                                                   np.maximum(hi, floor) - np.maximum(mean, floor)],
                                fmt="s--", ms=3, lw=1, capsize=2, color=color, label=label)
                else:  # a bin whose prompts all get no rollouts (the released SERA) weighs 0: at the floor
                    ax.plot(x, np.maximum(mean, floor), "o-", ms=3, lw=1.3, color=color, label=label)
                    fill_band(ax, x, lo, hi, color=color, bounds=(floor, np.inf), alpha=0.12)
                    if "sampled" in by_method[method]:  # the draws' projection: the closed form's check
                        ax.plot(x, np.maximum(np.asarray(by_method[method]["sampled"]["mean"], float)[filled], floor),
                                "x", ms=4, color=color, alpha=0.7)
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlim(0, 1)
            ax.set_xlabel("p (mean of the bin)")
            ax.set_title(f"step {ck['step']}, N_bar = {n_bar}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            if column == 0:
                ax.set_ylabel("weight / exact objective's")
    legend_outside(fig, fontsize=7)
    fig.suptitle("effective weight per prompt relative to the exact likelihood objective (dotted: 1), mean over each "
                 f"bin of p (prompts per bin: {', '.join(map(str, count[filled]))})\nlines: closed form, band: 10-90% "
                 "of the bin's prompts, x: sampled projection; dashed: sampled only (95% CI over draws)", fontsize=8)
    return fig


def effective_weights_caption(results: dict[str, Any]) -> str:
    """What the effective-weight figure shows, in words, from the same numbers: at its checkpoint and smallest
    N_bar, each method's weight on the hardest and on the easiest bin of prompts, its extreme where that lies in
    between, and the bins it over-weights (weight above 1)."""
    ck = spread_checkpoint(results)
    profiles = weight_profiles(ck)
    n_bar = _weight_budgets(profiles)[0]
    names = _bin_names(profiles["edges"])
    filled = [k for k, c in enumerate(profiles["count"]) if c > 0]
    parts = []
    for method in _ordered(profiles["budgets"][n_bar]):
        mean, _, _, sampled = profile_curve(profiles["budgets"][n_bar][method])
        text = f"`{method}`{' (sampled)' if sampled else ''} {mean[filled[0]]:.2f} -> {mean[filled[-1]]:.2f}"
        inner = filled[1:-1]
        if inner:
            peak, dip = max(inner, key=lambda k: mean[k]), min(inner, key=lambda k: mean[k])
            if mean[peak] > max(mean[filled[0]], mean[filled[-1]]):
                text += f", peak {mean[peak]:.2f} at {names[peak]}"
            if mean[dip] < min(mean[filled[0]], mean[filled[-1]]):
                text += f", dip {mean[dip]:.2f} at {names[dip]}"
        over = [names[k] for k in filled if mean[k] > 1]
        text += f", above 1 at p in {', '.join(over)}" if over else ", below 1 everywhere"
        parts.append(text)
    return (f"Effective weight of each prompt relative to the exact likelihood objective (1: exact), the mean over "
            f"the prompts of each bin of p, at step {ck['step']} (the checkpoint where p is most spread). Above 1 a "
            f"method over-weights those prompts, below 1 it under-weights them; a factor common to every prompt only "
            f"rescales the step, so the update's direction is set by the profile's shape. At N̄ = {n_bar}, from the "
            f"hardest bin ({names[filled[0]]}) to the easiest ({names[filled[-1]]}): " + "; ".join(parts) + ".")


FIGURES = {"cosine_vs_budget": cosine_vs_budget, "allocation_vs_p": allocation_vs_p, "p_histogram": p_histogram,
           "grad_norms": grad_norms, "training_curves": training_curves, "effective_weights": effective_weights}


def comparison_curves(results: dict[str, Any]) -> Figure:
    """Training mode: validation top-1 and pass@k (the declared k) against the step, the gradient cosine against
    the update; each method's mean over seeds, its 95% t-interval shaded."""
    from sera_jax.report.stats import mean_and_ci95

    k = results["endpoints"]["k"]
    fig, axes = _panels(3, legend=2.0)

    def draw(ax, x, per_seed, method, bounds):
        values = np.asarray(per_seed, np.float64)
        mean, half = mean_and_ci95(values)
        color = method_color(method)
        ax.plot(x, mean, color=color, label=f"{LABELS.get(method, method)} ({seeds_label(len(values))})")
        if half is not None:
            fill_band(ax, x, mean - half, mean + half, color=color, bounds=bounds)

    for method, entry in results["methods"].items():
        curves = [c["evaluations"] for c in entry["curves"]]
        steps = [e["step"] for e in curves[0]]
        curves = [c for c in curves if [e["step"] for e in c] == steps]
        draw(axes[0], steps, [[e["accuracy"] for e in c] for c in curves], method, (0.0, 1.0))
        draw(axes[1], steps, [[e["pass_at_k"][e["k"].index(k)] for e in c] for c in curves], method, (0.0, 1.0))
    for method, entry in results["gradient_cosine"]["methods"].items():
        draw(axes[2], entry["updates"], entry["per_seed"], method, (-1.0, 1.0))
    for ax, title in zip(axes, ("validation top-1", f"validation pass@{k} (analytic)",
                                "cosine with the exact CE gradient")):
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    legend_outside(fig, fontsize=7)
    task = results["task"]
    fig.suptitle(f"{task['dataset']}: {task['images_per_step']} images x {task['rollouts_per_image']} rollouts a "
                 f"step (n_max {task['n_max']}), true p", fontsize=9)
    return fig


def make_comparison(results: dict[str, Any], workdir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Writes the training-mode figure as ``<workdir>/<prefix>comparison_curves.png``; returns its path."""
    path = pathlib.Path(workdir) / f"{prefix}comparison_curves.png"
    comparison_curves(results).savefig(path, dpi=110)
    return [path]


def make_all(results: dict[str, Any], workdir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Writes every figure as ``<workdir>/<prefix><name>.png``; returns their paths."""
    paths = []
    for name, draw in FIGURES.items():
        if name == "training_curves" and not results["training"]["methods"]:
            continue
        if name == "effective_weights" and not all("weight_profile" in e for ck in results["checkpoints"]
                                                   for e in ck["estimators"].values()):
            continue  # a results.json written before the weight profiles
        path = pathlib.Path(workdir) / f"{prefix}{name}.png"
        draw(results).savefig(path, dpi=110)
        paths.append(path)
    return paths
