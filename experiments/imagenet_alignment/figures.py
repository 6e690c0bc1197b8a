"""Figures of the alignment experiment, drawn from the results dict (the content of results.json's "results").

Each function returns a ``matplotlib.figure.Figure`` (shown inline by Jupyter); ``make_all`` writes them all.

* ``cosine_vs_budget.png``: cosine similarity to the exact gradient against N_bar, one panel per checkpoint;
  lines are the expected gradient, markers with bars the sampled estimates (mean and 95% CI).
* ``allocation_vs_p.png``: rollouts per prompt against p, one row per analysed allocator (oracle p; SERA's row
  also shows its pilot allocation; Reinforce-Ada's and DARS's rows their mean counts over the draws), one column
  per checkpoint, uniform as lines.
* ``p_histogram.png``: the distribution of p on the analysis set at each checkpoint.
* ``grad_norms.png``: per-prompt gradient norms against p for CE, uniform MaxRL and SERA.
* ``training_curves.png``: validation pass@k over training steps (mean over seeds, seeds shaded).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"uniform": "tab:blue", "sera": "tab:red", "sera_pilot": "tab:orange", "sera_no_correction": "tab:gray",
          "sera_sum": "tab:pink", "dynamo": "tab:green", "knapsack": "tab:purple", "dapo": "tab:olive",
          "pods": "tab:cyan", "reinforce_ada": "tab:brown", "dars_et": "gold", "ce": "black"}
# The online / train-mask peers (config.ONLINE_METHODS) train on the rollouts they keep, with the plain mean over
# them; only DAPO has a closed-form expectation (a line), the others are drawn as sampled markers alone.
LABELS = {"uniform": "MaxRL uniform", "sera": "SERA (oracle p)", "sera_pilot": "SERA (pilot p)",
          "sera_no_correction": "SERA, no multiplicity correction", "sera_sum": "SERA sum objective (oracle p)",
          "dynamo": "DynaMO (oracle p, uncorrected)", "knapsack": "Knapsack RL (oracle p, uncorrected)",
          "dapo": "DAPO (uniform, mixed groups train)", "pods": "PODS (uniform, max-variance m train; sampled only)",
          "reinforce_ada": "Reinforce-Ada (rounds, balanced m train; sampled only)",
          "dars_et": "DARS-ET (pilot p, mixed groups train; sampled only)", "ce": "cross-entropy"}


def _ordered(methods) -> list:
    """Method names in the analysis's order (LABELS'), whatever order results.json keeps them in."""
    rank = {m: i for i, m in enumerate(LABELS)}
    return sorted(methods, key=lambda m: (rank.get(m, len(rank)), m))


# The colour maps of the allocation figure's rows (one shade per N_bar).
CMAPS = {"sera": "Reds", "sera_pilot": "Oranges", "sera_sum": "RdPu", "dynamo": "Greens", "knapsack": "Purples",
         "reinforce_ada": "YlOrBr", "dars_et": "YlGn"}


def _panels(n: int, width: float = 3.6, height: float = 3.2, rows: int = 1):
    """A figure with n panels in a row (``rows`` rows of them: then a rows x n array of axes), drawn off-screen:
    matplotlib's object API leaves the pyplot state (and a notebook's backend) alone, and is only imported when a
    figure is made."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n, height * rows))
    axes = fig.subplots(rows, n, squeeze=False)
    return fig, (axes[0] if rows == 1 else axes)


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


