"""The figures every experiment shares (sera_jax.report.figures), read back from the drawn matplotlib objects:
one colour per method across figures and experiments, pass@k bands inside [0, 1], seed counts in words, legends
outside the panels that list only what is drawn, and -log pass@k saying which way is better."""

from __future__ import annotations

import importlib.util
import pathlib

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from sera_jax.report import figures  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def _curve(seed: int, values: list[list[float]], ks=(1, 2, 4)) -> dict:
    """One seed's evaluations: pass@k at ``ks`` after 0, 100, 200, ... training rollouts."""
    return {"seed": seed, "evaluations": [{"step": i, "k": list(ks), "pass_at_k": v, "rollouts_spent": 100 * i}
                                          for i, v in enumerate(values)]}


def _method(final: list[list[float]], ks=(1, 2, 4), ci95=None) -> dict:
    """A ``stats.summarize_runs`` entry whose seeds end at ``final`` (one row a seed)."""
    seeds = list(range(len(final)))
    mean = np.mean(final, axis=0).tolist()
    return {"seeds": seeds, "train_rollouts": [200] * len(seeds),
            "curves": [_curve(s, [[0.1] * len(ks), row], ks) for s, row in zip(seeds, final)],
            "pass_at_k": {"k": list(ks), "mean": mean, "ci95": ci95, "per_seed": final, "seeds": seeds}}


def _results(*names: str) -> dict:
    rows = {"uniform": [[0.2, 0.4, 0.6], [0.3, 0.5, 0.7]], "sera": [[0.25, 0.45, 0.65], [0.35, 0.55, 0.75]],
            "grpo": [[0.1, 0.2, 0.3], [0.2, 0.3, 0.4]]}
    return {"methods": {n: _method(rows[n], ci95=[0.05, 0.05, 0.05]) for n in names}}


def _line_colours(fig) -> dict[str, str]:
    """Label (up to its seed count) -> colour of every labelled line of the figure."""
    return {line.get_label().split(" (")[0]: to_hex(line.get_color())
            for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith("_")}


def _legends(fig) -> list:
    return [lg for lg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if lg is not None]


def _legend_labels(fig) -> set[str]:
    return {t.get_text() for lg in _legends(fig) for t in lg.get_texts()}


def _texts(fig) -> str:
    parts = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.texts)]
    parts.append(fig.get_suptitle())
    return "\n".join(parts)


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ colours


def _experiment_method_names() -> set[str]:
    from experiments.imagenet_alignment import config as alignment_config
    from experiments.maze import config as maze_config
    from experiments.math_reasoning import config as math_config

    from sera_jax import core

    return (set(maze_config.METHODS) | set(math_config.METHODS) | set(core.ALLOCATORS)
            | set(alignment_config.ANALYSABLE) | set(alignment_config.DYNAMICS_METHODS)
            | {alignment_config.CROSS_ENTROPY, "ce", "sera_pilot", "sera_no_correction", "sera_pilot_no_correction"})


def test_every_method_of_every_experiment_has_its_own_colour():
    names = _experiment_method_names()
    canonical = {figures.METHOD_ALIASES.get(n, n) for n in names if not figures.learning_rate_arm(n)}
    assert canonical <= set(figures.METHOD_COLORS), canonical - set(figures.METHOD_COLORS)
    colours = [to_hex(figures.METHOD_COLORS[n]) for n in canonical]
    assert len(set(colours)) == len(colours), "two methods share a colour"
    for alias, name in figures.METHOD_ALIASES.items():
        assert figures.method_color(alias) == figures.method_color(name)
    # A learning-rate arm keeps its method's colour (told apart by its line style); a name no map knows gets a
    # colour from its name alone, the same in every figure and every process.
    assert figures.method_color("uniform_lr_3e-6") == figures.method_color("uniform")
    assert figures.method_color("a_new_rule") == figures.method_color("a_new_rule")
    assert figures.method_color("a_new_rule") not in {to_hex(c) for c in figures.METHOD_COLORS.values()}
    styles = figures.method_styles(["uniform_lr_3e-6", "uniform_lr_5e-6", "uniform", "sera_epochs"])
    assert len({s["linestyle"] for name, s in styles.items() if name.startswith("uniform")}) == 3
    assert styles["uniform"]["linestyle"] == "-"


