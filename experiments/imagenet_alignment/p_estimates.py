"""How well each way of estimating p equalises the TRUE scale factors, where p is exact (docs/method.md §2).

    python -m experiments.imagenet_alignment.p_estimates \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=results/imagenet_alignment

At the CE checkpoints of the alignment experiment (``pretrain.checkpoint_steps``; pre-training is resumed from
``<workdir>/pretrain`` or run), with the exact ``p_i = softmax(x_i)[y_i]`` of the P analysis images, and at
every average budget ``N_bar`` of ``analysis.budgets`` (B = P N_bar, bounds as in ``settings.py``):

* ways of estimating p (``METHODS``): ``uniform`` (no estimate), ``oracle`` (the exact p), ``pilot_point``
  (n0 pilot rollouts inside the budget, allocation on the Jeffreys posterior mean: ``sera.use_posterior=False``),
  ``pilot_posterior`` (the same pilots, allocation on the posterior-expected factor), ``history_point`` /
  ``history_posterior`` (the tracker's Beta posterior after one earlier visit of ``N_bar`` uniform rollouts at
  the same p, its prior fitted to all P prompts: ``core.tracker_posterior``; history without policy drift,
  so an optimistic bound for history);
* equalisation: ``D = --allocation_draws`` independent estimates per cell; per draw the TRUE factors
  ``s(p_i, N_i)`` give ``true_min``, ``true_cv`` and ``true_low`` (mean over the 10% lowest-p prompts), beside what
  a run would log for the same draw: ``plugin_low`` (``s(p_hat_i, N_i)``, the old ``scale_*``) and ``est_low``
  (the posterior-expected factor, the new ``scale_est_*``);
* sampled cosine with the exact gradient G*: ``R = --cosine_draws`` sampled estimates per cell through the
  analysis's own machinery (``programs.compiled``: the draw program, whose pilot slot takes each method's
  counts, and the VJP Gram matrix); with its common random numbers a pilot method's first n0 rollouts are its
  pilot, and a history method's are ordinary rollouts (its allocation does not depend on them).

Every statistic is a mean over draws with its 95% Student-t interval; ``paired`` holds posterior minus point
per draw (same pilots / histories and sampling keys), whose interval decides whether one is better. Seeds:
draw d of cell (checkpoint c, budget b, method) uses ``fold_in(fold_in(fold_in(key(seed), step_c), b), d)``
(methods share keys, so they are paired). Writes ``<workdir>/p_estimates.json`` and prints the tables.
"""

from __future__ import annotations

import functools
import math
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment import model as model_lib
from experiments.imagenet_alignment import programs, training
from experiments.imagenet_alignment.cosines import cosine_and_error
from experiments.imagenet_alignment.dataset import analysis_set, load_data
from experiments.imagenet_alignment.settings import AnalysisSettings
from sera_jax import core
from sera_jax.report import stats as seed_stats
from sera_jax.train import cli, config_utils, files
from sera_jax.train.loop import StepAllowance
from sera_jax.train import sharding
from sera_jax.train.sharding import make_mesh
from sera_jax.train.workdir import claim_workdir, prepare_workdir

Array = jnp.ndarray
METHODS = ("uniform", "oracle", "pilot_point", "pilot_posterior", "history_point", "history_posterior")
ESTIMATED = METHODS[2:]  # methods whose allocation comes from an estimate (a posterior and its mean)
PAIRS = (("pilot_posterior", "pilot_point"), ("history_posterior", "history_point"),
         ("pilot_posterior", "history_posterior"))
LOW_FRACTION = 0.1  # true_low / est_low / plugin_low: mean over this fraction of lowest-p prompts


# ------------------------------------------------------------------------------ estimates and allocations


def method_posterior(method: str, key: Array, p_P: Array, *, n0: int, history_rollouts: int):
    """(Beta posterior of p, pilot successes or None) of one draw of an estimated method (pure jnp).

    ``pilot_*``: ``K0 ~ Binom(n0, p)`` and the Jeffreys posterior; ``history_*``: ``H ~ Binom(history_rollouts, p)``
    on a tracker over the P prompts (prior fitted to all of them: ``core.tracker_posterior``).
    """
    if method.startswith("pilot"):
        k0_P = E.pilot_successes(key, p_P, n0, 1)[0]
        return core.pilot_posterior(k0_P, n0), k0_P
    successes = E.pilot_successes(key, p_P, history_rollouts, 1)[0].astype(p_P.dtype)
    tracker = core.TrackerState(successes, history_rollouts - successes)
    return core.tracker_posterior(tracker, jnp.arange(p_P.shape[0])), None


