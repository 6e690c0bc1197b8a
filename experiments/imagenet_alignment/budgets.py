"""One average budget N_bar of one estimator: every method's allocation, expected cotangent and sampled draws,
reduced to alignment statistics against ``G*`` (``align``: a chunk of cotangents -> cosines, errors, Gram).

``prepare_budget`` allocates (oracle p, pilots, the online methods' per-draw counts) and computes the closed-form
expectations; ``expected_alignment`` and ``sampled_alignment`` push them through the model a chunk at a time.
How each method is run follows from its registry entry (``methods.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.config import ALLOCATOR_CORRECTION
from experiments.imagenet_alignment.cosines import split_half_alignment
from experiments.imagenet_alignment.methods import (SERA_PILOT, allocates_from_pilot, analysed_methods,
                                                    decides_after_sampling, has_online_closed_form, method_loss,
                                                    reads_p, samples_in_rounds)
from experiments.imagenet_alignment.programs import Compiled
from experiments.imagenet_alignment.settings import AnalysisSettings
from sera_jax import core

Array = jnp.ndarray


@dataclasses.dataclass
class Budget:
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
    # The online methods (methods.decides_after_sampling, in METHODS order; their own draw program, online_draws):
    online: tuple[str, ...] = ()
    online_static: dict[str, Any] = dataclasses.field(default_factory=dict)
    counts_uniform: Array | None = None  # (P,) uniform's counts (methods.shares_uniform_rollouts: dapo's, pods's)
    online_counts: Array | None = None  # (M, A_online, P) each online method's counts in each draw
    sampling_rounds: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # method -> (M,) rounds


def prepare_budget(settings: AnalysisSettings, fns: Compiled, estimator: str, n_bar: int, key: Array, probs_PxK,
                   labels, p_P) -> Budget:
    """Allocations (every oracle allocator's and the pilots') and expected cotangents of every method at average
    budget ``n_bar``, and the keys of its sampled draws (the pilots of the draws are their first n0 rollouts: the
    same keys)."""
    num_prompts = probs_PxK.shape[0]
    analysed = analysed_methods(settings.allocators, estimator)
    online = tuple(m for m in analysed if decides_after_sampling(m))
    methods = tuple(m for m in analysed if not decides_after_sampling(m))  # the draw program's (draw_cotangents)
    with_pilot = SERA_PILOT in methods
    # The registry's allocators that read p allocate on the oracle p; the others allocate as uniform does.
    oracle_names = tuple(m for m in methods if m in ALLOCATOR_CORRECTION and reads_p(m))
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
    counts = {"uniform": counts_uniform}  # the baseline's, whatever is analysed
    counts.update({m: counts_uniform for m in methods if m in ALLOCATOR_CORRECTION and not reads_p(m)})
    counts.update(oracle)

    fixed_methods = [m for m in methods if m != SERA_PILOT]
    losses = {m: method_loss(m) for m in fixed_methods}
    fixed_counts = put(jnp.stack([counts[losses[m][0]] for m in fixed_methods]))
    cot_AxPxK, s_AxP = fns.expected_fixed(probs_PxK, labels, fixed_counts,
                                          put(np.asarray([losses[m][1] for m in fixed_methods])), estimator=estimator,
                                          max_n=max_n)
    rows, s_eff = {}, {}
    if with_pilot and pilot_trivial:  # sera_pilot is exactly the uniform estimator
        rows["sera_pilot_a"] = rows["sera_pilot_b"] = cot_AxPxK[fixed_methods.index("uniform")]
        s_eff[SERA_PILOT], counts[SERA_PILOT] = s_AxP[fixed_methods.index("uniform")], counts_uniform
    elif with_pilot:
        halves, s_eff[SERA_PILOT] = fns.pilot_expected(probs_PxK, labels, k0, k0_counts, n0=n0, estimator=estimator,
                                                       max_extra=max_n - n0, num_groups=2)
        rows["sera_pilot_a"], rows["sera_pilot_b"] = halves[0], halves[1]
        counts[SERA_PILOT] = jnp.mean(k0_counts.astype(jnp.float32), axis=0)
    for a, m in enumerate(fixed_methods):
        rows[m], s_eff[m] = cot_AxPxK[a], s_AxP[a]
    # The draw program's rows: each method's counts (sera_pilot's a placeholder, replaced per draw) and loss.
    draw_counts = put(jnp.stack([counts_uniform if m == SERA_PILOT else counts[method_loss(m)[0]]
                                 for m in methods]))
    draw_corrections = put(np.asarray([method_loss(m)[1] for m in methods]))
    static = dict(estimator=estimator, length=num_prompts * max(settings.budgets), methods=methods)
    b = Budget(n_bar=n_bar, budget=budget, methods=methods, static=static, counts=counts, rows=rows,
               s_eff=s_eff, draw_counts=draw_counts, draw_corrections=draw_corrections, pilot_counts=pilot_counts,
               draw_keys=draw_keys)
    if online:
        prepare_online(settings, fns, b, online, estimator, counts_uniform, probs_PxK, labels, max_n)
    return b


def prepare_online(settings: AnalysisSettings, fns: Compiled, b: Budget, online: tuple[str, ...], estimator: str,
                   counts_uniform, probs_PxK, labels, max_n: int) -> None:
    """The online methods' part of budget ``b``: each draw's counts (from the draw's own rollouts for those that
    sample in rounds, Reinforce-Ada, or allocate from a pilot, DARS; uniform's for the others, DAPO and PODS),
    their mean over the draws (``b.counts``, the allocation figure), and the closed-form expectation of those that
    have one (``methods.has_online_closed_form``: DAPO)."""
    put = functools.partial(jax.device_put, device=fns.replicated)
    num_prompts = probs_PxK.shape[0]
    num_draws = b.draw_keys.shape[0]
    _, n_max, n0 = settings.bounds(b.n_bar, estimator)
    per_draw = {}
    # The methods whose counts each draw makes from its own rollouts (rounds, or a pilot).
    drawn = tuple(m for m in online if samples_in_rounds(m) or allocates_from_pilot(m))
    if drawn:
        per_draw = fns.online_counts(b.draw_keys, probs_PxK, labels, b.budget, length=b.static["length"], n0=n0,
                                     round_size=settings.round_size, keep=settings.keep_per_prompt, methods=drawn)
    for m in online:
        if allocates_from_pilot(m):  # DARS's counts from the draw's pilot (the analysis's one pilot rule)
            per_draw[m] = E.dars_draw_counts(per_draw["pilot_successes"], n0, b.budget, n_max=n_max)
    uniform_MxP = jnp.broadcast_to(counts_uniform, (num_draws, num_prompts))
    b.online_counts = put(jnp.stack([per_draw.get(m, uniform_MxP) for m in online], axis=1).astype(jnp.int32))
    b.counts_uniform = counts_uniform
    b.online = online
    b.online_static = dict(estimator=estimator, length=b.static["length"], methods=online,
                           keep=settings.keep_per_prompt)
    rounds_uniform = np.ones(num_draws)
    for m in online:
        if m in drawn:
            b.counts[m] = jnp.mean(per_draw[m][:settings.num_draws].astype(jnp.float32), axis=0)
        # Sampling calls a step makes: its rounds; a pilot and the rest (one call when the pilot is the budget).
        b.sampling_rounds[m] = (np.asarray(per_draw[f"{m}/rounds"], np.float64) if samples_in_rounds(m)
                                else rounds_uniform * (2.0 if allocates_from_pilot(m) and n0 < b.n_bar else 1.0))
    for m in online:
        if has_online_closed_form(m):
            b.rows[m], b.s_eff[m] = fns.dapo_expected(probs_PxK, labels, b.n_bar, estimator=estimator, max_n=max_n)


def expected_alignment(fns: Compiled, b: Budget, align) -> dict[str, tuple[float, float, float]]:
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
            out[SERA_PILOT] = split_half_alignment(gram, dots, target_sq)
    return out


def sampled_alignment(settings: AnalysisSettings, fns: Compiled, b: Budget, probs_PxK, labels, align
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
