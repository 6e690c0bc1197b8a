"""Gradient-alignment analysis of one checkpoint (docs/method.md §7, §8A).

On a fixed analysis set of P images (BatchNorm in inference mode, so examples are independent):

* the exact likelihood gradient ``G* = (1/P) sum_i grad log p_i`` (the negated cross-entropy gradient);
* for every estimator, average budget ``N_bar`` (``P N_bar`` rollouts) and method (``METHODS``: the registry's
  allocators of ``analysis.allocators`` on the oracle p, each with its own loss weights
  (``config.ALLOCATOR_CORRECTION``), and SERA's variants ``sera_pilot``, p estimated from pilot rollouts inside
  the budget, and ``sera_no_correction``): cosine similarity and relative L2 error to ``G*`` of the expected
  estimator gradient and of M sampled estimates (mean and 95% CI over draws), and the dispersion of the
  per-prompt effective scale factors. The draws use common random numbers: in draw m, rollout j of prompt i is
  the same label for every method (and ``sera_pilot``'s pilot is each prompt's rollouts 0..n0-1), so methods
  differ only where their counts and loss weights do;
* the published peers that decide which sampled rollouts train or sample online (``config.ONLINE_METHODS``:
  ``dapo``, ``pods``, ``reinforce_ada``, ``dars_et``), from the core functions (``sera_jax.core.keep``,
  ``sera_jax.core.dars``) on the same draws (common random numbers: a prompt's rollouts are its ranks 0..N_i-1
  whatever decides N_i; ``dapo`` and ``pods`` train on subsets of uniform's rollouts, ``dars_et``'s pilot is
  ``sera_pilot``'s), each with its published loss, the plain mean over the rollouts it keeps. Their sampled
  cosine and error as above, in their own draw program (``online_draw_cotangents``; the other methods' program
  is unchanged, and so are their numbers). A draw in which nothing trains (DAPO's or DARS's ``P_kept = 0``)
  gives the zero update, which is what the trainer then does (no step): it counts as cosine 0 and relative
  error 1, and ``draws_without_update`` counts such draws. Only ``dapo`` has a closed-form expectation
  (``E.dapo_expected_cotangent``; for maxrl, grpo and rloo its sampled estimate is uniform's times ``P / P_kept``,
  so its sampled cosine is uniform's draw by draw, its expected one is not quite); the others' expected
  statistics and scale factors are NaN;
* per-prompt gradient norms against p (cross-entropy, uniform MaxRL, SERA) from per-example gradients;
* the effective-weight profile of every method (``weight_profile``): its weight on prompt i relative to the exact
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
and either loss, so every oracle allocator has one); for ``sera_pilot`` the
allocation depends on the pilot outcomes, so its expectation is a Rao-Blackwellised Monte Carlo average over
pilot outcomes, computed as two independent halves a and b: ``<g_a, g_b>`` is an unbiased estimate of
``|E g|^2`` (the plain ``|mean|^2`` would be inflated by the Monte Carlo noise), so
``cos = <(g_a + g_b)/2, G*> / (|G*| sqrt(<g_a, g_b>))`` is a consistent estimate with a small bias.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.config import ALLOCATOR_CORRECTION, ONLINE_METHODS, allocator_defined
from experiments.imagenet_alignment.model import FAST_COMPILE, logits_fn
from sera_jax import core
from sera_jax.report import stats as seed_stats
from sera_jax.train import sharding as sh

Array = jnp.ndarray
P_QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
P_HIST_BINS = 20
# Bins of p for the effective-weight profiles (``weight_profile``). Finer where p is small: MaxRL's factor
# s(p, N) = 1 - (1-p)^(N-1) moves fastest there, and that is where the allocators move rollouts to. At N = 4, s is
# 0.14, 0.27, 0.49, 0.66, 0.88 and 0.97 at the edges 0.05 ... 0.7, so each bin below 0.7 spans a similar step of s
# (and the cpu config's step-40 checkpoint puts 7, 17, 45, 53, 69, 50 of its 256 images in them); above 0.7 s is
# within 3% of 1 at every N_bar >= 4, and 0.9 separates a converged checkpoint's bulk (step 300) from its tail.
WEIGHT_EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
# Every method the analysis can compare, in its order: the baseline, SERA and its two variants, the registry's
# other allocators, then the online / train-mask peers (config.ONLINE_METHODS). ``sera_pilot``'s counts come from
# each draw's pilot, ``reinforce_ada``'s from each draw's rounds and ``dars_et``'s from each draw's pilot; the
# others' from the oracle p (``dapo`` and ``pods``: uniform's).
SERA_VARIANTS = ("sera_pilot", "sera_no_correction")
# A weight profile without the other statistics (module docstring): sera_pilot's draws under the batch-mean loss.
PILOT_NO_CORRECTION = "sera_pilot_no_correction"
METHODS = ("uniform", "sera") + SERA_VARIANTS + tuple(a for a in ALLOCATOR_CORRECTION
                                                     if a not in ("uniform", "sera")) + ONLINE_METHODS
# Statistics only the online methods have, one value per budget: draws in which nothing trains (no kept rollout:
# DAPO's or DARS's P_kept = 0), whose estimate is the zero vector, the update the trainer takes then (none);
# they count as cosine 0 and relative error 1 in the sampled statistics. The mean fraction of the B rollouts that
# train, and (reinforce_ada) the mean number of sampling rounds.
ONLINE_STATISTICS = ("draws_without_update", "trained_fraction_mean", "sampling_rounds_mean")


def analysed_methods(allocators: tuple[str, ...], estimator: str) -> tuple[str, ...]:
    """The methods analysed for ``estimator``: those of ``allocators`` defined for it (the registry's
    ``check_estimator``), with SERA's variants when ``sera`` is one of them, in ``METHODS`` order."""
    chosen = {a for a in allocators if allocator_defined(a, estimator)}
    if "sera" in chosen:
        chosen.update(SERA_VARIANTS)
    return tuple(m for m in METHODS if m in chosen)


