"""Reproduces SERA's experiments at one scale and writes ``OUT/REPORT.md`` with the figures beside it.

    python scripts/reproduce.py --scale=demo --out=results        # the README's main command
    python scripts/reproduce.py --scale=cpu --out=results_cpu     # the longer CPU runs
    python scripts/reproduce.py --scale=gpu --out=/data/sera \
        --extra=math_reasoning:--config.data.dir=/data/gsm8k ...  # paper scale (see scripts/reproduce.sh)
    python scripts/reproduce.py --report-only --out=results       # redraw figures + REPORT from results.json

Scales and the hardware they expect (``scripts/reproduce.sh SCALE OUT`` installs what each needs):

  demo  any 2-core CPU, 4 GiB: about 4 minutes once installed (216 s measured on a fresh clone, 2 cores); one to
        three seeds, small models, figures and tables that show the effects qualitatively.
  cpu   a 2-core CPU, hours: each experiment's ``cpu`` variant, 16 paired seeds with endpoints declared in its
        config (maze: the comparison at N_bar 16, ~1 h a method with two runs at a time, 9 methods;
        math: the first comparison's 4 methods, ~95 min; alignment 4-8 min). The other declared variants (maze
        ``cpu_n32`` / ``cpu_n64``, math ``cpu_n64``) run as ``python -m experiments.NAME.main
        --config=experiments/NAME/config.py:VARIANT --workdir=DIR`` (docs/results.md).
  gpu   one GPU machine (H100/H200-class, 80+ GiB): the paper's models. Needs local copies of ImageNet
  full  (TFDS manual dir), GSM8K/GSM8K-Platinum or POLARIS/MATH-500 and the pretrained Hugging Face models,
        passed with --extra; days of GPU time (the alignment pre-training alone is 90 ImageNet epochs).
        ``full`` is ``gpu`` with the larger math model; on a TPU pod run each experiment with
        ``scripts/launch_tpu_pod.sh`` instead.

Each experiment runs as ``python -m experiments.NAME.main --config=...:SCALE --workdir=OUT/NAME`` (so a killed
reproduction resumes from its checkpoints when started again) and writes ``OUT/NAME/results.json``; the report
and every figure are drawn from those files alone (``--report-only`` redraws them without running anything).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXPERIMENTS = ("imagenet_alignment", "maze", "math_reasoning")


# ---------------------------------------------------------------------------------------------------------
# The allocation section needs no training.


def allocation_section(out: pathlib.Path, seed: int = 0) -> str:
    """Scale-factor dispersion of uniform MaxRL vs SERA for Beta-distributed success rates."""
    import jax.numpy as jnp

    import sera_jax

    rng = np.random.default_rng(seed)
    num_prompts = 256
    p = np.sort(rng.beta(0.7, 1.5, size=num_prompts)).astype(np.float32)
    rows = ["| N_bar | n_max | method | prompts active | min s | 10th pct s | max s | CV of s | prompts at n_max |",
            "|---|---|---|---|---|---|---|---|---|"]
    curves = {}
    for n_bar in (4, 8, 16, 32):
        budget, n_max = num_prompts * n_bar, 8 * n_bar
        # sera: the released rule (prompts without a fair chance of a mixed group get none: factor 0);
        # sera_all_active: the max-min over every prompt.
        for method in ("uniform", "sera_all_active", "sera"):
            counts = np.asarray(sera_jax.core.get_allocator(method).counts(jnp.asarray(p), budget, n_min=2,
                                                                          n_max=n_max, num_prompts=num_prompts))
            s = np.asarray(sera_jax.scale_factor(jnp.asarray(p), counts))  # 0 where a prompt gets no rollouts
            stats = {k: float(v) for k, v in sera_jax.scale_factor_stats(s).items()}
            rows.append(f"| {n_bar} | {n_max} | {method} | {np.mean(counts > 0):.2f} | {stats['min']:.3f} | "
                        f"{np.quantile(s, 0.1):.3f} | {stats['max']:.3f} | {stats['cv']:.3f} | "
                        f"{int(np.sum(counts == n_max))} |")
            if n_bar == 8:
                curves[method] = (np.asarray(counts), s)
    allocation_figure(p, curves, n_bar=8).savefig(out / "allocation.png", dpi=110)
    return "\n".join([
        "## Allocation at equal budget (no training)", "",
        f"{num_prompts} prompts with p ~ Beta(0.7, 1.5) (seed {seed}), estimator `maxrl`, n_min = 2, "
        "n_max = 8 N_bar. SERA raises the smallest factors by giving hard prompts more rollouts; the "
        "hardest ones hit n_max, where no budget can lift them further (the max–min value is then set by them).",
        "", *rows, "", "![allocation](allocation.png)"])


def allocation_figure(p: np.ndarray, curves: dict[str, tuple[np.ndarray, np.ndarray]], n_bar: int):
    """Rollouts and scale factors against p, one line per method: ``curves[method] = (counts, s)``."""
    from matplotlib.ticker import FuncFormatter

    from sera_jax.report.figures import legend_outside, method_styles, new_figure

    fig = new_figure(figsize=(11, 3.6))
    axes = fig.subplots(1, 2)
    styles = method_styles(curves)
    zero = 0.5  # where a prompt without rollouts is drawn (the log axis has no 0), on a dotted line
    skipped = False
    for method, (counts, s) in curves.items():
        color, linestyle = styles[method]["color"], styles[method]["linestyle"]
        counts = np.asarray(counts, np.float64)
        skipped |= bool(np.any(counts <= 0))
        axes[0].plot(p, np.where(counts > 0, counts, zero), color=color, linestyle=linestyle, label=method)
        axes[1].plot(p, s, color=color, linestyle=linestyle, label=method)
    if skipped:
        axes[0].axhline(zero, color="0.6", lw=0.6, ls=":")
    axes[0].set(xlabel="success rate p", ylabel="rollouts N_i" + (" (log; dotted: 0)" if skipped else " (log)"),
                title=f"Allocation at N_bar = {n_bar}")
    axes[0].set_yscale("log", base=2)
    # 2, 4, 8 rather than 2^1, 2^2; the zero line's tick reads 0
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: "0" if skipped and v == zero else f"{v:g}"))
    axes[1].set(xlabel="success rate p", ylabel="scale factor s(p, N_i)",
                title="MaxRL scale factors (0 without rollouts)")
    for ax in axes:
        ax.grid(alpha=0.3)
    legend_outside(fig)
    return fig


# ---------------------------------------------------------------------------------------------------------
# Report sections built from the experiments' results.json.


def _fmt(mean: float, ci) -> str:
    return f"{mean:.3f}" if ci is None else f"{mean:.3f} ± {ci:.3f}"


def _quantiles(q: dict | None) -> str:
    """{"0.05": 0.0607, ...} as "5%: 0.06, ..."."""
    if not q:
        return "n/a"
    return ", ".join(f"{float(level) * 100:g}%: {value:.2f}" for level, value in q.items())


def _power_sentence(paired: dict) -> str:
    """What these paired comparisons can and cannot detect, from their own MDEs (so a 3-seed demo says so)."""
    counts = sorted({d.get("num_seeds") for d in paired.values()} - {None})
    seeds = "/".join(map(str, counts))
    if all(d.get("ci95") is None for d in paired.values()):
        paired_seeds = ("no paired seeds" if not counts else f"{counts[0]} paired seed" if counts == [1]
                        else f"{seeds} paired seeds")
        return f"With {paired_seeds} there is no interval: this run cannot compare the methods."
    mdes = [m for d in paired.values() for m in (d.get("mde80") or []) if m is not None and np.isfinite(m)]
    if not mdes:  # results written before the MDE was recorded
        return ""
    return (f"Power: with {seeds} paired seeds these comparisons detect (80% power) only true differences of "
            f"{min(mdes):.3f} to {max(mdes):.3f} in pass@k; smaller ones are likely missed, and an interval that "
            "contains 0 is no evidence of equality.")


def config_section(name: str, saved: dict) -> str:
    """The variant, seeds and every config field (mesh rules aside), compactly, under a fold."""
    config = saved.get("config") or {}
    flat: dict[str, object] = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif not path.startswith("mesh.rules"):
            flat[path] = node

    walk(config, "")
    seeds = config.get("seeds", config.get("dynamics", {}).get("seeds"))
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in flat.items())
    return (f"Config `{config.get('variant')}` (seeds {seeds}): `python -m experiments.{name}.main "
            f"--config=experiments/{name}/config.py:{config.get('variant')} --workdir=DIR`.\n\n"
            f"<details><summary>all config fields</summary>\n\n```\n{lines}\n```\n</details>\n")


def pass_at_k_section(name: str, title: str, saved: dict, figures: list[str]) -> str:
    from sera_jax.report.figures import seeds_label

    results = saved["results"]
    methods = {m: e for m, e in results["methods"].items() if "pass_at_k" in e}
    if not methods:
        return f"## {title}\n\nNo evaluations in results.json.\n"
    ks = next(iter(methods.values()))["pass_at_k"]["k"]
    show = [k for k in ks if k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048)]
    rows = ["| method | train rollouts | " + " | ".join(f"pass@{k}" for k in show) + " |",
            "|---|---|" + "---|" * len(show)]
    for method, entry in _ordered(methods):
        pk = entry["pass_at_k"]
        cells = [_fmt(pk["mean"][ks.index(k)], None if pk["ci95"] is None else pk["ci95"][ks.index(k)])
                 for k in show]
        rows.append(f"| {method} | {int(np.mean(entry['train_rollouts']))} | " + " | ".join(cells) + " |")
    seeds = next(iter(methods.values()))["seeds"]
    start = next(iter(methods.values()))["curves"][0]["evaluations"][0]
    lines = [f"## {title}", "",
             f"{seeds_label(len(seeds)).capitalize()} ({', '.join(map(str, seeds))}); mean ± 95% t-interval over "
             "seeds of the final held-out pass@k (unbiased estimator; no interval with one seed).",
             f"Starting policy (before RL): pass@1 = {start['pass_at_k'][0]:.3f}; per-prompt success-rate "
             f"quantiles {_quantiles(start.get('p_quantiles'))}.", "", *rows, ""]
    paired = results.get("paired_vs_uniform", {})
    if paired:
        lines += ["Paired by seed (same starting policy and data): final pass@k minus uniform MaxRL's, "
                  "mean ± 95% t-interval, and in brackets the minimum detectable effect (80% power, the "
                  "observed spread of the paired differences).", "",
                  "| method − uniform | " + " | ".join(f"pass@{k}" for k in show) + " |",
                  "|---|" + "---|" * len(show)]
        for method, d in paired.items():
            cells = [_fmt(d["mean_diff"][ks.index(k)], None if d["ci95"] is None else d["ci95"][ks.index(k)])
                     + ("" if d.get("mde80") is None else f" [MDE {d['mde80'][ks.index(k)]:.3f}]") for k in show]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        power = _power_sentence(paired)
        lines += ["", power, ""] if power else [""]
    lines += [f"![{f}]({f})" for f in figures]
    return "\n".join(lines + ["", config_section(name, saved)])


def alignment_section(name: str, saved: dict, figures: list[str]) -> str:
    from sera_jax.report.stats import mean_and_ci95

    results = saved["results"]
    lines = ["## Gradient alignment (controlled classification)", "",
             "Cosine similarity with the exact likelihood gradient per average budget N̄: the expected gradient's "
             "(analytic) / the sampled estimates' (mean ± 95% CI over draws).", ""]
    checkpoints = results.get("checkpoints", [])
    if checkpoints:
        from experiments.imagenet_alignment.config import ALLOCATOR_CORRECTION, ONLINE_METHODS

        # The online / train-mask peers train with their published loss: the batch mean over kept rollouts.
        loss = {m: False if m in ONLINE_METHODS else ALLOCATOR_CORRECTION.get(m) for m in checkpoints[0]["methods"]}
        loss.update({m: v for m, v in (("sera_pilot", True), ("sera_no_correction", False)) if m in loss})
        corrected = [m for m, v in loss.items() if v]
        uncorrected = [m for m, v in loss.items() if v is False]
        lines += ["Every allocator allocates on the classifier's exact p (oracle), except `sera_pilot` (p from a pilot "
                  "inside the budget). Loss weights: multiplicity-corrected (each prompt 1/P) for "
                  + ", ".join(f"`{m}`" for m in corrected) + "; the plain batch mean (the published loss) for "
                  + (", ".join(f"`{m}`" for m in uncorrected) or "none") + ".", ""]
    for ckpt in checkpoints:
        budgets = ckpt["budgets"]
        lines += [f"### Checkpoint at step {ckpt['step']} (accuracy {ckpt.get('accuracy', float('nan')):.2f}; "
                  f"p quantiles {_quantiles(ckpt.get('p_quantiles'))})", "",
                  "| method | " + " | ".join(f"N̄={b}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
        for method, m in _ordered(ckpt["methods"]):
            cells = []
            for j in range(len(budgets)):
                ci = m.get("cos_sampled_ci95")
                ci_j = ci[j] if isinstance(ci, list) else None
                half = (ci_j[1] - ci_j[0]) / 2 if isinstance(ci_j, (list, tuple)) else ci_j
                expected = m["cos_expected"][j]
                expected = "—" if expected is None or not np.isfinite(expected) else f"{expected:.3f}"
                cells.append(f"{expected} / {_fmt(m['cos_sampled_mean'][j], half)}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    training = results.get("training", {})
    if training.get("methods"):
        ks = training["pass_k"]
        lines += ["### Training dynamics", "",
                  f"Cross-entropy vs MaxRL ({training['estimator']}, N̄ = {training['rollouts_per_prompt']}) with "
                  "uniform and SERA allocation from the same initialisation: final validation pass@k, mean ± 95% "
                  "t-interval over seeds.", "",
                  "| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
        for method, m in _ordered(training["methods"]):
            cells = []
            for k in ks:
                finals = np.array([curve[-1] for curve in m["pass_at_k"][str(k)]])
                cells.append(_fmt(float(finals.mean()), mean_and_ci95(finals)[1]))
            lines.append(f"| {method} | {m['seeds']} | " + " | ".join(cells) + " |")
        lines.append("")
    for f in figures:
        lines.append(f"![{f}]({f})")
        if f.endswith("effective_weights.png"):  # which prompts each method over- and under-weights, in words
            from experiments.imagenet_alignment.figures import effective_weights_caption

            lines += ["", effective_weights_caption(results), ""]
    return "\n".join(lines + ["", config_section(name, saved)])


def make_figures(name: str, saved: dict, out: pathlib.Path) -> list[str]:
    """Draws the experiment's figures from its saved results into ``out`` (named ``NAME_*.png``)."""
    results, config, prefix = saved["results"], saved.get("config") or {}, f"{name}_"
    if name == "imagenet_alignment":
        from experiments.imagenet_alignment import figures

        paths = figures.make_all(results, out, prefix=prefix)
    elif name == "maze":
        from experiments.maze import experiment

        paths = experiment.make_figures(results, config, out, prefix=prefix)
    else:
        from experiments.math_reasoning import experiment

        paths = experiment.make_figures(results, config, out, prefix=prefix)
    return [path.name for path in paths]