def method_counts(method: str, p_P: Array, posterior, k0_P, *, budget: int, n_min: int, n_max: int, n0: int,
                  estimator: str) -> Array:
    """Total counts ``N_P`` (pilot included) of ``method`` given its draw's estimate (static budget: jittable)."""
    if method == "uniform":
        return core.uniform_counts(p_P.shape[0], budget)
    if method == "oracle":
        return core.allocate(p_P, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=False,
                             method="sera_all_active")
    use_posterior = method.endswith("posterior")
    if method.startswith("pilot"):
        return core.pilot_allocate(k0_P, n0, budget, n_min=n_min, n_max=n_max, estimator=estimator,
                                   use_posterior=use_posterior, check=False, method="sera_all_active")
    return core.allocate(posterior if use_posterior else posterior.mean, budget, n_min=n_min, n_max=n_max,
                         estimator=estimator, check=False, method="sera_all_active")


def low_mask(p_P: np.ndarray, fraction: float = LOW_FRACTION) -> np.ndarray:
    """The ``ceil(fraction P)`` prompts of lowest p (ties by index)."""
    num = max(1, math.ceil(fraction * len(p_P)))
    mask = np.zeros(len(p_P), bool)
    mask[np.argsort(p_P, kind="stable")[:num]] = True
    return mask


@functools.partial(jax.jit, static_argnames=("method", "budget", "n_min", "n_max", "n0", "estimator",
                                             "history_rollouts", "batch"))
def _allocation_draws(keys_D, p_P, low_P, *, method, budget, n_min, n_max, n0, estimator, history_rollouts, batch):
    """Per draw: counts and the true / plug-in / posterior-expected factor statistics of ``method``."""

    def one(key):
        posterior = k0 = None
        if method in ESTIMATED:
            posterior, k0 = method_posterior(method, key, p_P, n0=n0, history_rollouts=history_rollouts)
        counts = method_counts(method, p_P, posterior, k0, budget=budget, n_min=n_min, n_max=n_max, n0=n0,
                               estimator=estimator)
        # Factors 0 where a prompt gets no rollouts (E.scale_factors); min and CV over the prompts with rollouts,
        # the low-p mean over all of the lowest-p prompts (a skipped one adds its 0).
        active = counts > 0
        true = E.scale_factors(p_P, counts, estimator=estimator, max_n=n_max)
        stats = E.scale_statistics(true, counts)
        low = jnp.sum(jnp.where(low_P, true, 0.0)) / jnp.sum(low_P)
        out = {"true_min": stats["min"], "true_cv": stats["cv"], "true_low": low}
        if posterior is not None:
            plugin = E.scale_factors(posterior.mean, counts, estimator=estimator, max_n=n_max)
            est = jnp.where(active, core.posterior_scale_factor(posterior, jnp.maximum(counts, 1), estimator,
                                                                max_n=n_max, check=False), 0.0)
            out.update({"plugin_min": E.scale_statistics(plugin, counts)["min"],
                        "est_min": E.scale_statistics(est, counts)["min"],
                        "plugin_low": jnp.sum(jnp.where(low_P, plugin, 0.0)) / jnp.sum(low_P),
                        "est_low": jnp.sum(jnp.where(low_P, est, 0.0)) / jnp.sum(low_P)})
        return out

    return jax.lax.map(one, keys_D, batch_size=batch)


def summarise(values: np.ndarray) -> dict[str, Any]:
    """Mean and 95% Student-t interval over draws."""
    values = np.asarray(values, np.float64)
    mean, ci = seed_stats.mean_and_interval95(values)
    return {"mean": float(mean), "ci95": [float(ci[0]), float(ci[1])], "draws": int(values.size)}


