"""The sampled draws: M independent draws of every method's sampled-estimator cotangent, a chunk at a time.

One compiled program per estimator serves every budget: the rollout layout has the static length
B = P * max(N_bar) rows and a traced budget <= B (see estimators.flat_layout). Only the allocations
(``allocations.py``), whose budget is static in sera_jax.core, are compiled per budget, and they are small.

Common random numbers: draw m of every method samples with the same key, whose rollout j of prompt i is the same
label for all of them (``E.sample_rollouts``), so methods differ only where their counts and loss weights do.
The methods that allocate before sampling run in ``draw_cotangents``; those that decide after sampling
(``methods.decides_after_sampling``) in ``online_draw_cotangents``, a program of their own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.methods import (SERA_PILOT, allocates_from_pilot, samples_in_rounds,
                                                    shares_uniform_rollouts)

Array = jnp.ndarray


def pilot_draws(keys_M, key_outcomes, probs_PxK, labels_P, *, n0: int, num_outcomes: int):
    """Pilot successes of the M sampled estimates (M x P) and Y = ``num_outcomes`` independent pilot outcomes
    for the Rao-Blackwellised expectation (Y x P).

    Draw m's pilot is rollouts 0..n0-1 of each prompt drawn with ``keys_M[m]``, the key ``draw_cotangents``
    samples draw m with: its pilot is that draw's first n0 rollouts, the ones every method of the draw shares."""
    successes_MxP = jax.vmap(lambda k: E.sample_pilot(k, probs_PxK, labels_P, n0)[1])(keys_M)
    k0_YxP = E.pilot_successes(key_outcomes, E.success_probabilities(probs_PxK, labels_P), n0, num_outcomes)
    return successes_MxP, k0_YxP


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
    pilot_row = methods.index(SERA_PILOT) if SERA_PILOT in methods else None

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
    """What the online methods' counts are made from, for M draws at one (traced) budget: for each method of
    ``methods`` that samples in rounds (``reinforce_ada``), its (M, P) counts and ``<method>/rounds`` (M,); when one
    allocates from a pilot (``dars_et``), ``pilot_successes``: (M, P); one program for every budget.

    Draw m's rollouts are those ``draw_cotangents`` samples with ``keys_M[m]`` (common random numbers):
    Reinforce-Ada's rounds read the successes of each prompt's ranks (``E.reinforce_ada_counts``), DARS's pilot
    is its ranks 0..n0-1, the ``sera_pilot`` pilot of the draw (its counts: ``E.dars_draw_counts``). The inputs
    are replicated first: Reinforce-Ada's phases run in a data-dependent (bounded) ``while_loop``, which must not
    hold collectives (partitioned over P, DynaMO's deadlocked on 8 CPU devices: see ``allocations``); the draws
    run one at a time (``lax.map``: each loop stops at its own last round)."""
    if replicated is not None:
        probs_PxK, labels_P = jax.lax.with_sharding_constraint((probs_PxK, labels_P), replicated)
    out = {}
    for m in methods:
        if samples_in_rounds(m):  # Reinforce-Ada's rounds: the analysis's one round rule
            out[m], out[f"{m}/rounds"] = jax.lax.map(
                lambda k: E.reinforce_ada_counts(k, probs_PxK, labels_P, budget, round_size=round_size, keep=keep,
                                                 length=length), keys_M)
    if any(allocates_from_pilot(m) for m in methods):  # one pilot per draw, shared: its ranks 0..n0-1
        out["pilot_successes"] = jax.vmap(lambda k: E.sample_pilot(k, probs_PxK, labels_P, n0)[1])(keys_M)
    return out


def online_draw_cotangents(keys_M, probs_PxK, labels_P, counts_uniform_P, counts_MxAxP, budget, *, estimator: str,
                           length: int, methods: tuple[str, ...], keep: int):
    """M draws of every online method's cotangent ({method: (M, P, K)}) and its trained rollouts ({method: (M,)}).

    Method a (``methods[a]``) samples ``counts_MxAxP[m, a]`` rollouts in draw m (``dapo``, ``pods``: uniform's
    counts; ``reinforce_ada``, ``dars_et``: ``online_counts``), with ``keys_M[m]``, the key every method's draw m
    samples with (common random numbers: the same labels as uniform's and SERA's draws rank by rank; the methods
    that sample uniform's counts, ``methods.shares_uniform_rollouts``: ``dapo`` and ``pods``, share uniform's
    rollouts, drawn once), then keeps, weighs and scores them as ``E.online_cotangent``.
    A program of its own, so that the other methods' draw program (``draw_cotangents``) is the one it always was.
    """
    uniform_counts = tuple(shares_uniform_rollouts(m) for m in methods)

    def one_draw(key, counts_AxP):
        cots, trained = {}, {}
        shared = None
        if any(uniform_counts):
            shared = E.sample_rollouts(key, probs_PxK, counts_uniform_P, budget, length=length)
        for a, m in enumerate(methods):
            cots[m], trained[m] = E.online_cotangent(
                m, key, probs_PxK, labels_P, counts_AxP[a], budget, estimator=estimator, keep=keep, length=length,
                sampled=shared if uniform_counts[a] else None)
        return cots, trained

    return jax.vmap(one_draw)(keys_M, counts_MxAxP)