def method_loss(method: str) -> tuple[str, bool]:
    """(the allocation a method's counts come from, whether its loss is multiplicity-corrected)."""
    if method == "sera_no_correction":
        return "sera", False
    if method == "sera_pilot":
        return "sera_pilot", True
    if method in ONLINE_METHODS:  # the plain mean over the rollouts it keeps
        return method, False
    return method, ALLOCATOR_CORRECTION[method]


# ------------------------------------------------------------------------------------ model functions


def _interleave(x: Array, microbatches: int) -> Array:
    """``(P, ...) -> (P / u, u, ...)`` with u = ``microbatches``: microbatch m holds rows ``j u + m``.

    With P split into contiguous per-device blocks, each of d devices keeps ``1/d`` of every microbatch, so the
    reshape moves no data and each microbatch is balanced across devices.
    """
    return x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])


def forward_stats(graphdef, params, batch_stats, x_PxHxWxC: Array, labels_P: Array, *, microbatches: int,
                  chunk: int):
    """Inference-mode ``probs_PxK``, ``p_P``, predicted classes, and a chunk whose row 0 is the exact cotangent."""
    x = _interleave(x_PxHxWxC, microbatches)

    def one(m):
        return jax.nn.softmax(logits_fn(graphdef, params, batch_stats, x[:, m]), axis=-1)

    probs_by_microbatch = jax.lax.map(one, jnp.arange(microbatches))  # (microbatches, P / microbatches, K)
    probs_PxK = jnp.swapaxes(probs_by_microbatch, 0, 1).reshape(x_PxHxWxC.shape[0], -1)
    exact_MxPxK = jnp.zeros((chunk,) + probs_PxK.shape, probs_PxK.dtype).at[0].set(
        E.exact_cotangent(probs_PxK, labels_P))
    return probs_PxK, E.success_probabilities(probs_PxK, labels_P), jnp.argmax(probs_PxK, axis=1), exact_MxPxK


def vjp_gradients(graphdef, params, batch_stats, x_PxHxWxC: Array, cot_MxPxK: Array, *, microbatches: int):
    """``g_m = J^T cot_m`` for each of the M cotangents: a params pytree with a leading axis M.

    Per microbatch: one forward (``jax.vjp``), M backward passes (``vmap`` of the VJP function); gradients
    are linear in the cotangent, so the microbatches' gradients add up.
    """
    x = _interleave(x_PxHxWxC, microbatches)
    # (P / microbatches, M, microbatches, K)
    cot_by_microbatch = jnp.swapaxes(_interleave(jnp.swapaxes(cot_MxPxK, 0, 1), microbatches), 1, 2)

    def grads_of(m):
        _, vjp_fn = jax.vjp(lambda p: logits_fn(graphdef, p, batch_stats, x[:, m]), params)
        return jax.vmap(lambda c: vjp_fn(c)[0])(jnp.swapaxes(cot_by_microbatch[:, :, m], 0, 1))

    if microbatches == 1:
        return grads_of(0)

    def body(acc, m):
        return jax.tree.map(jnp.add, acc, grads_of(m)), None

    zeros = jax.tree.map(lambda p: jnp.zeros((cot_MxPxK.shape[0],) + p.shape, p.dtype), params)
    return jax.lax.scan(body, zeros, jnp.arange(microbatches))[0]


def gram_and_dots(grads_M, target) -> tuple[Array, Array, Array]:
    """``(<g_c, g_d>)_{cd}``, ``(<g_c, target>)_c`` and ``|target|^2``, summed over the pytree's leaves."""
    flat_M = jnp.concatenate([g.reshape(g.shape[0], -1) for g in jax.tree.leaves(grads_M)], axis=1)
    flat_t = jnp.concatenate([t.reshape(-1) for t in jax.tree.leaves(target)])
    dot = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)  # no TF32 on GPUs
    return dot(flat_M, flat_M.T), dot(flat_M, flat_t), dot(flat_t, flat_t)


def chunk_gradients(graphdef, params, batch_stats, x_PxHxWxC, cot_MxPxK, target, *, microbatches: int):
    """(grads_M, Gram matrix M x M, dots with ``target`` (M,), ``|target|^2``) of one chunk of M cotangents."""
    grads_M = vjp_gradients(graphdef, params, batch_stats, x_PxHxWxC, cot_MxPxK, microbatches=microbatches)
    return (grads_M,) + gram_and_dots(grads_M, target)


def per_example_grad_norms(graphdef, params, batch_stats, x_PxHxWxC: Array, cot_PxcxK: Array) -> Array:
    """``|J_i^T cot_ij|`` for every example (prompt) i and each of its c cotangents (P x c), by per-example VJPs.

    Written for one example and vmapped (the per-example-gradient route).
    """

    def one(x_HxWxC, cot_cxK):
        _, vjp_fn = jax.vjp(lambda p: logits_fn(graphdef, p, batch_stats, x_HxWxC[None])[0], params)
        grads_c = jax.vmap(lambda c: vjp_fn(c)[0])(cot_cxK)
        return jax.vmap(core.tree_norm)(grads_c)

    return jax.lax.map(lambda args: one(*args), (x_PxHxWxC, cot_PxcxK), batch_size=16)


# ------------------------------------------------------------------------------------ sampling programs
#
# One compiled program per estimator serves every budget: the rollout layout has the static length
# B = P * max(N_bar) rows and a traced budget <= B (see estimators.flat_layout). Only the allocations, whose
# budget is static in sera_jax.core, are compiled per budget, and they are small.


def expected_fixed(probs_PxK, labels_P, counts_AxP, corrections_A, *, estimator: str, max_n: int
                   ) -> tuple[Array, Array]:
    """Analytic expected cotangents (A x P x K) and effective scales (A x P) of A fixed allocations, row a with
    counts ``counts_AxP[a]`` and the loss ``corrections_A[a]`` (corrected or not): one vmapped closed form, the
    same for every allocator."""
    exp = functools.partial(E.expected_cotangent, probs_PxK, labels_P, estimator=estimator, max_n=max_n)
    return jax.vmap(lambda counts_P, corrected: exp(counts_P, correction=corrected))(counts_AxP, corrections_A)