def allocation_study(p_P: np.ndarray, key: Array, *, budgets, estimator: str, n_min: int, n_max_factor: int,
                     n0: int, num_draws: int, methods=METHODS) -> dict[str, Any]:
    """{N_bar: {"methods": {method: {stat: summary}}, "paired": {a-b: {stat: summary}}}} for one checkpoint."""
    p = jnp.asarray(p_P, jnp.float32)
    low = jnp.asarray(low_mask(np.asarray(p_P)))
    num_prompts = p.shape[0]
    out = {}
    for b_index, n_bar in enumerate(budgets):
        n_max = max(n_max_factor * n_bar, n_min)
        n0_b = min(n0, n_bar)
        keys = jax.random.split(jax.random.fold_in(key, b_index), num_draws)
        # Posterior tables are P x n_max per draw: fewer draws at a time at large budgets.
        batch = max(1, min(num_draws, (1 << 22) // (num_prompts * n_max)))
        per_method = {}
        for method in methods:
            draws = _allocation_draws(keys, p, low, method=method, budget=num_prompts * n_bar, n_min=n_min,
                                      n_max=n_max, n0=n0_b, estimator=estimator, history_rollouts=n_bar,
                                      batch=batch)
            per_method[method] = {k: np.asarray(v, np.float64) for k, v in jax.device_get(draws).items()}
            print(f"allocation study: N_bar {n_bar}, {method} done", file=sys.stderr, flush=True)
        out[str(n_bar)] = {
            "methods": {m: {k: summarise(v) for k, v in d.items()} for m, d in per_method.items()},
            "paired": {f"{a}-{b}": {k: summarise(per_method[a][k] - per_method[b][k])
                                    for k in ("true_min", "true_cv", "true_low")}
                       for a, b in PAIRS if a in per_method and b in per_method},
        }
    return out


# ------------------------------------------------------------------------------ sampled cosine


def cosine_study(fns: programs.Compiled, align, probs_PxK, labels, p_P, key: Array, *, budgets, estimator: str,
                 n_min: int, n_max_factor: int, n0: int, num_draws: int) -> dict[str, Any]:
    """{N_bar: {"methods": {method: summary of cos}, "paired": {...}}}: sampled cosine to G* per method.

    Each chunk of M draws goes through ``fns.draws`` once per estimated method, with that method's counts in the
    pilot slot; ``uniform`` and ``oracle`` come from the first call (the analysis's fixed ``uniform`` and ``sera``
    slots). Draws are paired across methods by common random numbers: draw m's rollout j of prompt i is the same
    label for every method, and its pilot is rollouts 0..n0-1 (the same keys); histories are drawn with keys of
    their own."""
    num_prompts = probs_PxK.shape[0]
    chunk = fns.chunk
    length = num_prompts * max(budgets)
    out = {}
    for b_index, n_bar in enumerate(budgets):
        budget, n_max, n0_b = num_prompts * n_bar, max(n_max_factor * n_bar, n_min), min(n0, n_bar)
        bounds = dict(budget=budget, n_min=n_min, n_max=n_max, n0=n0_b, estimator=estimator)
        uniform_P = core.uniform_counts(num_prompts, budget)
        oracle_P = core.allocate(p_P, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=False,
                                 method="sera_all_active")
        # The draw program's rows: uniform, the oracle and the estimated method (its pilot slot), all corrected.
        fixed_AxP = jax.device_put(jnp.stack([uniform_P, oracle_P, uniform_P]).astype(jnp.int32), fns.replicated)
        corrections_A = jax.device_put(np.ones(3, bool), fns.replicated)
        cos = {m: [] for m in METHODS}
        for c in range(math.ceil(num_draws / chunk)):
            key_c = jax.random.fold_in(jax.random.fold_in(key, b_index), c)
            draw_keys = jax.random.split(jax.random.fold_in(key_c, 0), chunk)  # pilots and rollouts
            history_keys = jax.random.split(jax.random.fold_in(key_c, 1), chunk)
            k0_MxP = jax.vmap(lambda k: E.sample_pilot(k, probs_PxK, labels, n0_b)[1])(draw_keys)
            for m_index, method in enumerate(ESTIMATED):
                counts_MxP = _estimated_counts(method, history_keys, k0_MxP, p_P, history_rollouts=n_bar, **bounds)
                draws = fns.draws(draw_keys, probs_PxK, labels, fixed_AxP, corrections_A, counts_MxP, budget,
                                  estimator=estimator, length=length, methods=("uniform", "sera", "sera_pilot"))
                slots = {method: "sera_pilot"}
                if m_index == 0:
                    slots.update(uniform="uniform", oracle="sera")
                for name, slot in slots.items():
                    cos[name].append(align(draws[slot])[0])
        cos = {m: np.concatenate(v)[:num_draws] for m, v in cos.items()}
        print(f"cosine study: N_bar {n_bar} done", file=sys.stderr, flush=True)
        out[str(n_bar)] = {"methods": {m: summarise(v) for m, v in cos.items()},
                           "paired": {f"{a}-{b}": summarise(cos[a] - cos[b]) for a, b in PAIRS}}
    return out


@functools.partial(jax.jit, static_argnames=("method", "budget", "n_min", "n_max", "n0", "estimator",
                                             "history_rollouts"))
def _estimated_counts(method, keys_M, k0_MxP, p_P, *, budget, n_min, n_max, n0, estimator, history_rollouts):
    """Counts (M x P) of an estimated method: pilot methods from the sampled pilots' successes ``k0_MxP``,
    history methods from independent histories drawn with ``keys_M``."""

    def one(key, k0_P):
        if method.startswith("pilot"):
            posterior, k0 = core.pilot_posterior(k0_P, n0), k0_P
        else:
            posterior, k0 = method_posterior(method, jax.random.fold_in(key, 7), p_P, n0=n0,
                                             history_rollouts=history_rollouts)
        return method_counts(method, p_P, posterior, k0, budget=budget, n_min=n_min, n_max=n_max, n0=n0,
                             estimator=estimator)

    return jax.lax.map(lambda args: one(*args), (keys_M, k0_MxP), batch_size=min(4, keys_M.shape[0]))


# ------------------------------------------------------------------------------ the run


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, allocation_draws: int = 200,
        cosine_draws: int = 32, cosine_steps: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Both studies at every checkpoint (``cosine_steps``: the checkpoints of the cosine study; None: all but
    the random init, where p is flat and every allocation is nearly uniform). Writes ``p_estimates.json``."""
    from experiments.imagenet_alignment import config as config_lib
    config_lib.validate_config(config)
    workdir = prepare_workdir(workdir)
    claim_workdir(workdir, config_utils.fingerprint(config, training.PRETRAIN_FINGERPRINT))
    mesh = make_mesh(config.mesh)
    data = load_data(config)
    graphdef, init_params, init_stats = model_lib.build_model(config, data.num_classes, data.image_shape[-1],
                                                              config.seed)
    data_axes = tuple(a for a in config.mesh.data_axes if a in mesh.axis_names)
    ctx = training.make_context(config, workdir, data, mesh, graphdef, StepAllowance(None), data_axes=data_axes)
    training.run_pretraining(ctx, init_params, init_stats)
    x, labels_np = analysis_set(data, config.analysis.num_prompts)
    settings = AnalysisSettings.from_config(config)
    estimator = settings.estimators[0]
    steps = list(config.pretrain.checkpoint_steps)
    cosine_steps = tuple(cosine_steps) if cosine_steps is not None else tuple(s for s in steps if s > 0)
    common = dict(budgets=settings.budgets, estimator=estimator, n_min=max(settings.n_min,
                  core.get_estimator(estimator).min_rollouts), n_max_factor=settings.n_max_factor, n0=settings.n0)
    results = {"estimator": estimator, "n0": settings.n0, "num_prompts": len(labels_np), "low_fraction": LOW_FRACTION,
               "allocation_draws": allocation_draws, "cosine_draws": cosine_draws, "seed": config.seed,
               "checkpoints": []}
    for step in steps:
        start = time.perf_counter()
        params, stats = training.load_pretrained(ctx, step, init_params, init_stats)
        fns = programs.compiled(graphdef, mesh, data_axes, settings.draw_chunk, 1, settings.fast_compile)
        params, stats = jax.device_put((params, stats), fns.replicated)
        batch = sharding.shard_batch({"x": x, "y": np.asarray(labels_np, np.int32)}, mesh, data_axes)
        probs, p_P, _, exact_block = fns.forward(params, stats, batch["x"], batch["y"])
        p_host = np.asarray(jax.device_get(p_P), np.float64)
        key = jax.random.fold_in(jax.random.key(config.seed), step)
        entry = {"step": step, "p_quantiles": {str(q): float(np.quantile(p_host, q)) for q in (0.05, 0.1, 0.5, 0.9)},
                 "allocation": allocation_study(p_host, jax.random.fold_in(key, 0), num_draws=allocation_draws,
                                                **common)}
        if step in cosine_steps:
            grads, _, _, _ = fns.chunk_grads(params, stats, batch["x"], exact_block, params)
            exact_grad = jax.tree.map(lambda g: g[0], grads)

            def align(block, params=params, stats=stats, xb=batch["x"], exact_grad=exact_grad, fns=fns):
                _, gram, dots, target_sq = fns.chunk_grads(params, stats, xb, jax.device_put(block, fns.chunk_rows),
                                                           exact_grad)
                gram, dots, target_sq = (np.asarray(v, np.float64) for v in jax.device_get((gram, dots, target_sq)))
                return cosine_and_error(gram, dots, float(target_sq))

            entry["cosine"] = cosine_study(fns, align, probs, batch["y"], jax.device_put(p_P, fns.replicated),
                                           jax.random.fold_in(key, 1), num_draws=cosine_draws, **common)
        entry["seconds"] = time.perf_counter() - start
        results["checkpoints"].append(entry)
    if jax.process_index() == 0:
        files.write_json_atomic(workdir / "p_estimates.json", config_utils.to_jsonable(results))
    print(format_tables(results))
    return results


def _fmt(s: dict[str, Any], digits: int = 3) -> str:
    lo, hi = s["ci95"]
    return f"{s['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_tables(results: dict[str, Any]) -> str:
    """Markdown tables: per checkpoint and budget, each method's true-factor statistics (and the logged
    estimates beside them), its sampled cosine, and the paired posterior-minus-point differences."""
    lines = [f"estimator {results['estimator']}, n0 = {results['n0']}, P = {results['num_prompts']}, seed "
             f"{results['seed']}; {results['allocation_draws']} allocation draws, {results['cosine_draws']} cosine "
             f"draws per cell; mean [95% CI]; low = mean over the {results['low_fraction']:.0%} lowest-p prompts"]
    for ck in results["checkpoints"]:
        q = ck["p_quantiles"]
        lines += ["", f"### step {ck['step']} (p quantiles 5/10/50/90%: "
                      f"{q['0.05']:.3f} / {q['0.1']:.3f} / {q['0.5']:.3f} / {q['0.9']:.3f})", "",
                  "| N_bar | method | true min | true CV | true low | logged low: plug-in (old) | logged low: "
                  "posterior (new) | sampled cos |", "|---|---|---|---|---|---|---|---|"]
        for n_bar, cell in ck["allocation"].items():
            cos = ck.get("cosine", {}).get(n_bar, {}).get("methods", {})
            for m, st in cell["methods"].items():
                plugin = _fmt(st["plugin_low"]) if "plugin_low" in st else "-"
                est = _fmt(st["est_low"]) if "est_low" in st else "-"
                c = _fmt(cos[m]) if m in cos else "-"
                lines.append(f"| {n_bar} | {m} | {_fmt(st['true_min'])} | {_fmt(st['true_cv'])} | "
                             f"{_fmt(st['true_low'])} | {plugin} | {est} | {c} |")
        lines += ["", "paired differences (a - b, per draw):", "",
                  "| N_bar | a - b | true min | true CV | true low | sampled cos |", "|---|---|---|---|---|---|"]
        for n_bar, cell in ck["allocation"].items():
            cos = ck.get("cosine", {}).get(n_bar, {}).get("paired", {})
            for pair, st in cell["paired"].items():
                c = _fmt(cos[pair], 4) if pair in cos else "-"
                lines.append(f"| {n_bar} | {pair} | {_fmt(st['true_min'])} | {_fmt(st['true_cv'])} | "
                             f"{_fmt(st['true_low'])} | {c} |")
    return "\n".join(lines)


ALLOCATION_DRAWS = flags.DEFINE_integer("allocation_draws", 200,
                                       "independent estimates per (checkpoint, budget, method)")
COSINE_DRAWS = flags.DEFINE_integer("cosine_draws", 32, "sampled estimates per (checkpoint, budget, method)")


def _run_from_flags(config: ml_collections.ConfigDict, workdir: str, *, stop_after: int | None = None) -> None:
    if stop_after is not None:
        raise app.UsageError("--stop_after: this study has no optimizer steps of its own to stop after")
    run(config, workdir, allocation_draws=ALLOCATION_DRAWS.value, cosine_draws=COSINE_DRAWS.value)


flags.adopt_module_key_flags(cli)
main = cli.make_main(_run_from_flags, multihost=False)

if __name__ == "__main__":
    cli.run_main(main)
