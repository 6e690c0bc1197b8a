"""The standard figures of a pass@k experiment, drawn from its summarised results (``stats.summarize_runs``).

matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import pathlib
from typing import Any, Optional

import numpy as np


def pyplot():
    """matplotlib.pyplot on the off-screen Agg backend, imported on first use (figures only cost when drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pass_at_k(results: dict[str, Any], path: pathlib.Path, title: str = "") -> None:
    """pass@k against k (log scale) per method, with 95% CIs over seeds."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for method, entry in results["methods"].items():
        if "pass_at_k" not in entry:
            continue
        pk = entry["pass_at_k"]
        k, mean = np.array(pk["k"]), np.array(pk["mean"])
        ax.plot(k, mean, marker="o", label=method)
        if pk["ci95"] is not None:
            ci = np.array(pk["ci95"])
            ax.fill_between(k, mean - ci, mean + ci, alpha=0.2)
    ax.set(xscale="log", xlabel="k", ylabel="pass@k (held-out)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _available_ks(results: dict[str, Any]) -> list[int]:
    for entry in results["methods"].values():
        for curve in entry["curves"]:
            if curve["evaluations"]:
                return list(curve["evaluations"][0]["k"])
    return []


def plot_neg_log_pass_at_k(results: dict[str, Any], path: pathlib.Path, ks: Optional[tuple[int, ...]] = None) -> None:
    """-log pass@k against training rollouts spent, per method (mean over seeds), for a few k
    (default: the smallest, a middle and the largest k evaluated)."""
    plt = pyplot()
    if ks is None:
        available = _available_ks(results)
        if not available:
            return
        ks = tuple(sorted({available[0], available[len(available) // 2], available[-1]}))
    fig, axes = plt.subplots(1, len(ks), figsize=(4 * len(ks), 3.4), squeeze=False)
    for ax, k in zip(axes[0], ks):
        for method, entry in results["methods"].items():
            curves = [c["evaluations"] for c in entry["curves"] if c["evaluations"]]
            if not curves or k not in curves[0][0]["k"]:
                continue
            j = curves[0][0]["k"].index(k)
            steps = min(len(c) for c in curves)
            x = np.array([curves[0][i]["rollouts_spent"] for i in range(steps)])
            y = np.array([[c[i]["pass_at_k"][j] for i in range(steps)] for c in curves]).mean(0)
            ax.plot(x, -np.log(np.clip(y, 1e-6, 1.0)), marker="o", label=method)
        ax.set(xlabel="training rollouts", ylabel=f"-log pass@{k}", title=f"k = {k}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pass_at_k_figures(results: dict[str, Any], out_dir: pathlib.Path, *, prefix: str = "", title: str = "",
                      ks: Optional[tuple[int, ...]] = None) -> list[pathlib.Path]:
    """The standard figures of a pass@k experiment, drawn from its (saved) results into ``out_dir``:
    ``{prefix}pass_at_k.png`` and ``{prefix}neg_log_pass_at_k.png``; returns the paths written."""
    out_dir = pathlib.Path(out_dir)
    pass_path, neg_log_path = out_dir / f"{prefix}pass_at_k.png", out_dir / f"{prefix}neg_log_pass_at_k.png"
    plot_pass_at_k(results, pass_path, title=title)
    plot_neg_log_pass_at_k(results, neg_log_path, ks=ks)
    return [path for path in (pass_path, neg_log_path) if path.exists()]