METHOD_ORDER = ("ce", "uniform", "sera", "sera_pilot", "sera_no_correction", "grpo")


def _ordered(methods: dict) -> list:
    """(method, entry) pairs with the baseline first, then SERA and its variants."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(methods.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))


TITLES = {"imagenet_alignment": "Gradient alignment", "maze": "Maze navigation", "math_reasoning": "Math reasoning"}


def experiment_section(name: str, workdir: pathlib.Path, out: pathlib.Path) -> str:
    path = workdir / "results.json"
    if not path.exists():
        return f"## {TITLES[name]}\n\nNot run (no {path}).\n"
    saved = json.loads(path.read_text())
    figures = make_figures(name, saved, out)
    if name == "imagenet_alignment":
        return alignment_section(name, saved, figures)
    return pass_at_k_section(name, TITLES[name], saved, figures)


def run_experiment(name: str, scale: str, workdir: pathlib.Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", f"experiments.{name}.main", f"--config=experiments/{name}/config.py:{scale}",
           f"--workdir={workdir}", *extra]
    print("[reproduce]", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)


def parse_extra(items: list[str]) -> dict[str, list[str]]:
    """``["math_reasoning:--config.data.dir=/d", ...]`` -> {experiment: [flags]}."""
    extra: dict[str, list[str]] = {name: [] for name in EXPERIMENTS}
    for item in items:
        name, sep, flag = item.partition(":")
        if not sep or name not in EXPERIMENTS or not flag.startswith("-"):
            raise SystemExit(f"--extra={item!r}: expected EXPERIMENT:--flag=value with EXPERIMENT one of "
                             f"{', '.join(EXPERIMENTS)}")
        extra[name].append(flag)
    return extra


def main(argv=None) -> int:
    from experiments import platforms

    platforms.quiet_absent_accelerators()  # before this process imports JAX to draw the figures
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=["tiny", "demo", "cpu", "gpu", "full"], default="demo",
                        help="tiny: seconds, for the tests; the others as above")
    parser.add_argument("--out", default="results")
    parser.add_argument("--only", nargs="*", choices=EXPERIMENTS, help="run only these experiments")
    parser.add_argument("--extra", action="append", default=[], metavar="EXPERIMENT:--flag=value",
                        help="pass a flag to one experiment's command line (repeatable)")
    parser.add_argument("--report-only", action="store_true", help="rebuild REPORT.md and figures from results.json")
    args = parser.parse_args(argv)
    extra = parse_extra(args.extra)
    out = pathlib.Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    selected = args.only or EXPERIMENTS
    timings = {}
    if not args.report_only:
        for name in selected:
            start = time.time()
            run_experiment(name, args.scale, out / name, extra[name])
            timings[name] = time.time() - start
    title = "SERA reproduction" + ("" if args.report_only else f" ({args.scale} scale)")
    parts = [f"# {title}", "",
             "Generated by `scripts/reproduce.py`; every number and figure below is drawn from the experiments' "
             "`results.json` files in this folder (`--report-only` redraws them).", "", allocation_section(out), ""]
    for name in EXPERIMENTS:
        parts += [experiment_section(name, out / name, out), ""]
        if name in timings:
            parts += [f"_{name}: {timings[name]:.0f} s on this machine_", ""]
    (out / "REPORT.md").write_text("\n".join(parts))
    print(f"[reproduce] wrote {out / 'REPORT.md'}" + (f" after {sum(timings.values()):.0f} s" if timings else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
