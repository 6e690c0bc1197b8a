"""Gradient-alignment analysis of one checkpoint (docs/method.md §7, §8A).

On a fixed analysis set of P images (BatchNorm in inference mode, so examples are independent):

* the exact likelihood gradient ``G* = (1/P) sum_i grad log p_i`` (the negated cross-entropy gradient);
* for every estimator, average budget ``N_bar`` (``P N_bar`` rollouts) and method (``methods.METHODS``: the registry's
  allocators of ``analysis.allocators`` on the oracle p, each with its own loss weights
  (``config.ALLOCATOR_CORRECTION``), and SERA's variants ``sera_pilot``, p estimated from pilot rollouts inside
  the budget, and ``sera_no_correction``): cosine similarity and relative L2 error to ``G*`` of the expected
  estimator gradient and of M sampled estimates (mean and 95% CI over draws), and the dispersion of the
  per-prompt effective scale factors over the prompts with rollouts (a prompt without any weighs 0:
  ``E.scale_factors``). The draws use common random numbers: in draw m, rollout j of prompt i is the same label
  for every method (and ``sera_pilot``'s pilot is each prompt's rollouts 0..n0-1), so methods
  differ only where their counts and loss weights do;
* the published peers that decide which sampled rollouts train or sample online (``methods.decides_after_sampling``:
  ``dapo``, ``pods``, ``reinforce_ada``, ``dars_et``), from the core functions (``sera_jax.core.keep``,
  ``sera_jax.core.dars``) on the same draws (common random numbers: a prompt's rollouts are its ranks 0..N_i-1
  whatever decides N_i; ``dapo`` and ``pods`` train on subsets of uniform's rollouts, ``dars_et``'s pilot is
  ``sera_pilot``'s), each with its published loss, the plain mean over the rollouts it keeps. Their sampled
  cosine and error as above, in their own draw program (``draws.online_draw_cotangents``; the other methods' program
  is unchanged, and so are their numbers). A draw in which nothing trains (DAPO's or DARS's ``P_kept = 0``)
  gives the zero update, which is what the trainer then does (no step): it counts as cosine 0 and relative
  error 1, and ``draws_without_update`` counts such draws. Only ``dapo`` has a closed-form expectation
  (``E.dapo_expected_cotangent``; for maxrl, grpo and rloo its sampled estimate is uniform's times ``P / P_kept``,
  so its sampled cosine is uniform's draw by draw, its expected one is not quite); the others' expected
  statistics and scale factors are NaN;
* per-prompt gradient norms against p (cross-entropy, uniform MaxRL, SERA) from per-example gradients;
* the effective-weight profile of every method (``weight_profiles.py``): its weight on prompt i relative to the exact
  likelihood objective's, ``s_eff_i`` (``E g = (1/P) sum_i s_eff_i grad log p_i``; the exact objective has
  ``s_eff_i = 1``), averaged over the prompts of fixed bins of p (``WEIGHT_EDGES``): from the closed form
  (``expected``: mean, 10th and 90th percentile over the bin's prompts) where there is one, and for every method
  from the sampled draws (``sampled``: mean and Monte Carlo standard error), each draw's cotangent projected on
  the exact direction prompt by prompt (``E.projected_scales``). One more profile, sampled only:
  ``sera_pilot_no_correction``, SERA's pilot allocation under the batch-mean loss (the maze's uncorrected SERA
  allocates from a pilot), from ``sera_pilot``'s own draws: the loss weight ``1/B`` instead of ``1/(P N_i)``
  multiplies each prompt's cotangent, and so its projection, by ``N_i / N_bar``.

Every gradient is one VJP of the logits, ``g = J^T c``, with a (P, K) cotangent from ``estimators.py``. A
chunk of M cotangents shares one forward pass (``jax.vjp``) and vmaps the backward pass; the chunk's Gram
matrix and its dot products with ``G*`` give every metric, so no gradient leaves the device.

Expected gradients: analytic from the scale factors for the fixed allocations (one closed form for any counts
and either loss, so every oracle allocator has one; a prompt without rollouts, ``N_i = 0``, contributes 0); for
``sera_pilot`` the allocation depends on the pilot outcomes, so its expectation is a Rao-Blackwellised Monte Carlo
average over pilot outcomes, computed as two independent halves a and b: ``<g_a, g_b>`` is an unbiased estimate of
``|E g|^2`` (the plain ``|mean|^2`` would be inflated by the Monte Carlo noise), so the cosine is taken with its
square root (``cosines.split_half_alignment``). Each expectation is tested against the mean of the draws
(tests/experiments/test_imagenet_alignment.py).

An expected cosine can be negative although every weight ``s_eff_i`` is >= 0: ``<E g, G*> = (1/P) sum_i s_eff_i
<grad log p_i, G*>``, and some prompts' gradients point against ``G*``. At a near-uniform initial classifier these
are the images of the classes it over-predicts (the higher p; ``G*`` pushes those classes down); an allocator
that gives them most rollouts and, uncorrected, weighs each image by its rollouts (DynaMO, Knapsack RL on the
tiny config's step 0: -0.62 and -0.51 at N_bar = 8) makes them dominate its expected update.

The modules, each depending only on those above it (tests/experiments/test_imagenet_alignment_methods.py checks
there is no circle):

* ``methods.py``: the methods compared, and what each one is, asked of the allocator registry;
* ``gradients.py``: the model side (forward pass, the exact cotangent, chunk gradients reduced to a Gram matrix);
* ``cosines.py``: cosine and relative error from a Gram matrix, and the split-half estimate;
* ``weight_profiles.py``: the effective weights per bin of p;
* ``allocations.py``: each budget's allocations and the closed form of fixed counts;
* ``draws.py``: the sampled draws (common random numbers), for the count methods and the online ones;
* ``programs.py``: all of these jitted once, with their shardings (``compiled``);
* ``settings.py``: the static knobs (``AnalysisSettings``);
* ``budgets.py``: one budget of one estimator, from allocations to alignment statistics;
* this module: one checkpoint, every estimator and budget, as the JSON-ready dict results.json stores.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.budgets import expected_alignment, prepare_budget, sampled_alignment
from experiments.imagenet_alignment.cosines import cosine_and_error
from experiments.imagenet_alignment.methods import (PILOT_NO_CORRECTION, SERA_PILOT, analysed_methods, method_loss,
                                                    shares_uniform_rollouts)
from experiments.imagenet_alignment.programs import Compiled, compiled
from experiments.imagenet_alignment.settings import AnalysisSettings
from experiments.imagenet_alignment.weight_profiles import (profile_bins, sampled_weight_profile,
                                                            uncorrected_projection, weight_profile)
from sera_jax.report import stats as seed_stats
from sera_jax.train import sharding as sh

Array = jnp.ndarray

P_QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
P_HIST_BINS = 20
# Statistics only the online methods have, one value per budget: draws in which nothing trains (no kept rollout:
# DAPO's or DARS's P_kept = 0), whose estimate is the zero vector, the update the trainer takes then (none);
# they count as cosine 0 and relative error 1 in the sampled statistics. The mean fraction of the B rollouts that
# train, and (reinforce_ada) the mean number of sampling rounds.
ONLINE_STATISTICS = ("draws_without_update", "trained_fraction_mean", "sampling_rounds_mean")
# ``scale_*``: the dispersion of the effective scales ``s_eff`` over the prompts the method gives rollouts
# (``scale_statistics``); a prompt without rollouts weighs 0 (``E.scale_factors``) and is left out of them, and
# ``active_frac`` is the fraction of prompts with rollouts.
STATISTICS = ("cos_expected", "rel_err_expected", "expected_mc_noise", "cos_sampled_mean", "cos_sampled_ci95",
              "rel_err_mean", "rel_err_ci95", "scale_min", "scale_max", "scale_mean", "scale_cv")


def scale_statistics(s_eff_P, counts_P) -> dict[str, float]:
    """min, max, mean and CV of a method's effective scales over the prompts it gives rollouts (``counts_P > 0``;
    a pilot's or an online method's mean counts over draws), NaN when it gives none any (``E.scale_statistics``)."""
    stats = E.scale_statistics(jnp.asarray(s_eff_P, jnp.float32), jnp.asarray(counts_P))
    return {k: float(v) for k, v in stats.items()}


def _sampled_counts(b, method: str):
    """The rollouts per prompt ``method`` samples at budget ``b``: its own (a pilot's or an online method's mean
    over the draws), its allocation's (``sera_no_correction``: sera's), or uniform's for a method that trains on a
    subset of uniform's rollouts (dapo, pods); None if unknown."""
    for name in (method, method_loss(method)[0]):
        if name in b.counts:
            return b.counts[name]
    return b.counts["uniform"] if shares_uniform_rollouts(method) else None


