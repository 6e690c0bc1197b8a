"""The standard figures of a pass@k experiment, drawn from its summarised results (``stats.summarize_runs``), and
what every figure of every experiment shares:

* one colour per method (``METHOD_COLORS``, ``method_color``; ``method_styles`` for the lines of one figure: a
  learning-rate arm ``NAME_lr_VALUE`` keeps NAME's colour and gets its own dashes);
* seed counts in words (``seeds_label``: "1 seed", "3 seeds");
* intervals clipped to the range of what they bound (``fill_band``: [0, 1] for a probability);
* one legend beside the panels, never over them, listing only the lines drawn (``legend_outside``).

Figures are ``matplotlib.figure.Figure`` objects (no pyplot state); matplotlib is imported only when one is drawn.
"""

from __future__ import annotations

import pathlib
import re
import zlib
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend

#: Every method of every experiment (the allocator registry's names and the experiments' ``METHODS``), one colour
#: each, distinct: uniform MaxRL blue, SERA and its variants reds, oranges and magentas, the published peers the
#: rest, cross-entropy black.
METHOD_COLORS: dict[str, str] = {
    "uniform": "#1f77b4",  # blue
    "grpo": "#17becf",  # cyan: uniform counts, GRPO's estimator
    "sera": "#d62728",  # red
    "sera_epochs": "#843c39",  # dark red: the released rule on epoch-frozen estimates
    "sera_no_correction": "#7f7f7f",  # grey
    "sera_pilot": "#ff7f0e",  # orange
    "sera_pilot_no_correction": "#ffbb78",  # light orange
    "sera_all_active": "#e377c2",  # pink
    "sera_all_active_epochs": "#7b4173",  # dark magenta
    "sera_sum": "#393b79",  # indigo
    "sera_tokens": "#6b6ecf",  # periwinkle
    "dynamo": "#2ca02c",  # green
    "dynamo_pilot": "#98df8a",  # light green
    "knapsack": "#9467bd",  # purple
    "knapsack_pilot": "#c5b0d5",  # light purple
    "dapo": "#bcbd22",  # olive
    "pods": "#637939",  # dark olive
    "reinforce_ada": "#8c564b",  # brown
    "dars_et": "#8c6d31",  # dark gold
    "dars_hw": "#e7ba52",  # gold
    "mopps": "#c49c94",  # light brown
    "greso": "#b5cf6b",  # light olive
    "cross_entropy": "#000000",  # black
}
#: Names two experiments give one method.
METHOD_ALIASES: dict[str, str] = {"ce": "cross_entropy", "dars": "dars_et"}
# Colours for a name the map does not know, chosen from the name alone (so the same in every figure).
_SPARE_COLORS = ("#5254a3", "#ad494a", "#a55194", "#bd9e39", "#8ca252", "#d6616b", "#ce6dbd", "#9c9ede")
# Line styles of a method's learning-rate arms, in order of learning rate (the method itself is solid).
_ARM_DASHES = ("--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_ARM = re.compile(r"(?P<base>.+)_lr_(?P<lr>[0-9.]+(?:e[-+]?[0-9]+)?)")


def learning_rate_arm(name: str) -> Optional[tuple[str, float]]:
    """``(method, learning rate)`` of an arm named ``METHOD_lr_VALUE`` (e.g. ``uniform_lr_3e-6``), else None."""
    match = _ARM.fullmatch(name)
    return None if match is None else (match["base"], float(match["lr"]))


def method_color(name: str) -> str:
    """The colour of method ``name`` in every figure: ``METHOD_COLORS`` (through ``METHOD_ALIASES``), its method's
    for a learning-rate arm, and for any other name one of a few spare colours picked by a hash of the name."""
    name = METHOD_ALIASES.get(name, name)
    if name in METHOD_COLORS:
        return METHOD_COLORS[name]
    arm = learning_rate_arm(name)
    if arm is not None:
        return method_color(arm[0])
    return _SPARE_COLORS[zlib.crc32(name.encode()) % len(_SPARE_COLORS)]


def method_styles(methods: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{method: {"color", "linestyle", "marker"}}`` for the lines of one figure: each method's colour
    (``method_color``), solid, with a hollow marker of its own (in the order given, so that lines drawn on top of
    one another stay visible); the learning-rate arms of one method in its colour, dashed in order of rate."""
    methods = list(methods)
    arms: dict[str, list[tuple[float, str]]] = {}
    for name in methods:
        arm = learning_rate_arm(name)
        if arm is not None:
            arms.setdefault(arm[0], []).append((arm[1], name))
    dashes = {name: _ARM_DASHES[i % len(_ARM_DASHES)] for group in arms.values()
              for i, (_, name) in enumerate(sorted(group))}
    return {name: {"color": method_color(name), "linestyle": dashes.get(name, "-"),
                   "marker": _MARKERS[i % len(_MARKERS)]} for i, name in enumerate(methods)}


def seeds_label(n: int) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def fill_band(ax: Axes, x, lower, upper, *, color, bounds: tuple[float, float] = (0.0, 1.0), alpha: float = 0.2):
    """Shades ``[lower, upper]`` clipped to ``bounds`` (a probability's [0, 1] by default): a t-interval of a
    mean near 0 or 1 runs past the range the mean lives in, and its shading should not."""
    lo, hi = bounds
    return ax.fill_between(x, np.clip(lower, lo, hi), np.clip(upper, lo, hi), color=color, alpha=alpha, lw=0)


def legend_outside(fig: Figure, **kwargs) -> Optional[Legend]:
    """One legend for the whole figure, to the right of its panels (so it covers none of them), listing each
    labelled line once; None when nothing labelled is drawn. The figure must use the constrained layout."""
    entries: dict[str, Any] = {}
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            entries.setdefault(label, handle)
    if not entries:
        return None
    return fig.legend(list(entries.values()), list(entries), loc="outside right center", frameon=False, **kwargs)


def new_figure(**kwargs) -> Figure:
    """A figure in the constrained layout (room for ``legend_outside``), drawn off-screen."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def pyplot():
    """matplotlib.pyplot on the off-screen Agg backend, imported on first use (figures only cost when drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log2_k_axis(ax: Axes, ks: Sequence[int]) -> None:
    """k on a log2 axis with the evaluated k as plain tick labels (1, 2, 4, ... rather than 2 x 10^0)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ks = sorted(set(int(k) for k in ks))
    if len(ks) > 12:  # about a dozen labels, the largest k among them
        ks = sorted(set(ks[:: -(-len(ks) // 12)]) | {ks[-1]})
    ax.xaxis.set_major_locator(FixedLocator(ks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def baseline_first(methods: Iterable[str], baseline: str = "uniform") -> list[str]:
    """``methods`` in their order, the baseline and its learning-rate arms moved to the front."""
    methods = list(methods)

    def is_baseline(name):
        return name == baseline or (learning_rate_arm(name) or ("",))[0] == baseline

    return [m for m in methods if is_baseline(m)] + [m for m in methods if not is_baseline(m)]


def _rollouts_axis(ax: Axes) -> None:
    """Training rollouts with a few compact tick labels (25k, 1.2M) that cannot run into one another."""
    from matplotlib.ticker import EngFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))


def pass_at_k_figure(results: dict[str, Any], title: str = "", baseline: str = "uniform") -> Figure:
    """Final held-out pass@k against k (log scale), one line per method: the mean over seeds, with its 95%
    t-interval shaded (clipped to [0, 1]) when a method has two seeds or more. With ``results["paired_vs_uniform"]``
    (``stats.paired_differences``), a second panel draws each method's pass@k minus the baseline's on the same
    seeds, with its 95% t-interval: the differences the first panel's scale hides."""
    paired = {m: d for m, d in (results.get("paired_vs_uniform") or {}).items() if d.get("mean_diff") is not None}
    fig = new_figure(figsize=(10.4 if paired else 6.2, 3.6))
    axes = fig.subplots(1, 2 if paired else 1, squeeze=False)[0]
    ax = axes[0]
    drawn = {m: results["methods"][m] for m in baseline_first(results["methods"], baseline)
             if "pass_at_k" in results["methods"][m]}
    styles = method_styles(drawn)
    shaded, ks = False, []
    for method, entry in drawn.items():
        pk = entry["pass_at_k"]
        k, mean = np.array(pk["k"]), np.array(pk["mean"])
        ks += list(pk["k"])
        style = styles[method]
        ax.plot(k, mean, label=f"{method} ({seeds_label(len(pk['per_seed']))})", markerfacecolor="none", **style)
        if pk["ci95"] is not None:
            ci = np.array(pk["ci95"])
            fill_band(ax, k, mean - ci, mean + ci, color=style["color"])
            shaded = True
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, -0.02), min(high, 1.02))
    single = all(len(e["pass_at_k"]["per_seed"]) == 1 for e in drawn.values())
    note = ("mean over seeds; shaded: 95% t-interval" if shaded else "one seed: no interval" if single
            else "mean over seeds")
    ax.set(xlabel="k", ylabel="pass@k (held-out)", title=f"{title}\n{note}" if title else note)
    if paired:
        diff_ax, diff_shaded = axes[1], False
        diff_ax.axhline(0.0, color=method_color(baseline), lw=1.0)
        for method in (m for m in drawn if m in paired):
            d, style = paired[method], styles[method]
            k, mean = np.array(d["k"]), np.array(d["mean_diff"])
            diff_ax.plot(k, mean, markerfacecolor="none", **style)
            if d.get("ci95") is not None:
                ci = np.array(d["ci95"])
                fill_band(diff_ax, k, mean - ci, mean + ci, color=style["color"], bounds=(-1.0, 1.0))
                diff_shaded = True
        note = "mean; shaded: 95% t-interval" if diff_shaded else "one seed: no interval"
        diff_ax.set(xlabel="k", ylabel=f"pass@k − {baseline}'s",
                    title=f"minus {baseline} on the same seeds (paired)\n{note}")
    for a in axes:
        if ks:
            _plain_log2_k_axis(a, ks)
        a.title.set_fontsize(9)
        a.grid(alpha=0.3)
    legend_outside(fig, fontsize=8)
    return fig


def plot_pass_at_k(results: dict[str, Any], path: pathlib.Path, title: str = "") -> None:
    """Writes ``pass_at_k_figure`` to ``path``."""
    pass_at_k_figure(results, title).savefig(path, dpi=110)


def _available_ks(results: dict[str, Any]) -> list[int]:
    for entry in results["methods"].values():
        for curve in entry["curves"]:
            if curve["evaluations"]:
                return list(curve["evaluations"][0]["k"])
    return []


def neg_log_pass_at_k_figure(results: dict[str, Any], ks: Optional[tuple[int, ...]] = None) -> Optional[Figure]:
    """-log pass@k (lower is better) against training rollouts spent, one line per method (the mean pass@k over
    seeds), one panel per k (default: the smallest, a middle and the largest k evaluated); None without
    evaluations. pass@k = 0, whose -log is infinite, is drawn on a dotted line one unit above the panel's highest
    finite value."""
    if ks is None:
        available = _available_ks(results)
        if not available:
            return None
        ks = tuple(sorted({available[0], available[len(available) // 2], available[-1]}))
    fig = new_figure(figsize=(3.6 * len(ks) + 1.6, 3.4))
    axes = fig.subplots(1, len(ks), squeeze=False)[0]
    styles = method_styles(baseline_first(results["methods"]))
    for ax, k in zip(axes, ks):
        lines = {}
        for method in styles:
            entry = results["methods"][method]
            curves = [c["evaluations"] for c in entry["curves"] if c["evaluations"]]
            if not curves or k not in curves[0][0]["k"]:
                continue
            j = curves[0][0]["k"].index(k)
            steps = min(len(c) for c in curves)
            x = np.array([curves[0][i]["rollouts_spent"] for i in range(steps)])
            y = np.array([[c[i]["pass_at_k"][j] for i in range(steps)] for c in curves]).mean(0)
            lines[method] = (x, y, len(curves))
        positive = [-np.log(y[y > 0]) for _, y, _ in lines.values() if np.any(y > 0)]
        zero_level = (max(float(v.max()) for v in positive) if positive else 0.0) + 1.0
        for method, (x, y, seeds) in lines.items():
            neg_log = np.where(y > 0, -np.log(np.maximum(y, 1e-300)), zero_level)
            ax.plot(x, neg_log, label=f"{method} ({seeds_label(seeds)})", markerfacecolor="none", **styles[method])
        if any(np.any(y <= 0) for _, y, _ in lines.values()):
            ax.axhline(zero_level, color="0.5", lw=0.8, ls=":")
            ax.annotate(f"pass@{k} = 0 (-log: ∞)", (0.5, zero_level), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", fontsize=7, color="0.4", ha="center")
            if not positive:  # nothing finite to scale the axis by
                ax.set_yticks([zero_level], ["∞"])
        ax.set(xlabel="training rollouts", ylabel=f"-log pass@{k} (lower is better)", title=f"k = {k}")
        _rollouts_axis(ax)
        ax.grid(alpha=0.3)
    fig.suptitle("held-out -log pass@k during training, mean pass@k over seeds (lower is better)", fontsize=10)
    legend_outside(fig, fontsize=8)
    return fig


def plot_neg_log_pass_at_k(results: dict[str, Any], path: pathlib.Path, ks: Optional[tuple[int, ...]] = None) -> None:
    """Writes ``neg_log_pass_at_k_figure`` to ``path`` (nothing without evaluations)."""
    fig = neg_log_pass_at_k_figure(results, ks)
    if fig is not None:
        fig.savefig(path, dpi=110)


def success_rate_histogram(profiles: dict[str, dict[str, Any]], what: str = "training prompts") -> Figure:
    """The start policies' per-prompt success rates: per bin of rate (``profiles[seed]["bins"]``), the mean over
    seeds of the number of prompts in it (``["histogram"]``) as a bar, the seeds' range as a whisker. Grey: seeds
    are not methods, and the methods' colours mean methods in every figure."""
    fig = new_figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    counts = np.array([p["histogram"] for p in profiles.values()], float)
    edges = np.asarray(next(iter(profiles.values()))["bins"], float)
    mean = counts.mean(axis=0)
    ax.bar(edges[:-1], mean, width=np.diff(edges), align="edge", color="#a0a0a0", edgecolor="white")
    low, high = counts.min(0), counts.max(0)
    spread = high > low  # whiskers only where the seeds differ
    if spread.any():
        centres = (edges[:-1] + edges[1:]) / 2
        ax.errorbar(centres[spread], mean[spread], yerr=[(mean - low)[spread], (high - mean)[spread]], fmt="none",
                    ecolor="#404040", capsize=2, lw=0.8)
    key = next(iter(profiles))  # a seed, or "shared" for one start policy that every seed starts from
    title = (f"mean over {seeds_label(len(counts))}; whiskers: lowest to highest seed" if len(counts) > 1
             else f"the start policy of seed {key}" if str(key).isdigit() else f"the start policy ({key})")
    ax.set(xlabel="per-prompt success rate at the start of RL", ylabel=what, xlim=(edges[0], edges[-1]),
           title=title)
    ax.title.set_fontsize(9)
    return fig


def pass_at_k_figures(results: dict[str, Any], out_dir: pathlib.Path, *, prefix: str = "", title: str = "",
                      ks: Optional[tuple[int, ...]] = None) -> list[pathlib.Path]:
    """The standard figures of a pass@k experiment, drawn from its (saved) results into ``out_dir``:
    ``{prefix}pass_at_k.png`` and ``{prefix}neg_log_pass_at_k.png``; returns the paths written."""
    out_dir = pathlib.Path(out_dir)
    pass_path, neg_log_path = out_dir / f"{prefix}pass_at_k.png", out_dir / f"{prefix}neg_log_pass_at_k.png"
    plot_pass_at_k(results, pass_path, title=title)
    plot_neg_log_pass_at_k(results, neg_log_path, ks=ks)
    return [path for path in (pass_path, neg_log_path) if path.exists()]