def cosine_vs_budget(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints))
    for ax, ck in zip(axes, checkpoints):
        budgets = np.asarray(ck["budgets"])
        for method in _ordered(ck["methods"]):
            stats = ck["methods"][method]
            color = COLORS.get(method)
            ax.plot(budgets, stats["cos_expected"], "-", color=color, label=LABELS.get(method, method))
            mean = np.asarray(stats["cos_sampled_mean"])
            ci = np.asarray(stats["cos_sampled_ci95"])
            ax.errorbar(budgets, mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], fmt="o", ms=3, color=color,
                        capsize=2, alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("average rollouts per prompt N_bar")
        ax.set_title(f"step {ck['step']} (median p {ck['p_quantiles']['0.5']:.2f})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"cosine to exact gradient ({checkpoints[0]['estimator']})")
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("lines: expected gradient (none without a closed form); markers: sampled estimates (mean, 95% CI)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def allocation_vs_p(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    # One row per allocator with its own counts (sera_pilot is drawn in SERA's row; uniform as lines in each).
    names = [m for m in _ordered(checkpoints[0]["allocation"][str(checkpoints[0]["budgets"][0])])
             if m not in ("uniform", "sera_pilot")]
    fig, axes = _panels(len(checkpoints), rows=max(len(names), 1))
    for column, ck in enumerate(checkpoints):
        p = np.asarray(ck["p"])
        for row, name in enumerate(names):
            ax = axes[row, column] if len(names) > 1 else axes[column]
            for n_bar, counts in ck["allocation"].items():
                shade = 0.3 + 0.7 * np.log2(int(n_bar)) / max(np.log2(max(ck["budgets"])), 1)
                ax.scatter(p, counts[name], s=6, color=_cmap(CMAPS.get(name, "Greys"))(shade),
                           label=f"N_bar={n_bar}")
                if name == "sera" and "sera_pilot" in counts:
                    ax.scatter(p, counts["sera_pilot"], s=4, marker="x", color=_cmap(CMAPS["sera_pilot"])(shade),
                               alpha=0.6)
                ax.axhline(int(n_bar), color=_cmap("Blues")(shade), lw=0.8)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("p (oracle)")
            ax.set_title(f"{LABELS.get(name, name)}, step {ck['step']}", fontsize=8)
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel("rollouts N_i")
                ax.legend(fontsize=6, loc="upper right")
    fig.suptitle("allocations on the oracle p (dots; x: SERA's mean over pilots; Reinforce-Ada, DARS: mean over draws) "
                 "and uniform (lines)", fontsize=9)
    fig.tight_layout()
    return fig


def p_histogram(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints), height=2.6)
    for ax, ck in zip(axes, checkpoints):
        edges = np.asarray(ck["p_histogram"]["edges"])
        ax.bar(edges[:-1], ck["p_histogram"]["counts"], width=np.diff(edges), align="edge", color="tab:purple")
        ax.set_title(f"step {ck['step']}: accuracy {ck['accuracy']:.2f}", fontsize=9)
        ax.set_xlabel("p = softmax[y]")
    axes[0].set_ylabel("analysis images")
    fig.tight_layout()
    return fig


def grad_norms(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints))
    for ax, ck in zip(axes, checkpoints):
        g = ck["grad_norms"]
        p = np.asarray(g["p"])
        series = {"ce": ("CE |grad log p|", COLORS["ce"], "o", 6, 1.0),
                  "uniform_expected": ("uniform, expected", COLORS["uniform"], "o", 6, 1.0),
                  "sera_expected": ("SERA, expected", COLORS["sera"], "o", 6, 1.0),
                  "uniform_sampled": ("uniform, one draw", COLORS["uniform"], "x", 5, 0.4),
                  "sera_sampled": ("SERA, one draw", COLORS["sera"], "x", 5, 0.4)}
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
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def training_curves(results: dict[str, Any]) -> Figure:
    train = results["training"]
    ks = [str(k) for k in train["pass_k"]]
    fig, axes = _panels(len(ks))
    for ax, k in zip(axes, ks):
        for method, run in train["methods"].items():
            steps = np.asarray(run["step"])
            curves = np.asarray(run["pass_at_k"][k])
            color = COLORS.get(method, None)
            label = f"{LABELS.get(method, method)} ({len(curves)} seeds)"
            ax.plot(steps, curves.mean(axis=0), color=color, label=label)
            ax.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.15)
        ax.set_xlabel("training step")
        ax.set_title(f"validation pass@{k}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{train['rollouts_per_step']} rollouts per step for the RL runs (N_bar = "
                 f"{train['rollouts_per_prompt']}, {train['estimator']})", fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"cosine_vs_budget": cosine_vs_budget, "allocation_vs_p": allocation_vs_p, "p_histogram": p_histogram,
           "grad_norms": grad_norms, "training_curves": training_curves}


def make_all(results: dict[str, Any], workdir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Writes every figure as ``<workdir>/<prefix><name>.png``; returns their paths."""
    paths = []
    for name, draw in FIGURES.items():
        if name == "training_curves" and not results["training"]["methods"]:
            continue
        path = pathlib.Path(workdir) / f"{prefix}{name}.png"
        draw(results).savefig(path, dpi=110)
        paths.append(path)
    return paths