def _histogram(p: np.ndarray) -> dict[str, list]:
    counts, edges = np.histogram(p, bins=P_HIST_BINS, range=(0.0, 1.0))
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def analyse_checkpoint(
    settings: AnalysisSettings,
    graphdef,
    params,
    batch_stats,
    x_PxHxWxC: np.ndarray,
    labels_P: np.ndarray,
    mesh: Mesh,
    key: Array,
    *,
    data_axes: tuple[str, ...] = sh.DATA_AXES,
) -> dict[str, Any]:
    """Every alignment statistic of one checkpoint on the analysis set (a JSON-ready dict)."""
    num_prompts = len(labels_P)
    shards = sh.num_batch_shards(mesh, data_axes)
    for name, value in (("analysis.num_prompts", num_prompts), ("analysis.norm_examples", settings.norm_examples),
                        ("analysis.microbatch", settings.microbatch or num_prompts)):
        if value % shards:
            raise ValueError(f"{name}={value} must be a multiple of the {shards} data shards of the mesh")
    if settings.draw_chunk < 2:
        raise ValueError(f"analysis.draw_chunk={settings.draw_chunk} must be >= 2 (the two pilot halves share a chunk)")
    microbatches = num_prompts // settings.microbatch if settings.microbatch else 1
    if settings.pilot_draws < 2:
        raise ValueError(f"analysis.pilot_expectation_draws={settings.pilot_draws} must be >= 2 (two halves)")
    fns = compiled(graphdef, mesh, tuple(data_axes), settings.draw_chunk, microbatches, settings.fast_compile)
    params, batch_stats = jax.device_put((params, batch_stats), fns.replicated)
    batch = sh.shard_batch({"x": x_PxHxWxC, "y": np.asarray(labels_P, np.int32)}, mesh, data_axes)
    x, labels = batch["x"], batch["y"]
    probs_PxK, p_P, predicted_P, exact_block = fns.forward(params, batch_stats, x, labels)

    # G* itself: the exact cotangent is row 0 of a zero chunk (the target is irrelevant for this call).
    grads_M, _, _, _ = fns.chunk_grads(params, batch_stats, x, exact_block, params)
    exact_grad = jax.tree.map(lambda g: g[0], grads_M)

    def align(block_MxPxK):
        """(cos_M, err_M, Gram, dots, |G*|^2) of one chunk of M cotangents against G*."""
        _, gram, dots, target_sq = fns.chunk_grads(params, batch_stats, x,
                                                   jax.device_put(block_MxPxK, fns.chunk_rows), exact_grad)
        gram, dots, target_sq = (np.asarray(v, np.float64) for v in jax.device_get((gram, dots, target_sq)))
        return cosine_and_error(gram, dots, float(target_sq)) + (gram, dots, float(target_sq))

    p_host = np.asarray(jax.device_get(p_P), np.float64)
    result: dict[str, Any] = {
        "num_prompts": num_prompts,
        "p_quantiles": {str(q): float(v) for q, v in zip(P_QUANTILES, np.quantile(p_host, P_QUANTILES))},
        "p_histogram": _histogram(p_host),
        "p": p_host.tolist(),
        "mean_p": float(np.mean(p_host)),
        "accuracy": float(np.mean(np.asarray(jax.device_get(predicted_P)) == np.asarray(labels_P))),
        "budgets": list(settings.budgets),
        "estimators": {},
    }
    norm_inputs = []
    for e_index, estimator in enumerate(settings.estimators):
        methods, allocation, inputs, profiles = _analyse_estimator(
            settings, fns, estimator, jax.random.fold_in(key, e_index), probs_PxK, labels, p_P, align)
        result["estimators"][estimator] = {"methods": methods, "allocation": allocation,
                                           "weight_profile": {**profile_bins(p_host), "budgets": profiles}}
        norm_inputs.append(inputs)
    primary = settings.estimators[0]
    result["estimator"] = primary
    result["methods"] = result["estimators"][primary]["methods"]
    result["allocation"] = result["estimators"][primary]["allocation"]
    result["grad_norms"] = _gradient_norms(settings, fns, params, batch_stats, x, p_host, norm_inputs[0], primary)
    result["exact_grad_norm"] = math.sqrt(align(exact_block)[4])
    return result


