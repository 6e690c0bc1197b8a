"""The methods the alignment analysis compares, and what each one is: asked of the allocator registry.

A method is a registered allocator (``sera_jax.core.ALLOCATORS``) of ``config.ANALYSABLE``, or one of SERA's two
variants the analysis adds (``SERA_VARIANTS``). How the analysis runs a method follows from its registry entry,
never from its name (a new allocator with the same attributes is run the same way):

* ``decides_after_sampling`` (a train mask ``keep_fn`` or rounds ``round_fn``): its own draw program, trained
  with the plain mean over the rollouts it keeps; the others allocate before sampling (the oracle p) and train with
  ``config.ALLOCATOR_CORRECTION``'s loss;
* among those, ``samples_in_rounds`` (``round_fn``): its counts come from each draw's rounds;
  ``allocates_from_pilot`` (``needs_estimate``): from each draw's pilot, its first n0 rollouts;
  ``shares_uniform_rollouts`` (neither): uniform's counts, so it trains on a subset of uniform's own rollouts;
* ``reads_p`` (``needs_estimate``): an allocator that reads no success rate allocates uniformly (every such entry
  of the registry does: tests/experiments/test_imagenet_alignment_methods.py), so only those that read p run in
  the oracle allocation program.

The rules themselves run as the analysis's own common-random-number versions, one per published rule: the train
masks of ``E.ONLINE_RULES`` (by name), Reinforce-Ada's rounds (``E.reinforce_ada_counts``) and DARS-ET's pilot
counts (``E.dars_draw_counts``); an allocator of a new kind needs its own there.
"""

from __future__ import annotations

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.config import ALLOCATOR_CORRECTION, ONLINE_METHODS, allocator_defined
from sera_jax import core

# SERA's variants, run by SERA's rule: ``sera_pilot`` with p estimated from a pilot inside the budget (each draw's
# first n0 rollouts), ``sera_no_correction`` with the oracle counts under the batch-mean loss.
SERA_PILOT = "sera_pilot"
SERA_VARIANTS = (SERA_PILOT, "sera_no_correction")
# A weight profile without the other statistics (analysis.py's docstring): sera_pilot's draws under the
# batch-mean loss.
PILOT_NO_CORRECTION = "sera_pilot_no_correction"
# Every method the analysis can compare, in its order: the baseline, SERA and its two variants, the registry's
# other allocators, then the online / train-mask peers (config.ONLINE_METHODS).
METHODS = ("uniform", "sera") + SERA_VARIANTS + tuple(a for a in ALLOCATOR_CORRECTION
                                                     if a not in ("uniform", "sera")) + ONLINE_METHODS


def allocator(method: str) -> core.Allocator:
    """The registry's entry that runs ``method`` (SERA's variants run ``sera``'s)."""
    return core.get_allocator("sera" if method in SERA_VARIANTS else method)


def decides_after_sampling(method: str) -> bool:
    """Whether ``method`` decides from its sampled rollouts which of them train (``keep_fn``) or how many more to
    draw (``round_fn``): it then runs in the online draw program (``draws.online_draw_cotangents``)."""
    entry = allocator(method)
    return entry.keep_fn is not None or entry.round_fn is not None


def samples_in_rounds(method: str) -> bool:
    """Whether ``method``'s counts come from sampling rounds (``round_fn``), each round from what the earlier drew."""
    return allocator(method).round_fn is not None


def reads_p(method: str) -> bool:
    """Whether ``method``'s counts depend on the success rates (``needs_estimate``); those that do not are uniform."""
    return allocator(method).needs_estimate


def allocates_from_pilot(method: str) -> bool:
    """Whether an online ``method`` allocates from a pilot inside the budget (it reads p, and the draw's only
    estimate of p is its pilot): its counts then follow each draw's pilot."""
    return decides_after_sampling(method) and not samples_in_rounds(method) and reads_p(method)


def shares_uniform_rollouts(method: str) -> bool:
    """Whether an online ``method`` samples uniform's counts before it decides (no rounds, no p): it trains on a
    subset of the rollouts uniform draws, and the online program samples them once for all such methods."""
    return decides_after_sampling(method) and not samples_in_rounds(method) and not reads_p(method)


def has_online_closed_form(method: str) -> bool:
    """Whether an online ``method``'s expected cotangent has a closed form: the mixed-group filter on uniform's
    counts (``E.dapo_expected_cotangent``); the other online rules' expectations are NaN."""
    return shares_uniform_rollouts(method) and E.ONLINE_RULES.get(method) == "mixed"


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
    if method == SERA_PILOT:
        return SERA_PILOT, True
    if decides_after_sampling(method):  # the plain mean over the rollouts it keeps
        return method, False
    return method, ALLOCATOR_CORRECTION[method]