def pilot_draws(keys_M, key_outcomes, probs_PxK, labels_P, *, n0: int, num_outcomes: int):
    """Pilot successes of the M sampled estimates (M x P) and Y = ``num_outcomes`` independent pilot outcomes
    for the Rao-Blackwellised expectation (Y x P).

    Draw m's pilot is rollouts 0..n0-1 of each prompt drawn with ``keys_M[m]``, the key ``draw_cotangents``
    samples draw m with: its pilot is that draw's first n0 rollouts, the ones every method of the draw shares."""
    successes_MxP = jax.vmap(lambda k: E.sample_pilot(k, probs_PxK, labels_P, n0)[1])(keys_M)
    k0_YxP = E.pilot_successes(key_outcomes, E.success_probabilities(probs_PxK, labels_P), n0, num_outcomes)
    return successes_MxP, k0_YxP


def allocations(p_P, successes_MxP, *, budget: int, n_min: int, n_max: int, n0: int, estimator: str,
                allocators: tuple[str, ...], replicated: NamedSharding | None = None):
    """Every allocator's counts with the oracle p ({name: counts_P}, ``core.get_allocator(name).counts``) and
    SERA's after each of M pilots (M x P; None when ``successes_MxP`` is None): the per-budget program.

    Estimators without a power-law factor (grpo) allocate from a P x n_max x n_max table each, so their
    pilots are allocated a few at a time (lax.map) rather than all at once. The inputs are first replicated
    (``replicated``): partitioned over P, DynaMO's data-dependent ``while_loop`` puts collectives inside the
    loop, and on several CPU devices overlapping runs of such a program deadlocked (the 8-device test suite).
    """
    if replicated is not None:
        p_P, successes_MxP = jax.lax.with_sharding_constraint((p_P, successes_MxP), replicated)
    oracle = {name: core.get_allocator(name).counts(p_P, budget, n_min=n_min, n_max=n_max, estimator=estimator,
                                                    check=False) for name in allocators}
    if successes_MxP is None:
        return oracle, None
    batch = 64 if core.get_estimator(estimator).power_offset is not None else 2
    pilot_MxP = jax.lax.map(
        lambda s: E.pilot_counts(s, n0, budget, n_min=n_min, n_max=n_max, estimator=estimator), successes_MxP,
        batch_size=min(batch, successes_MxP.shape[0]))
    return oracle, pilot_MxP


def draw_cotangents(keys_M, probs_PxK, labels_P, counts_AxP, corrections_A, pilot_counts_MxP, budget, *,
                    estimator: str, length: int, methods: tuple[str, ...]):
    """M independent draws of every method's sampled-estimator cotangent: {method: (M, P, K)}.

    Method a (``methods[a]``) samples ``counts_AxP[a]`` rollouts per prompt and weighs them with the loss
    ``corrections_A[a]``; ``sera_pilot``'s row is replaced by each draw's own pilot allocation
    (``pilot_counts_MxP[m]``). All methods go through one vmapped sample-and-cotangent path (one copy of the code
    to compile, whatever the methods). Common random numbers: within draw m every method samples with
    ``keys_M[m]``, whose rollout j of prompt i is the same label for all of them (``E.sample_rollouts``), so
    methods differ only where their counts and loss weights do; ``sera_pilot``'s first n0 rollouts are its pilot
    (``pilot_draws`` with the same keys); ``sera`` and ``sera_no_correction`` share their rollouts.
    """
    pilot_row = methods.index("sera_pilot") if "sera_pilot" in methods else None

    def one_draw(key, pilot_counts_P):
        counts = counts_AxP.astype(jnp.int32)
        if pilot_row is not None:
            counts = counts.at[pilot_row].set(pilot_counts_P.astype(jnp.int32))

        def method(counts_P, corrected):
            sampled, ids = E.sample_rollouts(key, probs_PxK, counts_P, budget, length=length)
            return E.estimator_cotangent(probs_PxK, labels_P, sampled, ids, estimator=estimator, budget=budget,
                                         correction=corrected)

        cot_AxPxK = jax.vmap(method)(counts, corrections_A)
        return {name: cot_AxPxK[a] for a, name in enumerate(methods)}

    return jax.vmap(one_draw)(keys_M, pilot_counts_MxP)


def online_counts(keys_M, probs_PxK, labels_P, budget, *, length: int, n0: int, round_size: int, keep: int,
                  methods: tuple[str, ...], replicated: NamedSharding | None = None) -> dict[str, Array]:
    """What the online methods' counts are made from, for M draws at one (traced) budget: {``reinforce_ada``:
    (M, P) counts and ``reinforce_ada/rounds`` (M,), ``pilot_successes``: (M, P) for ``dars_et``}, for those of
    ``methods``; one program for every budget.

    Draw m's rollouts are those ``draw_cotangents`` samples with ``keys_M[m]`` (common random numbers):
    Reinforce-Ada's rounds read the successes of each prompt's ranks (``E.reinforce_ada_counts``), DARS's pilot
    is its ranks 0..n0-1, the ``sera_pilot`` pilot of the draw (its counts: ``E.dars_draw_counts``). The inputs
    are replicated first: Reinforce-Ada's phases run in a data-dependent (bounded) ``while_loop``, which must not
    hold collectives (partitioned over P, DynaMO's deadlocked on 8 CPU devices: see ``allocations``); the draws
    run one at a time (``lax.map``: each loop stops at its own last round)."""
    if replicated is not None:
        probs_PxK, labels_P = jax.lax.with_sharding_constraint((probs_PxK, labels_P), replicated)
    out = {}
    if "reinforce_ada" in methods:
        out["reinforce_ada"], out["reinforce_ada/rounds"] = jax.lax.map(
            lambda k: E.reinforce_ada_counts(k, probs_PxK, labels_P, budget, round_size=round_size, keep=keep,
                                             length=length), keys_M)
    if "dars_et" in methods:
        out["pilot_successes"] = jax.vmap(lambda k: E.sample_pilot(k, probs_PxK, labels_P, n0)[1])(keys_M)
    return out


