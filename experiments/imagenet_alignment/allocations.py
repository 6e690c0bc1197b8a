"""Each budget's allocations before sampling and what fixed counts give in expectation.

``allocations``: every allocator's counts on the oracle p, and SERA's after each of M pilots; ``expected_fixed``:
the closed-form expected cotangent and effective scale factors of any fixed counts under either loss. The budget
is static in ``sera_jax.core``'s allocators, so these small programs compile per budget (the draw programs,
``draws.py``, serve every budget).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from experiments.imagenet_alignment import estimators as E
from sera_jax import core

Array = jnp.ndarray


def expected_fixed(probs_PxK, labels_P, counts_AxP, corrections_A, *, estimator: str, max_n: int
                   ) -> tuple[Array, Array]:
    """Analytic expected cotangents (A x P x K) and effective scales (A x P) of A fixed allocations, row a with
    counts ``counts_AxP[a]`` and the loss ``corrections_A[a]`` (corrected or not): one vmapped closed form, the
    same for every allocator."""
    exp = functools.partial(E.expected_cotangent, probs_PxK, labels_P, estimator=estimator, max_n=max_n)
    return jax.vmap(lambda counts_P, corrected: exp(counts_P, correction=corrected))(counts_AxP, corrections_A)


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