def _analyse_estimator(settings: AnalysisSettings, fns: Compiled, estimator: str, key: Array, probs_PxK, labels,
                       p_P, align):
    """({method: {statistic: one value per budget}}, {N_bar: {allocation: counts_P}}, inputs of the norm figure,
    {N_bar: {method: its weight profiles}}: ``expected`` (``weight_profile`` of ``s_eff``) where a closed form
    exists, ``sampled`` (``sampled_weight_profile`` of the draws' projected scales) for every method and for
    ``PILOT_NO_CORRECTION``."""
    methods = analysed_methods(settings.allocators, estimator)
    per_method = {m: {k: [] for k in STATISTICS} for m in methods}
    allocation: dict[str, dict[str, list]] = {}
    profiles: dict[str, dict[str, dict]] = {}
    p_host = np.asarray(jax.device_get(p_P), np.float64)
    num_prompts = len(p_host)
    norm_inputs = None
    for b_index, n_bar in enumerate(settings.budgets):
        key_b = jax.random.fold_in(key, b_index)
        b = prepare_budget(settings, fns, estimator, n_bar, key_b, probs_PxK, labels, p_P)
        expected = expected_alignment(fns, b, align)
        sampled, first, trained, projected = sampled_alignment(settings, fns, b, probs_PxK, labels, align)
        if SERA_PILOT in projected:
            projected[PILOT_NO_CORRECTION] = uncorrected_projection(
                projected[SERA_PILOT], np.asarray(jax.device_get(b.pilot_counts))[:settings.num_draws], n_bar)
        profiles[str(n_bar)] = {
            m: ({"expected": weight_profile(p_host, np.asarray(jax.device_get(b.s_eff[m]), np.float64))}
                if m in b.s_eff else {}) | {"sampled": sampled_weight_profile(p_host, projected[m])}
            for m in methods + ((PILOT_NO_CORRECTION,) if PILOT_NO_CORRECTION in projected else ())}
        for m in methods:
            stats = per_method[m]
            # No closed form (reinforce_ada, pods, dars_et): NaN, as is every scale statistic without s_eff.
            for name, value in zip(("cos_expected", "rel_err_expected", "expected_mc_noise"),
                                   expected.get(m, (math.nan,) * 3)):
                stats[name].append(value)
            for name, values in zip(("cos_sampled", "rel_err"), sampled[m]):
                mean, (lo, hi) = seed_stats.mean_and_interval95(values)  # R >= 2 draws (validated)
                stats[f"{name}_mean"].append(float(mean))
                stats[f"{name}_ci95"].append([float(lo), float(hi)])
            counts = _sampled_counts(b, m)
            # Over the prompts with rollouts (the released SERA's skipped ones weigh 0 and are left out).
            scale_stats = (scale_statistics(b.s_eff[m], np.ones(num_prompts) if counts is None else counts)
                           if m in b.s_eff else dict.fromkeys(("min", "max", "mean", "cv"), math.nan))
            for k in ("min", "max", "mean", "cv"):
                stats[f"scale_{k}"].append(float(scale_stats[k]))
            # Prompts sampled at all (the released SERA gives hopeless ones none; mean over draws for a pilot).
            active = math.nan if counts is None else float(np.mean(np.asarray(counts) > 0))
            stats.setdefault("active_frac", []).append(active)
            if m in trained:
                for name, value in zip(ONLINE_STATISTICS, (
                        int(np.sum(trained[m] == 0)), float(np.mean(trained[m]) / b.budget),
                        float(np.mean(b.sampling_rounds[m][:settings.num_draws])))):
                    stats.setdefault(name, []).append(value)
        allocation[str(n_bar)] = {m: np.asarray(c, np.float64).tolist() for m, c in b.counts.items()}
        if n_bar == settings.norm_budget:
            norm_inputs = {
                # One draw of each prompt's own estimate (1/N_i) sum_j A_ij grad log pi = P c_i (corrected).
                "cotangents": num_prompts * jnp.stack([E.exact_cotangent(probs_PxK, labels), first["uniform"],
                                                       first.get("sera", first["uniform"])], axis=1),
                # s(p_i, N_i), 0 for an image without rollouts (the released SERA's skipped ones).
                "scales": {m: np.asarray(E.scale_factors(p_P, c, estimator=estimator, max_n=max(int(c.max()), 1)))
                           for m, c in ((m, np.asarray(b.counts[m])) for m in ("uniform", "sera") if m in b.counts)},
                "counts": np.asarray(b.counts.get("sera", b.counts["uniform"])),
            }
    return per_method, allocation, norm_inputs, profiles