def online_draw_cotangents(keys_M, probs_PxK, labels_P, counts_uniform_P, counts_MxAxP, budget, *, estimator: str,
                           length: int, methods: tuple[str, ...], keep: int):
    """M draws of every online method's cotangent ({method: (M, P, K)}) and its trained rollouts ({method: (M,)}).

    Method a (``methods[a]``) samples ``counts_MxAxP[m, a]`` rollouts in draw m (``dapo``, ``pods``: uniform's
    counts; ``reinforce_ada``, ``dars_et``: ``online_counts``), with ``keys_M[m]``, the key every method's draw m
    samples with (common random numbers: the same labels as uniform's and SERA's draws rank by rank; ``dapo`` and
    ``pods`` share uniform's rollouts, drawn once), then keeps, weighs and scores them as ``E.online_cotangent``.
    A program of its own, so that the other methods' draw program (``draw_cotangents``) is the one it always was.
    """
    def one_draw(key, counts_AxP):
        cots, trained = {}, {}
        shared = None
        if any(m in ("dapo", "pods") for m in methods):
            shared = E.sample_rollouts(key, probs_PxK, counts_uniform_P, budget, length=length)
        for a, m in enumerate(methods):
            cots[m], trained[m] = E.online_cotangent(
                m, key, probs_PxK, labels_P, counts_AxP[a], budget, estimator=estimator, keep=keep, length=length,
                sampled=shared if m in ("dapo", "pods") else None)
        return cots, trained

    return jax.vmap(one_draw)(keys_M, counts_MxAxP)


# ------------------------------------------------------------------------------------ the compiled set

@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted functions of one (model, mesh, analysis shape); built once per process by ``compiled``."""

    forward: Any
    chunk_grads: Any
    norms: Any
    expected_fixed: Any
    pilot_draws: Any
    allocations: Any
    pilot_expected: Any
    draws: Any
    online_counts: Any
    online_draws: Any
    dapo_expected: Any
    project: Any  # E.projected_scales: each draw's per-prompt weight estimates (the weight profiles)
    chunk: int
    rows: NamedSharding  # (P, ...) arrays: split over the data axes
    chunk_rows: NamedSharding  # (M, P, ...) arrays (a chunk of M cotangents): split along P
    replicated: NamedSharding
    norms_rows: NamedSharding  # inputs of the per-example route


@functools.lru_cache(maxsize=8)
def compiled(graphdef, mesh: Mesh, data_axes: tuple[str, ...], chunk: int, microbatches: int,
             fast_compile: bool = False) -> Compiled:
    """Jitted analysis functions with explicit shardings: images and cotangents split over the data axes
    along P, parameters replicated. Cached, so repeated runs in one process (tests) compile once."""
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = sh.batch_sharding(mesh, data_axes)
    chunk_rows = NamedSharding(mesh, PartitionSpec(None, rows.spec[0]))
    # On CPU, LLVM's optimisation of the many small kernels of the sampling programs costs far more compile
    # time than it saves at run time; ``fast_compile`` extends this to the model programs (tests, notebooks).
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    model_options = FAST_COMPILE if (fast_compile and on_cpu) else None
    small_options = FAST_COMPILE if on_cpu else None
    forward = jax.jit(functools.partial(forward_stats, graphdef, microbatches=microbatches, chunk=chunk),
                      in_shardings=(replicated, replicated, rows, rows),
                      out_shardings=(rows, rows, rows, chunk_rows), compiler_options=model_options)
    chunk_grads = jax.jit(functools.partial(chunk_gradients, graphdef, microbatches=microbatches),
                          in_shardings=(replicated, replicated, rows, chunk_rows, replicated),
                          out_shardings=replicated, compiler_options=model_options)
    # XLA:CPU with several (forced host) devices returns wrong per-example convolution weight gradients
    # when the vmapped examples are split across devices (also under shard_map; cf. jax-ml/jax#36886), while
    # the unsplit program is right: on CPU the per-example route runs replicated (it only feeds the figure).
    example_rows = replicated if (on_cpu and mesh.devices.size > 1) else rows
    norms = jax.jit(functools.partial(per_example_grad_norms, graphdef),
                    in_shardings=(replicated, replicated, example_rows, example_rows), out_shardings=example_rows,
                    compiler_options=model_options)

    def small(fn, static, options=small_options):
        # Replicated outputs: their consumers then always see the same input shardings (one compilation).
        return jax.jit(fn, static_argnames=static, compiler_options=options, out_shardings=replicated)

    # The online methods' programs compile once for every budget and then run sorts and rounds over the whole
    # layout: optimised they run 3-5x faster on CPU for ~20% more compile time, so they are only built with
    # LLVM's optimisations off with ``fast_compile`` (tests, notebooks).
    online_options = model_options

    return Compiled(
        forward=forward, chunk_grads=chunk_grads, norms=norms,
        expected_fixed=small(expected_fixed, ("estimator", "max_n")),
        pilot_draws=small(pilot_draws, ("n0", "num_outcomes")),
        allocations=small(functools.partial(allocations, replicated=replicated),
                          ("n0", "budget", "n_min", "n_max", "estimator", "allocators")),
        pilot_expected=small(E.pilot_expected_from_outcomes, ("n0", "estimator", "max_extra", "num_groups")),
        draws=jax.jit(draw_cotangents, static_argnames=("estimator", "length", "methods"),
                      out_shardings=chunk_rows, compiler_options=small_options),
        online_counts=small(functools.partial(online_counts, replicated=replicated),
                            ("length", "n0", "round_size", "keep", "methods"), online_options),
        online_draws=jax.jit(online_draw_cotangents, static_argnames=("estimator", "length", "methods", "keep"),
                             out_shardings=(chunk_rows, replicated), compiler_options=online_options),
        dapo_expected=small(E.dapo_expected_cotangent, ("estimator", "max_n", "dyadic_pieces")),
        project=small(E.projected_scales, ()),
        chunk=chunk, rows=rows, chunk_rows=chunk_rows, replicated=replicated, norms_rows=example_rows)


# ------------------------------------------------------------------------------------ metrics on the host


def cosine_and_error(gram_MxM: np.ndarray, dots_M: np.ndarray, target_sq: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``cos(g_c, G*)`` and ``|g_c - G*| / |G*|`` from the chunk's Gram matrix and dot products."""
    norms_sq = np.maximum(np.diag(gram_MxM), 0.0)
    cos = dots_M / np.maximum(np.sqrt(norms_sq * target_sq), 1e-30)
    err = np.sqrt(np.maximum(norms_sq - 2 * dots_M + target_sq, 0.0) / max(target_sq, 1e-30))
    return cos, err


