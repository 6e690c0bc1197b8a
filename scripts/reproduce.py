"""Reproduces SERA's experiments at one scale and writes ``OUT/REPORT.md`` with the figures beside it.

    python scripts/reproduce.py --scale=demo --out=results        # the README's main command (CPU, minutes)
    python scripts/reproduce.py --scale=cpu --out=results_cpu     # the longer CPU runs (about an hour)
    python scripts/reproduce.py --scale=gpu --out=/data/sera      # one GPU machine (see scripts/launch_gpu.sh)
    python scripts/reproduce.py --report-only --out=results       # redraw figures + REPORT from results.json

Each experiment runs as ``python -m experiments.NAME.main --config=...:SCALE --workdir=OUT/NAME`` (so a killed
reproduction resumes from its checkpoints when started again) and writes ``OUT/NAME/results.json``; the report
is built from those files alone.
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
# Config variant per (experiment, scale) where it is not the scale's name: the alignment experiment has no
# demo variant yet, so the demo runs its tiny config (its cpu config takes about 11 minutes on 2 cores).
VARIANT_OVERRIDES = {("imagenet_alignment", "demo"): "tiny"}


# ---------------------------------------------------------------------------------------------------------
# The allocation section needs no training.


def allocation_section(out: pathlib.Path, seed: int = 0) -> str:
    """Scale-factor dispersion of uniform MaxRL vs SERA for Beta-distributed success rates."""
    import jax.numpy as jnp

    import sera_jax
    from sera_jax.rl.results import _pyplot

    plt = _pyplot()
    rng = np.random.default_rng(seed)
    num_prompts = 256
    p = np.sort(rng.beta(0.7, 1.5, size=num_prompts)).astype(np.float32)
    rows = ["| N_bar | n_max | method | min s | 10th pct s | max s | CV of s | prompts at n_max |",
            "|---|---|---|---|---|---|---|---|"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for n_bar in (4, 8, 16, 32):
        budget, n_max = num_prompts * n_bar, 8 * n_bar
        for method in ("uniform", "sera"):
            counts = sera_jax.allocate(p, budget, n_min=2, n_max=n_max, method=method)
            s = np.asarray(sera_jax.scale_factor(jnp.asarray(p), counts))
            stats = {k: float(v) for k, v in sera_jax.scale_factor_stats(s).items()}
            rows.append(f"| {n_bar} | {n_max} | {method} | {stats['min']:.3f} | {np.quantile(s, 0.1):.3f} | "
                        f"{stats['max']:.3f} | {stats['cv']:.3f} | {int(np.sum(np.asarray(counts) == n_max))} |")
            if n_bar == 8:
                axes[0].plot(p, np.asarray(counts), label=method)
                axes[1].plot(p, s, label=method)
    axes[0].set(xlabel="success rate p", ylabel="rollouts N_i", title="Allocation at N_bar = 8", yscale="log")
    axes[1].set(xlabel="success rate p", ylabel="scale factor s(p, N_i)", title="MaxRL scale factors")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "allocation.png", dpi=110)
    plt.close(fig)
    return "\n".join([
        "## Allocation at equal budget (no training)", "",
        f"{num_prompts} prompts with p ~ Beta(0.7, 1.5) (seed {seed}), estimator `maxrl`, n_min = 2, "
        "n_max = 8 N_bar. SERA raises the smallest factors by giving hard prompts more rollouts; the "
        "hardest ones hit n_max, where no budget can lift them further (the max–min value is then set by them).",
        "", *rows, "", "![allocation](allocation.png)"])


# ---------------------------------------------------------------------------------------------------------
# Report sections built from the experiments' results.json.


def _fmt(mean: float, ci) -> str:
    return f"{mean:.3f}" if ci is None else f"{mean:.3f} ± {ci:.3f}"


def pass_at_k_section(name: str, saved: dict, figures: list[str]) -> str:
    results, config = saved["results"], saved.get("config", {})
    methods = {m: e for m, e in results["methods"].items() if "pass_at_k" in e}
    if not methods:
        return f"## {name}\n\nNo evaluations in results.json.\n"
    ks = next(iter(methods.values()))["pass_at_k"]["k"]
    show = [k for k in ks if k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048)]
    rows = ["| method | train rollouts | " + " | ".join(f"pass@{k}" for k in show) + " |",
            "|---|---|" + "---|" * len(show)]
    for method, entry in methods.items():
        pk = entry["pass_at_k"]
        cells = [_fmt(pk["mean"][ks.index(k)], None if pk["ci95"] is None else pk["ci95"][ks.index(k)])
                 for k in show]
        rows.append(f"| {method} | {int(np.mean(entry['train_rollouts']))} | " + " | ".join(cells) + " |")
    seeds = next(iter(methods.values()))["seeds"]
    start = next(iter(methods.values()))["curves"][0]["evaluations"][0]
    lines = [f"## {name}", "",
             f"Seeds {seeds}; mean ± 95% t-interval over seeds of the final held-out pass@k (unbiased estimator).",
             f"Starting policy (before RL): pass@1 = {start['pass_at_k'][0]:.3f}, per-prompt success-rate "
             f"quantiles {start.get('p_quantiles', {})}.", "", *rows, ""]
    paired = results.get("paired_vs_uniform", {})
    if paired:
        lines += ["Paired by seed (same starting policy and data): final pass@k minus uniform MaxRL's, "
                  "mean ± 95% t-interval.", "",
                  "| method − uniform | " + " | ".join(f"pass@{k}" for k in show) + " |", "|---|" + "---|" * len(show)]
        for method, d in paired.items():
            cells = [_fmt(d["mean_diff"][ks.index(k)], None if d["ci95"] is None else d["ci95"][ks.index(k)])
                     for k in show]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"![{f}]({f})" for f in figures]
    if config:
        lines += ["", f"<details><summary>config</summary>\n\n```json\n{json.dumps(config, indent=1)[:6000]}\n```\n"
                  "</details>"]
    return "\n".join(lines)


def alignment_section(saved: dict, figures: list[str]) -> str:
    results = saved["results"]
    lines = ["## Gradient alignment (controlled classification)", "",
             "Cosine similarity with the exact likelihood gradient: analytic expectation, and sampled estimates "
             "(mean ± 95% CI over draws), per average budget N_bar.", ""]
    for ckpt in results.get("checkpoints", []):
        budgets = ckpt["budgets"]
        lines += [f"### checkpoint at step {ckpt['step']} (p quantiles {ckpt.get('p_quantiles')})", "",
                  "| method | " + " | ".join(f"N̄={b}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
        for method, m in ckpt["methods"].items():
            cells = []
            for j in range(len(budgets)):
                ci = m.get("cos_sampled_ci95")
                ci_j = ci[j] if isinstance(ci, list) else None
                half = (ci_j[1] - ci_j[0]) / 2 if isinstance(ci_j, (list, tuple)) else ci_j
                cells.append(f"{m['cos_expected'][j]:.3f} / {_fmt(m['cos_sampled_mean'][j], half)}")
            lines.append(f"| {method} (expected / sampled) | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"![{f}]({f})" for f in figures]
    return "\n".join(lines)


def experiment_section(name: str, workdir: pathlib.Path, out: pathlib.Path) -> str:
    path = workdir / "results.json"
    if not path.exists():
        return f"## {name}\n\nNot run (no {path}).\n"
    saved = json.loads(path.read_text())
    figures = sorted(p.name for p in workdir.glob("*.png"))
    for fig in figures:  # copy next to the report so the markdown links work
        (out / f"{name}_{fig}").write_bytes((workdir / fig).read_bytes())
    figures = [f"{name}_{f}" for f in figures]
    if name == "imagenet_alignment":
        return alignment_section(saved, figures)
    return pass_at_k_section({"maze": "Maze navigation", "math_reasoning": "Math reasoning"}[name], saved, figures)


def run_experiment(name: str, scale: str, workdir: pathlib.Path) -> None:
    variant = VARIANT_OVERRIDES.get((name, scale), scale)
    cmd = [sys.executable, "-m", f"experiments.{name}.main", f"--config=experiments/{name}/config.py:{variant}",
           f"--workdir={workdir}"]
    print("[reproduce]", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=["demo", "cpu", "gpu", "full"], default="demo")
    parser.add_argument("--out", default="results")
    parser.add_argument("--only", nargs="*", choices=EXPERIMENTS, help="run only these experiments")
    parser.add_argument("--report-only", action="store_true", help="rebuild REPORT.md and figures from results.json")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    selected = args.only or EXPERIMENTS
    timings = {}
    if not args.report_only:
        for name in selected:
            start = time.time()
            run_experiment(name, args.scale, out / name)
            timings[name] = time.time() - start
    parts = [f"# SERA reproduction ({args.scale} scale)", "",
             "Generated by `scripts/reproduce.py`; every number below is read from the experiments' "
             "`results.json` files in this folder.", "", allocation_section(out), ""]
    for name in EXPERIMENTS:
        parts += [experiment_section(name, out / name, out), ""]
        if name in timings:
            parts += [f"_{name}: {timings[name]:.0f} s_", ""]
    from sera_jax.rl import results as results_lib

    for name in ("maze", "math_reasoning"):  # redraw the standard figures from the saved files
        path = out / name / "results.json"
        if path.exists():
            saved = json.loads(path.read_text())["results"]
            results_lib.plot_pass_at_k(saved, out / f"{name}_pass_at_k.png", title=name)
            results_lib.plot_neg_log_pass_at_k(saved, out / f"{name}_neg_log_pass_at_k.png")
    (out / "REPORT.md").write_text("\n".join(parts))
    print(f"[reproduce] wrote {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
