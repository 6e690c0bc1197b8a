"""Figures of the alignment experiment, drawn from the results dict (the content of results.json's "results").

Each function returns a ``matplotlib.figure.Figure`` (shown inline by Jupyter); ``make_all`` writes them all.

* ``cosine_vs_budget.png``: cosine similarity to the exact gradient against N_bar, one panel per checkpoint;
  lines are the expected gradient, markers with bars the sampled estimates (mean and 95% CI).
* ``allocation_vs_p.png``: rollouts per prompt against p for SERA (oracle and pilot), uniform as a line.
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
          "ce": "black"}
LABELS = {"uniform": "MaxRL uniform", "sera": "SERA (oracle p)", "sera_pilot": "SERA (pilot p)",
          "sera_no_correction": "SERA, no multiplicity correction", "ce": "cross-entropy"}


def _panels(n: int, width: float = 3.6, height: float = 3.2):
    """A figure with n panels in a row, drawn off-screen: matplotlib's object API leaves the pyplot state
    (and a notebook's backend) alone, and is only imported when a figure is made."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n, height))
    axes = fig.subplots(1, n, squeeze=False)
    return fig, axes[0]


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


def cosine_vs_budget(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints))
    for ax, ck in zip(axes, checkpoints):
        budgets = np.asarray(ck["budgets"])
        for method, stats in ck["methods"].items():
            color = COLORS[method]
            ax.plot(budgets, stats["cos_expected"], "-", color=color, label=LABELS[method])
            mean = np.asarray(stats["cos_sampled_mean"])
            ci = np.asarray(stats["cos_sampled_ci95"])
            ax.errorbar(budgets, mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], fmt="o", ms=3, color=color,
                        capsize=2, alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("average rollouts per prompt N_bar")
        ax.set_title(f"step {ck['step']} (median p {ck['p_quantiles']['0.5']:.2f})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"cosine to exact gradient ({checkpoints[0]['estimator']})")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("lines: expected gradient; markers: sampled estimates (mean, 95% CI)", fontsize=9)
    fig.tight_layout()
    return fig


def allocation_vs_p(results: dict[str, Any]) -> Figure:
    checkpoints = results["checkpoints"]
    fig, axes = _panels(len(checkpoints))
    for ax, ck in zip(axes, checkpoints):
        p = np.asarray(ck["p"])
        for n_bar, counts in ck["allocation"].items():
            if "sera" not in counts:
                continue
            shade = 0.3 + 0.7 * np.log2(int(n_bar)) / max(np.log2(max(ck["budgets"])), 1)
            ax.scatter(p, counts["sera"], s=6, color=_cmap("Reds")(shade), label=f"SERA N_bar={n_bar}")
            if "sera_pilot" in counts:
                ax.scatter(p, counts["sera_pilot"], s=4, marker="x", color=_cmap("Oranges")(shade), alpha=0.6)
            ax.axhline(int(n_bar), color=_cmap("Blues")(shade), lw=0.8)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("p (oracle)")
        ax.set_title(f"step {ck['step']}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("rollouts N_i")
    fig.suptitle("SERA's allocation (dots: oracle p; x: mean over pilots) and uniform (lines)", fontsize=9)
    axes[0].legend(fontsize=6, loc="upper right")
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