def split_half_alignment(gram_2x2: np.ndarray, dots_2: np.ndarray, target_sq: float) -> tuple[float, float, float]:
    """Cosine and relative error of ``E g`` from two independent Monte Carlo halves a and b of it, and the
    relative Monte Carlo noise of their mean.

    ``<g_a, g_b>`` estimates ``|E g|^2`` without the noise term that ``|(g_a + g_b)/2|^2`` carries; the noise
    of the mean is ``|g_a - g_b| / 2`` relative to ``|E g|``. When the noise swamps the signal
    (``<g_a, g_b> <= 0``) the estimate is undefined: NaN.
    """
    g_aa, g_ab, g_bb = float(gram_2x2[0, 0]), float(gram_2x2[0, 1]), float(gram_2x2[1, 1])
    if g_ab <= 0:
        return math.nan, math.nan, math.inf
    mean_dot = 0.5 * (float(dots_2[0]) + float(dots_2[1]))
    cos = mean_dot / math.sqrt(g_ab * max(target_sq, 1e-30))
    err = math.sqrt(max(g_ab - 2 * mean_dot + target_sq, 0.0) / max(target_sq, 1e-30))
    noise = 0.5 * math.sqrt(max(g_aa - 2 * g_ab + g_bb, 0.0) / g_ab)
    return cos, err, noise


def _histogram(p: np.ndarray) -> dict[str, list]:
    counts, edges = np.histogram(p, bins=P_HIST_BINS, range=(0.0, 1.0))
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def bin_indices(p_P, edges=WEIGHT_EDGES) -> np.ndarray:
    """The bin of each prompt: b with ``edges[b] <= p < edges[b + 1]``, the last bin closed (p = 1 is in it)."""
    p = np.asarray(p_P, np.float64)
    return np.clip(np.searchsorted(np.asarray(edges, np.float64), p, side="right") - 1, 0, len(edges) - 2)


def _rounded(values) -> list[float]:
    """Six significant digits (NaN kept): the profiles are means of noisy or binned quantities, and results.json
    holds thousands of them."""
    return [float(f"{v:.6g}") for v in np.asarray(values, np.float64)]