def test_a_method_has_one_colour_in_every_figure_of_every_experiment(tmp_path, monkeypatch):
    from experiments.math_reasoning import experiment as math_experiment
    from experiments.maze import experiment as maze_experiment

    drawn = [figures.pass_at_k_figure(_results("sera", "uniform")),
             figures.pass_at_k_figure(_results("uniform", "grpo", "sera")),
             figures.neg_log_pass_at_k_figure(_results("grpo", "sera", "uniform"))]
    seen: dict[str, set[str]] = {}
    for fig in drawn:
        for label, colour in _line_colours(fig).items():
            seen.setdefault(label, set()).add(colour)
    assert seen == {m: {to_hex(figures.method_color(m))} for m in ("uniform", "sera", "grpo")}
    # The experiments draw through these functions (their saved figures' colours are the ones above).
    calls = []
    original = figures.pass_at_k_figures

    def spy(results, out_dir, **kwargs):
        calls.append(results)
        return original(results, out_dir, **kwargs)

    monkeypatch.setattr(figures, "pass_at_k_figures", spy)
    maze_experiment.make_figures(_results("sera", "uniform"), {"maze": {"size": 5}}, tmp_path, prefix="maze_")
    math_experiment.make_figures(_results("uniform", "sera"), {"eval": {"ks": [1, 2, 4]}, "variant": "tiny",
                                                                "data": {"source": "arithmetic"}},
                                 tmp_path, prefix="math_")
    assert len(calls) == 2


def test_report_allocation_figure_uses_the_method_colours():
    reproduce = _load_script("reproduce")
    p = np.linspace(0.01, 0.99, 16)
    curves = {m: (np.full(16, 8), 1 - (1 - p) ** 7) for m in ("uniform", "sera_all_active", "sera")}
    fig = reproduce.allocation_figure(p, curves, n_bar=8)
    assert _line_colours(fig) == {m: to_hex(figures.method_color(m)) for m in curves}
    _assert_legend_outside_the_panels(fig)


def test_alignment_figures_use_the_shared_colours():
    from experiments.imagenet_alignment import figures as alignment_figures

    for method, colour in getattr(alignment_figures, "COLORS", {}).items():  # none of its own, or the shared ones
        assert to_hex(colour) == to_hex(figures.method_color(method)), method


# ------------------------------------------------------------------------------------------------ bands


def test_pass_at_k_band_stays_inside_0_1():
    results = {"methods": {"uniform": _method([[0.9, 0.97, 1.0], [0.8, 0.95, 1.0]], ci95=[0.3, 0.11, 0.0]),
                           "sera": _method([[0.01, 0.1, 0.2], [0.03, 0.2, 0.3]], ci95=[0.2, 0.2, 0.2])}}
    fig = figures.pass_at_k_figure(results)
    bands = [c for ax in fig.axes for c in ax.collections]
    assert len(bands) == 2
    for band in bands:
        y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
        assert y.min() >= 0.0 and y.max() <= 1.0, (y.min(), y.max())
    ax = fig.axes[0]
    assert ax.get_ylim()[1] <= 1.05  # the axis does not run far past a probability's range


def test_fill_band_clips_to_its_bounds():
    fig = figures.new_figure()
    ax = fig.subplots()
    band = figures.fill_band(ax, [1, 2, 3], [-0.2, 0.5, 0.9], [0.1, 0.8, 1.3], color="k")
    y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
    assert y.min() == 0.0 and y.max() == 1.0
    band = figures.fill_band(ax, [1, 2], [-1.5, 0.0], [0.5, 1.2], color="k", bounds=(-1.0, 1.0))
    y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
    assert y.min() == -1.0 and y.max() == 1.0


# ------------------------------------------------------------------------------------------------ labels


def test_seed_counts_in_words():
    assert figures.seeds_label(1) == "1 seed"
    assert figures.seeds_label(0) == "0 seeds" and figures.seeds_label(16) == "16 seeds"
    one = {"methods": {"uniform": _method([[0.2, 0.4, 0.6]]), "sera": _method([[0.3, 0.5, 0.7]])}}
    assert _legend_labels(figures.pass_at_k_figure(one)) == {"uniform (1 seed)", "sera (1 seed)"}
    assert _legend_labels(figures.neg_log_pass_at_k_figure(one)) == {"uniform (1 seed)", "sera (1 seed)"}
    assert _legend_labels(figures.pass_at_k_figure(_results("uniform"))) == {"uniform (2 seeds)"}


