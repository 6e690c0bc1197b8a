"""Training mode (``config.mode = "training"``): the classifier trained by every method, compared seed by seed.

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:classification --workdir=/tmp/classification_n4

For every seed of ``dynamics.seeds`` (outer) and method of ``dynamics.methods`` (inner), one run of
``training.run_dynamics`` from the seed's initialisation, data order and sampling numbers (common random numbers:
the methods of a seed differ by their allocation alone), in ``WORKDIR/seed_<seed>/<method>/`` (``checkpoints/``,
``metrics/``). A killed invocation resumes from the checkpoints; a finished run restores its last checkpoint, which
holds its evaluations and logged history, and trains nothing. results.json reports the seeds and methods of the
invocation's config, so the same command run again after a kill, or with more seeds or methods, rebuilds the
whole table (a workdir is tied to the fields of ``TRAINING_FINGERPRINT``; seeds, methods and the endpoints may
change).

``WORKDIR/results.json`` has the form of the RL comparisons' (``sera_jax.report.stats.summarize_runs``), so
``scripts/readme_results.py`` renders it (views ``pass_at_k``, ``paired``, ``start_change``), plus this setting's own
endpoints:

* ``methods``: per method ``seeds``, ``train_rollouts``, ``curves`` (per seed the validation evaluations:
  ``step``, ``k``, ``pass_at_k`` (analytic: mean 1 - (1-p)^k), ``accuracy`` (top-1), ``rollouts_spent``,
  ``p_quantiles``), ``history`` and ``pass_at_k`` (final: ``k``, ``mean``, ``ci95``, ``per_seed``, ``seeds``);
* ``paired_vs_uniform``: final pass@k minus uniform's, per method, over the seeds both ran;
* ``endpoints``: the declared ones (``dynamics.early_step``, ``dynamics.endpoint_k``): top-1 and pass@k at the
  early and the final step, per method and seed, and seed-paired minus uniform (mean, 95% t half-width, the
  minimum detectable effect at 80% power);
* ``gradient_cosine``: the cosine of each RL step's gradient with the exact cross-entropy gradient of its batch
  (every ``dynamics.monitor_every`` updates), per method and seed, its mean over seeds per update, its mean over
  the run and up to the early step, and those means seed-paired minus uniform; cross-entropy's is 1 by definition;
* ``task``: the setting in numbers (dataset, images, classes, budget, n_max);
* ``resumed_from_step``: per method and seed, the step this invocation started the run from.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from experiments.imagenet_alignment import figures, training
from experiments.imagenet_alignment import model as model_lib
from experiments.imagenet_alignment.dataset import load_data
from sera_jax.report import stats
from sera_jax.report.figures import seeds_label
from sera_jax.train import config_utils, writers
from sera_jax.train.loop import StepAllowance, StopRequested
from sera_jax.train.sharding import make_mesh
from sera_jax.train.workdir import claim_workdir, prepare_workdir

# The fields a training workdir is tied to: those of every run's checkpoints but the mesh (checkpoints restore into
# any layout). Seeds, methods, endpoints, the gradient monitor, checkpointing and logging may change between
# invocations.
TRAINING_FINGERPRINT = ("mode",) + training.DYNAMICS_FINGERPRINT
BASELINE = "uniform"


def run_training(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, stop_after: int | None = None,
                 devices=None, make_figures: bool = True) -> dict[str, Any] | None:
    """Runs (or resumes) every (seed, method) of a training-mode config (checked at the run's door,
    ``experiment.run``); returns the results written to ``WORKDIR/results.json``, or None if ``stop_after``
    optimizer steps stopped it first."""
    big = config.data.name == "imagenet2012"
    workdir = prepare_workdir(workdir, min_free_bytes=(1 << 30) if big else (1 << 26))
    claim_workdir(workdir, config_utils.fingerprint(config, TRAINING_FINGERPRINT))
    mesh = make_mesh(config.mesh, devices)
    data = load_data(config)
    build = functools.partial(model_lib.build_model, config, data.num_classes, data.image_shape[-1])
    graphdef, _, _ = build(config.seed)
    ctx = training.make_context(config, workdir, data, mesh, graphdef, StepAllowance(stop_after),
                                data_axes=tuple(a for a in config.mesh.data_axes if a in mesh.axis_names))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in config.dynamics.methods}
    try:
        for seed in config.dynamics.seeds:
            for method in config.dynamics.methods:
                run = training.run_dynamics(ctx, method, seed, build, run_dir=workdir / f"seed_{seed}" / method)
                runs[method].append({"seed": seed, **run})
    except StopRequested:
        logging.warning("stopped after %d optimizer steps (--stop_after); run again to resume", stop_after)
        return None
    results = summarize(config, runs, num_train=data.num_examples("train"),
                        num_validation=data.num_examples("validation"), num_classes=data.num_classes)
    # Where this invocation started each run (0: trained from the start; the run's steps: restored, finished).
    results["resumed_from_step"] = {m: {str(r["seed"]): r["resumed_from_step"] for r in method_runs}
                                    for m, method_runs in runs.items()}
    writers.write_results_json(workdir, results, config)
    if make_figures:
        results["figures"] = [p.name for p in figures.make_comparison(results, workdir)]
    writers.print_summary(summary(results), title=f"imagenet_alignment ({config.variant})")
    return results


def summarize(config: ml_collections.ConfigDict, runs: dict[str, list[dict[str, Any]]], *, num_train: int,
              num_validation: int, num_classes: int) -> dict[str, Any]:
    """The results of ``runs`` (``{method: [{"seed", **training.run_dynamics(...)}]}``): see the module docstring."""
    d = config.dynamics
    results = stats.summarize_runs(runs)
    results["endpoints"] = endpoints(runs, early_step=d.early_step, final_step=d.steps, k=d.endpoint_k)
    results["gradient_cosine"] = gradient_cosine(runs, early_step=d.early_step)
    n_max = max(config.sera.n_max_factor * d.rollouts_per_prompt, config.sera.n_min)
    results["task"] = {"dataset": config.data.name, "train_images": num_train, "validation_images": num_validation,
                       "classes": num_classes, "images_per_step": config.optim.batch_size,
                       "rollouts_per_image": d.rollouts_per_prompt,
                       "rollouts_per_step": config.optim.batch_size * d.rollouts_per_prompt,
                       "n_min": config.sera.n_min, "n_max": n_max, "activation_threshold": d.activation_threshold,
                       "steps": d.steps, "p": "the true p (the softmax probability of the label)"}
    return results


def _evaluation_at(run: dict[str, Any], step: int) -> dict[str, Any] | None:
    return next((e for e in run["evaluations"] if e["step"] == step), None)


def _paired(per_seed: dict[int, np.ndarray], base: dict[int, np.ndarray]) -> dict[str, Any] | None:
    """Differences per seed both have: mean, 95% t half-width and MDE at 80% power (``stats``' definitions)."""
    seeds = sorted(set(per_seed) & set(base))
    if not seeds:
        return None
    diffs = np.array([np.asarray(per_seed[s], np.float64) - np.asarray(base[s], np.float64) for s in seeds])
    mean, half = stats.mean_and_ci95(diffs)
    mde = stats.minimum_detectable_effect(diffs.std(axis=0, ddof=1), len(seeds)) if len(seeds) > 1 else None
    return {"mean_diff": mean.tolist(), "ci95": None if half is None else half.tolist(),
            "mde80": None if mde is None else mde.tolist(), "num_seeds": len(seeds), "seeds": seeds}


def _over_seeds(per_seed: dict[int, np.ndarray]) -> dict[str, Any]:
    values = np.array([per_seed[s] for s in sorted(per_seed)], np.float64)
    mean, half = stats.mean_and_ci95(values)
    return {"seeds": sorted(per_seed), "per_seed": values.tolist(), "mean": mean.tolist(),
            "ci95": None if half is None else half.tolist()}


def endpoints(runs: dict[str, list[dict[str, Any]]], *, early_step: int, final_step: int, k: int) -> dict[str, Any]:
    """Top-1 and pass@k at ``early_step`` and ``final_step``, per method (seeds, per_seed, mean, ci95) and paired
    minus the baseline (uniform) by seed."""
    steps = sorted({early_step, final_step})
    names = [name for s in steps for name in (f"top1@{s}", f"pass@{k}@{s}")]
    by_method: dict[str, dict[int, np.ndarray]] = {}
    for method, method_runs in runs.items():
        values = {}
        for run in method_runs:
            evals = [_evaluation_at(run, s) for s in steps]
            if all(e is not None for e in evals):
                values[run["seed"]] = np.array([v for e in evals for v in (e["accuracy"],
                                                                           e["pass_at_k"][e["k"].index(k)])])
        if values:
            by_method[method] = values
    out: dict[str, Any] = {"early_step": early_step, "final_step": final_step, "k": k, "names": names,
                           "methods": {m: _over_seeds(v) for m, v in by_method.items()}, "paired_vs_uniform": {}}
    if BASELINE in by_method:
        for method, values in by_method.items():
            paired = None if method == BASELINE else _paired(values, by_method[BASELINE])
            if paired is not None:
                out["paired_vs_uniform"][method] = {"names": names, **paired}
    return out


def cosine_curve(history: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(updates, cosines) of a run's monitored steps: the history's entries with ``grad_cosine``, at the number of
    updates their step completes (``step + 1``, the SERA authors' ``global_step``)."""
    points = [(int(h["step"]) + 1, float(h["grad_cosine"])) for h in history if "grad_cosine" in h]
    return [u for u, _ in points], [c for _, c in points]


def gradient_cosine(runs: dict[str, list[dict[str, Any]]], *, early_step: int) -> dict[str, Any]:
    """Per RL method: the monitored updates, per-seed cosines, their mean and 95% half-width over seeds at each
    update, and per seed the mean over the run (``run_mean``) and over the updates up to ``early_step``
    (``early_mean``), each also paired minus uniform by seed."""
    methods, run_means, early_means = {}, {}, {}
    for method, method_runs in runs.items():
        curves = {run["seed"]: cosine_curve(run["history"]) for run in method_runs}
        curves = {s: c for s, c in curves.items() if c[0]}
        if not curves:
            continue  # cross-entropy (1 by definition), or no monitored step
        updates = next(iter(curves.values()))[0]
        curves = {s: c for s, c in curves.items() if c[0] == updates}  # seeds monitored at the same updates
        per_seed = {s: np.asarray(c[1]) for s, c in curves.items()}
        early = np.asarray(updates) <= early_step
        run_means[method] = {s: np.array([v.mean()]) for s, v in per_seed.items()}
        early_means[method] = {s: np.array([v[early].mean()]) for s, v in per_seed.items()} if early.any() else {}
        methods[method] = {"updates": updates, **_over_seeds(per_seed),
                           "run_mean": _over_seeds(run_means[method]),
                           "early_mean": _over_seeds(early_means[method]) if early.any() else None}
    paired = {}
    if BASELINE in methods:
        for method in methods:
            if method == BASELINE:
                continue
            paired[method] = {"run_mean": _paired(run_means[method], run_means[BASELINE]),
                              "early_mean": _paired(early_means[method], early_means[BASELINE])
                              if early_means[method] and early_means[BASELINE] else None}
    return {"early_step": early_step, "methods": methods, "paired_vs_uniform": paired}


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers: each method's endpoints (mean over seeds), their paired differences from uniform, and
    the mean gradient cosine."""
    ep = results["endpoints"]
    out: dict[str, Any] = {"endpoints": " ".join(f"{n:>14}" for n in ep["names"])}
    for method, entry in ep["methods"].items():
        out[f"{method} ({seeds_label(len(entry['seeds']))})"] = " ".join(f"{v:14.4f}" for v in entry["mean"])
    for method, d in ep["paired_vs_uniform"].items():
        halves = d["ci95"] or [float("nan")] * len(d["mean_diff"])
        out[f"{method} - uniform"] = " ".join(f"{m:+8.4f}±{h:.4f}" for m, h in zip(d["mean_diff"], halves))
    for method, entry in results["gradient_cosine"]["methods"].items():
        out[f"grad cosine {method} (run mean)"] = round(entry["run_mean"]["mean"][0], 4)
    return out