def profile_bins(p_P, edges=WEIGHT_EDGES) -> dict[str, list]:
    """The bins of the weight profiles: their edges, the prompts in each and their mean p (NaN where empty)."""
    p = np.asarray(p_P, np.float64)
    b = bin_indices(p, edges)
    count = np.bincount(b, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_mean = np.bincount(b, weights=p, minlength=len(edges) - 1) / count
    return {"edges": [float(e) for e in edges], "count": count.tolist(), "p_mean": _rounded(p_mean)}


def weight_profile(p_P, s_eff_P, edges=WEIGHT_EDGES) -> dict[str, list[float]]:
    """A method's effective weights ``s_eff_i`` (relative to the exact objective's, 1) summarised per bin of p: the
    mean, 10th and 90th percentile over the bin's prompts (NaN for an empty bin)."""
    b = bin_indices(p_P, edges)
    s = np.asarray(s_eff_P, np.float64)
    out = {"mean": [], "q10": [], "q90": []}
    for k in range(len(edges) - 1):
        inside = s[b == k]
        stats = (np.mean(inside), *np.quantile(inside, (0.1, 0.9))) if inside.size else (math.nan,) * 3
        for name, value in zip(out, stats):
            out[name].append(value)
    return {name: _rounded(values) for name, values in out.items()}


def uncorrected_projection(x_MxP, counts_MxP, n_bar: int) -> np.ndarray:
    """The projected scales of corrected draws (loss weight ``1/(P N_i)``) under the batch-mean loss instead
    (``1/B``, B = P N_bar): the same rollouts, each prompt's cotangent times ``N_i / N_bar`` in its own draw."""
    return np.asarray(x_MxP, np.float64) * np.asarray(counts_MxP, np.float64) / n_bar


def sampled_weight_profile(p_P, x_MxP, edges=WEIGHT_EDGES) -> dict[str, Any]:
    """The weight profile estimated from M sampled draws of the projected scales ``x_mi`` (``E.projected_scales``,
    unbiased for ``s_eff_i``): per bin of p, the mean over the draws and the bin's prompts, and its Monte Carlo
    standard error ``sd_m(y_m) / sqrt(M)`` with ``y_m`` the bin's mean in draw m (the draws are independent; the
    prompts of one draw need not be: an online method's counts depend on every prompt's rewards). NaN for an
    empty bin; ``draws`` = M."""
    x = np.asarray(x_MxP, np.float64)
    b = bin_indices(p_P, edges)
    y_MxB = np.stack([x[:, b == k].mean(axis=1) if np.any(b == k) else np.full(x.shape[0], math.nan)
                      for k in range(len(edges) - 1)], axis=1)
    se = np.std(y_MxB, axis=0, ddof=1) / math.sqrt(x.shape[0])
    return {"mean": _rounded(y_MxB.mean(axis=0)), "se": _rounded(se), "draws": int(x.shape[0])}


# ------------------------------------------------------------------------------------ one checkpoint


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
    """The static knobs of the analysis (from ``config.analysis`` and ``config.sera``)."""

    budgets: tuple[int, ...]
    estimators: tuple[str, ...]
    num_draws: int
    draw_chunk: int
    microbatch: int
    pilot_draws: int
    norm_budget: int
    norm_examples: int
    n_min: int
    n_max_factor: int
    n_max_table: int
    n0: int
    fast_compile: bool = False
    allocators: tuple[str, ...] = tuple(ALLOCATOR_CORRECTION)  # analysis.allocators
    keep_per_prompt: int = 4  # analysis.keep_per_prompt: PODS's m, Reinforce-Ada's n
    round_size: int = 4  # analysis.round_size: Reinforce-Ada's M

    @classmethod
    def from_config(cls, config) -> AnalysisSettings:
        a, s = config.analysis, config.sera
        return cls(budgets=tuple(a.budgets), estimators=tuple(a.estimators), allocators=tuple(a.allocators),
                   num_draws=a.num_draws,
                   draw_chunk=a.draw_chunk, microbatch=a.microbatch, pilot_draws=a.pilot_expectation_draws,
                   norm_budget=a.norm_budget, norm_examples=a.norm_examples, n_min=s.n_min,
                   n_max_factor=s.n_max_factor, n_max_table=s.n_max_table, n0=s.pilot_rollouts,
                   fast_compile=config.fast_compile, keep_per_prompt=a.keep_per_prompt, round_size=a.round_size)

    def bounds(self, n_bar: int, estimator: str) -> tuple[int, int, int]:
        """(n_min, n_max, n0) at average budget ``n_bar``: ``n_max = n_max_factor * N_bar`` (capped at
        ``max(n_max_table, N_bar)`` for estimators allocated from a table), ``n0 = min(pilot, N_bar)``."""
        est = core.get_estimator(estimator)
        n_min = max(self.n_min, est.min_rollouts)
        n_max = self.n_max_factor * n_bar
        if est.power_offset is None:
            n_max = min(n_max, max(self.n_max_table, n_bar))
        return n_min, max(n_max, n_min), min(self.n0, n_bar)


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


STATISTICS = ("cos_expected", "rel_err_expected", "expected_mc_noise", "cos_sampled_mean", "cos_sampled_ci95",
              "rel_err_mean", "rel_err_ci95", "scale_min", "scale_max", "scale_mean", "scale_cv")


@dataclasses.dataclass
class _Budget:
    """Everything one budget needs besides the model: allocations, expected cotangents and pilots."""

    n_bar: int
    budget: int
    methods: tuple[str, ...]  # analysed methods, in METHODS order
    static: dict[str, Any]  # static arguments of the draw program
    counts: dict[str, Array]  # allocation -> counts_P (the pilot's: mean over pilot outcomes)
    rows: dict[str, Array]  # expected cotangent (P x K) per method; sera_pilot's two halves first
    s_eff: dict[str, Array]  # method -> effective scale factors
    draw_counts: Array  # (A, P) each method's counts in the draws (sera_pilot's row: replaced per draw)
    draw_corrections: Array  # (A,) each method's loss: multiplicity-corrected or not
    pilot_counts: Array  # (M, P) allocations after the M sampled draws' pilots
    draw_keys: Array  # (M,) the sampled draws' keys: each draw's pilot and every method's rollouts
    # The online methods (config.ONLINE_METHODS, in METHODS order; their own draw program, online_draws):
    online: tuple[str, ...] = ()
    online_static: dict[str, Any] = dataclasses.field(default_factory=dict)
    counts_uniform: Array | None = None  # (P,) uniform's counts (dapo's and pods's)
    online_counts: Array | None = None  # (M, A_online, P) each online method's counts in each draw
    sampling_rounds: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # method -> (M,) rounds


def _prepare_budget(settings: AnalysisSettings, fns: Compiled, estimator: str, n_bar: int, key: Array, probs_PxK,
                    labels, p_P) -> _Budget:
    """Allocations (every oracle allocator's and the pilots') and expected cotangents of every method at average
    budget ``n_bar``, and the keys of its sampled draws (the pilots of the draws are their first n0 rollouts: the
    same keys)."""
    num_prompts = probs_PxK.shape[0]
    analysed = analysed_methods(settings.allocators, estimator)
    online = tuple(m for m in analysed if m in ONLINE_METHODS)
    methods = tuple(m for m in analysed if m not in ONLINE_METHODS)  # the draw program's (draw_cotangents)
    with_pilot = "sera_pilot" in methods
    oracle_names = tuple(m for m in methods if m in ALLOCATOR_CORRECTION and m != "uniform")
    num_draws = math.ceil(settings.num_draws / fns.chunk) * fns.chunk
    budget = num_prompts * n_bar
    n_min, n_max, n0 = settings.bounds(n_bar, estimator)
    max_n = max(settings.bounds(n, estimator)[1] for n in settings.budgets)
    # Committed to the mesh like every program output, so each program compiles once for all budgets.
    put = functools.partial(jax.device_put, device=fns.replicated)
    counts_uniform = put(core.uniform_counts(num_prompts, budget))
    key_draws, key_outcomes = jax.random.split(key)
    draw_keys = jax.random.split(key_draws, num_draws)
    # A placeholder, used as such without sera_pilot (rloo).
    pilot_counts = put(np.zeros((num_draws, num_prompts), np.int32))
    # At B = P n_min the bounds leave one allocation, the uniform one; when the pilot is the whole budget,
    # sera_pilot's allocation is the uniform one too.
    # (A rule that may skip prompts, the released SERA, can still give some none: it is never trivial.)
    at_floor = budget == num_prompts * n_min
    fixed_trivial = at_floor and not any(core.get_allocator(n).may_skip_prompts for n in oracle_names)
    pilot_trivial = at_floor or n0 >= n_bar
    oracle = {name: counts_uniform for name in oracle_names}
    if with_pilot:
        pilot_succ, k0 = fns.pilot_draws(draw_keys, key_outcomes, probs_PxK, labels, n0=n0,
                                         num_outcomes=settings.pilot_draws)
        pilot_counts = put(np.broadcast_to(np.asarray(counts_uniform), pilot_succ.shape))
    if oracle_names and not fixed_trivial:
        # One program per budget: every oracle allocation, the M sampled pilots' and the Y pilot outcomes'.
        successes = None if (pilot_trivial or not with_pilot) else jnp.concatenate([pilot_succ, k0])
        oracle, all_counts = fns.allocations(p_P, successes, budget=budget, n_min=n_min, n_max=n_max, n0=n0,
                                             estimator=estimator, allocators=oracle_names)
        if all_counts is not None:
            pilot_counts, k0_counts = all_counts[:num_draws], all_counts[num_draws:]
    counts = {"uniform": counts_uniform, **oracle}

    fixed_methods = [m for m in methods if m != "sera_pilot"]
    losses = {m: method_loss(m) for m in fixed_methods}
    fixed_counts = put(jnp.stack([counts[losses[m][0]] for m in fixed_methods]))
    cot_AxPxK, s_AxP = fns.expected_fixed(probs_PxK, labels, fixed_counts,
                                          put(np.asarray([losses[m][1] for m in fixed_methods])), estimator=estimator,
                                          max_n=max_n)
    rows, s_eff = {}, {}
    if with_pilot and pilot_trivial:  # sera_pilot is exactly the uniform estimator
        rows["sera_pilot_a"] = rows["sera_pilot_b"] = cot_AxPxK[fixed_methods.index("uniform")]
        s_eff["sera_pilot"], counts["sera_pilot"] = s_AxP[fixed_methods.index("uniform")], counts_uniform
    elif with_pilot:
        halves, s_eff["sera_pilot"] = fns.pilot_expected(probs_PxK, labels, k0, k0_counts, n0=n0, estimator=estimator,
                                                         max_extra=max_n - n0, num_groups=2)
        rows["sera_pilot_a"], rows["sera_pilot_b"] = halves[0], halves[1]
        counts["sera_pilot"] = jnp.mean(k0_counts.astype(jnp.float32), axis=0)
    for a, m in enumerate(fixed_methods):
        rows[m], s_eff[m] = cot_AxPxK[a], s_AxP[a]
    # The draw program's rows: each method's counts (sera_pilot's a placeholder, replaced per draw) and loss.
    draw_counts = put(jnp.stack([counts_uniform if m == "sera_pilot" else counts[method_loss(m)[0]]
                                 for m in methods]))
    draw_corrections = put(np.asarray([method_loss(m)[1] for m in methods]))
    static = dict(estimator=estimator, length=num_prompts * max(settings.budgets), methods=methods)
    b = _Budget(n_bar=n_bar, budget=budget, methods=methods, static=static, counts=counts, rows=rows,
                s_eff=s_eff, draw_counts=draw_counts, draw_corrections=draw_corrections, pilot_counts=pilot_counts,
                draw_keys=draw_keys)
    if online:
        _prepare_online(settings, fns, b, online, estimator, counts_uniform, probs_PxK, labels, max_n)
    return b


def _prepare_online(settings: AnalysisSettings, fns: Compiled, b: _Budget, online: tuple[str, ...], estimator: str,
                    counts_uniform, probs_PxK, labels, max_n: int) -> None:
    """The online methods' part of budget ``b``: each draw's counts (Reinforce-Ada's rounds and DARS's pilot
    from the draw's own rollouts; uniform's for DAPO and PODS), their mean over the draws (``b.counts``, the
    allocation figure), and DAPO's closed-form expectation (the only one of them with a closed form)."""
    put = functools.partial(jax.device_put, device=fns.replicated)
    num_prompts = probs_PxK.shape[0]
    num_draws = b.draw_keys.shape[0]
    _, n_max, n0 = settings.bounds(b.n_bar, estimator)
    per_draw = {}
    if any(m in ("reinforce_ada", "dars_et") for m in online):
        per_draw = fns.online_counts(b.draw_keys, probs_PxK, labels, b.budget, length=b.static["length"], n0=n0,
                                     round_size=settings.round_size, keep=settings.keep_per_prompt,
                                     methods=tuple(m for m in online if m in ("reinforce_ada", "dars_et")))
    if "dars_et" in online:
        per_draw["dars_et"] = E.dars_draw_counts(per_draw["pilot_successes"], n0, b.budget, n_max=n_max)
    uniform_MxP = jnp.broadcast_to(counts_uniform, (num_draws, num_prompts))
    b.online_counts = put(jnp.stack([per_draw.get(m, uniform_MxP) for m in online], axis=1).astype(jnp.int32))
    b.counts_uniform = counts_uniform
    b.online = online
    b.online_static = dict(estimator=estimator, length=b.static["length"], methods=online,
                           keep=settings.keep_per_prompt)
    rounds_uniform = np.ones(num_draws)
    for m in online:
        if m in ("reinforce_ada", "dars_et"):
            b.counts[m] = jnp.mean(per_draw[m][:settings.num_draws].astype(jnp.float32), axis=0)
        b.sampling_rounds[m] = (np.asarray(per_draw["reinforce_ada/rounds"], np.float64) if m == "reinforce_ada"
                                else rounds_uniform * (2.0 if m == "dars_et" and n0 < b.n_bar else 1.0))
    if "dapo" in online:
        b.rows["dapo"], b.s_eff["dapo"] = fns.dapo_expected(probs_PxK, labels, b.n_bar, estimator=estimator,
                                                            max_n=max_n)


def _expected_alignment(fns: Compiled, b: _Budget, align) -> dict[str, tuple[float, float, float]]:
    """{method: (cos, relative error, Monte Carlo noise)} of the expected gradients, chunk by chunk (the two
    halves of the pilot's estimate first, so that they share the first chunk)."""
    present = list(b.rows)
    zeros = jnp.zeros_like(b.rows["uniform"])
    out = {}
    for start in range(0, len(present), fns.chunk):
        names = present[start:start + fns.chunk]
        cos_M, err_M, gram, dots, target_sq = align(
            jnp.stack([b.rows[r] for r in names] + [zeros] * (fns.chunk - len(names))))
        out.update({r: (float(cos_M[i]), float(err_M[i]), 0.0) for i, r in enumerate(names)})
        if names[:2] == ["sera_pilot_a", "sera_pilot_b"]:
            out["sera_pilot"] = split_half_alignment(gram, dots, target_sq)
    return out


def _sampled_alignment(settings: AnalysisSettings, fns: Compiled, b: _Budget, probs_PxK, labels, align
                       ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Array], dict[str, np.ndarray],
                                  dict[str, np.ndarray]]:
    """({method: (cos, err), one value per sampled estimate}, {method: the first draw's cotangent}, {online method:
    rollouts trained per draw}, {method: (M, P) projected scales of its draws, ``E.projected_scales``}); draw m of
    every method is sampled with ``b.draw_keys[m]`` (common random numbers: the values are paired by draw)."""
    everything = b.methods + b.online
    cos = {m: [] for m in everything}
    err = {m: [] for m in everything}
    projected = {m: [] for m in everything}
    trained = {m: [] for m in b.online}
    first = {}
    for c in range(math.ceil(settings.num_draws / fns.chunk)):
        part = slice(c * fns.chunk, (c + 1) * fns.chunk)
        draws = fns.draws(b.draw_keys[part], probs_PxK, labels, b.draw_counts, b.draw_corrections,
                          b.pilot_counts[part], b.budget, **b.static)
        first = first or {m: draws[m][0] for m in b.methods}
        if b.online:
            online_draws, online_trained = fns.online_draws(b.draw_keys[part], probs_PxK, labels, b.counts_uniform,
                                                            b.online_counts[part], b.budget, **b.online_static)
            draws = {**draws, **online_draws}
            for m in b.online:
                trained[m].append(np.asarray(online_trained[m], np.float64))
        for m in everything:
            cos_M, err_M, *_ = align(draws[m])
            cos[m].append(cos_M)
            err[m].append(err_M)
            projected[m].append(np.asarray(jax.device_get(fns.project(draws[m], probs_PxK, labels)), np.float64))
    return ({m: (np.concatenate(cos[m])[:settings.num_draws], np.concatenate(err[m])[:settings.num_draws])
             for m in everything}, first,
            {m: np.concatenate(trained[m])[:settings.num_draws] for m in b.online},
            {m: np.concatenate(projected[m])[:settings.num_draws] for m in everything})


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
    norm_inputs = None
    for b_index, n_bar in enumerate(settings.budgets):
        key_b = jax.random.fold_in(key, b_index)
        b = _prepare_budget(settings, fns, estimator, n_bar, key_b, probs_PxK, labels, p_P)
        expected = _expected_alignment(fns, b, align)
        sampled, first, trained, projected = _sampled_alignment(settings, fns, b, probs_PxK, labels, align)
        if "sera_pilot" in projected:
            projected[PILOT_NO_CORRECTION] = uncorrected_projection(
                projected["sera_pilot"], np.asarray(jax.device_get(b.pilot_counts))[:settings.num_draws], n_bar)
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
            scale_stats = (core.scale_factor_stats(np.asarray(b.s_eff[m], np.float64)) if m in b.s_eff
                           else dict.fromkeys(("min", "max", "mean", "cv"), math.nan))
            for k in ("min", "max", "mean", "cv"):
                stats[f"scale_{k}"].append(float(scale_stats[k]))
            # Prompts sampled at all (the released SERA gives hopeless ones none; mean over draws for a pilot).
            active = float(np.mean(np.asarray(b.counts[m]) > 0)) if m in b.counts else math.nan
            stats.setdefault("active_frac", []).append(active)
            if m in trained:
                for name, value in zip(ONLINE_STATISTICS, (
                        int(np.sum(trained[m] == 0)), float(np.mean(trained[m]) / b.budget),
                        float(np.mean(b.sampling_rounds[m][:settings.num_draws])))):
                    stats.setdefault(name, []).append(value)
        allocation[str(n_bar)] = {m: np.asarray(c, np.float64).tolist() for m, c in b.counts.items()}
        if n_bar == settings.norm_budget:
            num_prompts = probs_PxK.shape[0]
            norm_inputs = {
                # One draw of each prompt's own estimate (1/N_i) sum_j A_ij grad log pi = P c_i (corrected).
                "cotangents": num_prompts * jnp.stack([E.exact_cotangent(probs_PxK, labels), first["uniform"],
                                                       first.get("sera", first["uniform"])], axis=1),
                "scales": {m: np.asarray(core.scale_factor(p_P, c, estimator, max_n=int(c.max()), check=False))
                           for m, c in ((m, np.asarray(b.counts[m])) for m in ("uniform", "sera") if m in b.counts)},
                "counts": np.asarray(b.counts.get("sera", b.counts["uniform"])),
            }
    return per_method, allocation, norm_inputs, profiles


def _gradient_norms(settings: AnalysisSettings, fns: Compiled, params, batch_stats, x, p_host, inputs,
                    estimator: str) -> dict[str, Any]:
    """Per-prompt gradient norms against p at ``norm_budget`` (MaxRL's gradient-norm figure, extended).

    ``ce``: ``|grad log p_i|``; ``*_expected``: ``s(p_i, N_i) |grad log p_i|``, the norm of the prompt's
    expected estimate; ``*_sampled``: the norm of one draw of the prompt's own estimate
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