def _gradient_norms(settings: AnalysisSettings, fns: Compiled, params, batch_stats, x, p_host, inputs,
                    estimator: str) -> dict[str, Any]:
    """Per-prompt gradient norms against p at ``norm_budget`` (MaxRL's gradient-norm figure, extended).

    ``ce``: ``|grad log p_i|``; ``*_expected``: ``s(p_i, N_i) |grad log p_i|`` (0 without rollouts), the norm of
    the prompt's expected estimate; ``*_sampled``: the norm of one draw of the prompt's own estimate
    ``(1/N_i) sum_j A_ij grad log pi(y_ij|x_i)`` (``= P c_i`` with the correction).
    """
    n = settings.norm_examples
    x_n, cots_n = jax.device_put((x[:n], inputs["cotangents"][:n]), fns.norms_rows)
    norms_Px3 = np.asarray(jax.device_get(fns.norms(params, batch_stats, x_n, cots_n)), np.float64)
    s_uniform = np.asarray(inputs["scales"]["uniform"], np.float64)[:n]
    s_sera = np.asarray(inputs["scales"].get("sera", inputs["scales"]["uniform"]), np.float64)[:n]
    return {
        "budget": settings.norm_budget,
        "estimator": estimator,
        "p": p_host[:n].tolist(),
        "counts_sera": np.asarray(inputs["counts"])[:n].tolist(),
        "ce": norms_Px3[:, 0].tolist(),
        "uniform_expected": (s_uniform * norms_Px3[:, 0]).tolist(),
        "sera_expected": (s_sera * norms_Px3[:, 0]).tolist(),
        "uniform_sampled": norms_Px3[:, 1].tolist(),
        "sera_sampled": norms_Px3[:, 2].tolist(),
    }