def test_power_sentence_of_one_seed_says_seed():
    reproduce = _load_script("reproduce")
    sentence = reproduce._power_sentence({"sera": {"num_seeds": 1, "ci95": None, "k": [1]}})
    assert "1 paired seed there is no interval" in sentence and "(s)" not in sentence
    sentence = reproduce._power_sentence({"sera": {"num_seeds": 3, "ci95": None, "k": [1]}})
    assert "3 paired seeds there is no interval" in sentence


def test_neg_log_pass_at_k_says_lower_is_better():
    fig = figures.neg_log_pass_at_k_figure(_results("uniform", "sera"))
    assert "lower is better" in _texts(fig)


def test_neg_log_pass_at_k_draws_zero_pass_at_k_on_a_marked_line():
    # pass@k = 0 has no -log: it is drawn one unit above the panel's highest finite value, on a labelled line
    # (not at -log 1e-6 = 13.8, which squashed every other curve to the bottom of the panel).
    results = {"methods": {"uniform": _method([[0.0, 0.0, 0.0]]), "sera": _method([[0.5, 0.7, 0.9]])}}
    fig = figures.neg_log_pass_at_k_figure(results, ks=(1,))
    ax = fig.axes[0]
    top = max(np.max(line.get_ydata()) for line in ax.get_lines() if line.get_label().startswith("uniform"))
    assert top == pytest.approx(-np.log(0.1) + 1.0)
    assert "pass@1 = 0" in _texts(fig)
    never = {"seeds": [0], "curves": [_curve(0, [[0.0, 0.0, 0.0]] * 2)]}  # nothing finite: one tick, at infinity
    all_zero = figures.neg_log_pass_at_k_figure({"methods": {"uniform": never}}, ks=(1,))
    assert [t.get_text() for t in all_zero.axes[0].get_yticklabels()] == ["∞"]


# ------------------------------------------------------------------------------------------------ legends


def _assert_legend_outside_the_panels(fig):
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legends = _legends(fig)
    assert len(legends) == 1, f"{len(legends)} legends"
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), "the legend covers a panel"


def test_legend_lists_only_what_is_drawn_and_covers_no_panel():
    results = _results("uniform", "sera")
    results["methods"]["grpo"] = {k: v for k, v in _method([[0.1, 0.2, 0.3]]).items() if k != "pass_at_k"}
    results["methods"]["grpo"]["curves"] = [{"seed": 0, "evaluations": []}]  # no evaluations: nothing to draw
    for fig in (figures.pass_at_k_figure(results), figures.neg_log_pass_at_k_figure(results)):
        assert _legend_labels(fig) == {"uniform (2 seeds)", "sera (2 seeds)"}
        _assert_legend_outside_the_panels(fig)


def test_start_success_rates_draw_seeds_in_no_method_colour():
    bins = np.linspace(0, 1, 11).tolist()
    profiles = {str(s): {"bins": bins, "histogram": h} for s, h in enumerate(
        ([8, 0, 0, 0, 0, 0, 0, 0, 0, 0], [6, 2, 0, 0, 0, 0, 0, 0, 0, 0], [5, 1, 1, 1, 0, 0, 0, 0, 0, 0]))}
    fig = figures.success_rate_histogram(profiles)
    colours = {to_hex(p.get_facecolor()) for ax in fig.axes for p in ax.patches}
    assert colours and not colours & {to_hex(c) for c in figures.METHOD_COLORS.values()}
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, [19 / 3, 1, 1 / 3, 1 / 3, 0, 0, 0, 0, 0, 0])  # the mean over seeds
    assert "3 seeds" in _texts(fig)


def test_paired_differences_get_their_own_panel():
    from sera_jax.report import stats

    results = _results("sera", "uniform", "grpo")
    results["paired_vs_uniform"] = stats.paired_differences(results["methods"])
    fig = figures.pass_at_k_figure(results)
    assert len(fig.axes) == 2
    diff = fig.axes[1]
    np.testing.assert_allclose(
        next(line.get_ydata() for line in diff.get_lines() if to_hex(line.get_color()) == figures.method_color("sera")),
        [0.05, 0.05, 0.05])
    assert [t.get_text().split(" (")[0] for t in _legends(fig)[0].get_texts()] == ["uniform", "sera", "grpo"]
    _assert_legend_outside_the_panels(fig)
