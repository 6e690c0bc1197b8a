"""Which sampled rollouts train: the keep masks of published allocators (docs/allocators.md §1, §6, §7).

DAPO, Reinforce-Ada and PODS sample rollouts and then train on a subset chosen by reward. On the flat layout
(docs/method.md §6: B rows, row b belongs to prompt ``prompt_ids_B[b]`` in [0, P), rows of a prompt need not be
contiguous and their flat order is their arrival order) the subset is a per-rollout 0/1 train mask ``keep_B``
(float32), so shapes never change (docs/allocators.md §0). Reinforce-Ada also needs the next sampling round's
rollouts per prompt: :func:`reinforce_ada_round`.

Conventions shared by every function here:
  * ``valid_B`` (optional, bool): rows with False are padding. They count for nothing (not a prompt's rollouts,
    successes or failures), are never kept, and their prompt ids and rewards are ignored (they may be anything).
  * Binary rules (everything but :func:`mixed_groups`) need rewards in {0, 1}; a success is r = 1. Concrete
    inputs are checked (ValueError); traced ones are not.
  * Within a class (successes, failures) the kept rollouts are a prompt's first ones in flat order.
  * ``num_prompts`` and ``keep`` are static Python ints (``static_argnames`` under jit).

Letters: B rows, P prompts (docs/method.md §10.1, "Shape letters").
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.core import layout, validation

Array = jnp.ndarray


# ---------------------------------------------------------------------------------------------------------
# Checks and per-prompt class counts.


def _check_layout(rewards_B, prompt_ids_B, num_prompts, valid_B, *, binary: bool):
    """Validates a flat layout; returns (rewards_B, prompt_ids_B, valid_B, num_prompts) as arrays and a static int."""
    num_prompts = validation.check_int(num_prompts, "num_prompts", minimum=1)
    rewards_B, prompt_ids_B = jnp.asarray(rewards_B), jnp.asarray(prompt_ids_B)
    if rewards_B.ndim != 1:
        raise ValueError(f"rewards_B must have shape (B,), got {rewards_B.shape}")
    if prompt_ids_B.shape != rewards_B.shape:
        raise ValueError(f"prompt_ids_B must have shape (B,) = {rewards_B.shape} like rewards_B, "
                         f"got {prompt_ids_B.shape}")
    if not jnp.issubdtype(prompt_ids_B.dtype, jnp.integer):
        raise ValueError(f"prompt_ids_B must be an integer array, got dtype {prompt_ids_B.dtype}")
    valid_B = np.ones(rewards_B.shape, bool) if valid_B is None else jnp.asarray(valid_B)
    if valid_B.shape != rewards_B.shape:
        raise ValueError(f"valid_B must have shape (B,) = {rewards_B.shape} like rewards_B, got {valid_B.shape}")
    if valid_B.dtype != jnp.bool_:
        raise ValueError(f"valid_B must be a bool mask (False on padding rows), got dtype {valid_B.dtype}")
    if not validation.is_traced(prompt_ids_B, valid_B):
        ids, valid = np.asarray(prompt_ids_B), np.asarray(valid_B)
        if np.any(valid & ((ids < 0) | (ids >= num_prompts))):
            raise ValueError(f"prompt_ids_B of valid rows must lie in [0, num_prompts) = [0, {num_prompts})")
    if binary and not validation.is_traced(rewards_B, valid_B):
        rewards, valid = np.asarray(rewards_B), np.asarray(valid_B)
        if not np.all((rewards[valid] == 0) | (rewards[valid] == 1)):
            raise ValueError("rewards_B must be binary (0 or 1) on valid rows")
    return rewards_B, prompt_ids_B, valid_B, num_prompts


def _safe_ids(prompt_ids_B: Array, valid_B: Array) -> Array:
    """Prompt ids with padding rows sent to prompt 0 (their own id may lie outside [0, P)); they are masked
    everywhere, so this only keeps gathers and segment sums in range."""
    return jnp.where(valid_B, prompt_ids_B, 0).astype(jnp.int32)


def _check_per_prompt(x, name: str, num_prompts: int) -> Array:
    x = jnp.asarray(x)
    if x.shape != (num_prompts,):
        raise ValueError(f"{name} must have shape (P,) = ({num_prompts},), got {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
    return x


def _class_counts(success_B: Array, ids_B: Array, valid_B: Array, num_prompts: int) -> tuple[Array, Array]:
    """Valid successes and failures per prompt, ``(K_P, N_P - K_P)`` (int32)."""
    successes_P = layout._segment_sum((success_B & valid_B).astype(jnp.int32), ids_B, num_prompts)
    failures_P = layout._segment_sum((~success_B & valid_B).astype(jnp.int32), ids_B, num_prompts)
    return successes_P, failures_P


def _rank_within_class(success_B: Array, ids_B: Array, valid_B: Array, num_prompts: int) -> Array:
    """For every row: how many earlier valid rows (flat order) share its prompt and class. O(B log B).

    A stable sort by the key ``2 * prompt + class`` (padding last) puts each (prompt, class) run in flat order;
    a row's rank is its position minus the start of its run.
    """
    num_rows = success_B.shape[0]
    padding_key = 2 * num_prompts
    key_B = jnp.where(valid_B, 2 * ids_B + success_B.astype(jnp.int32), padding_key)
    order_B = jnp.argsort(key_B, stable=True)
    run_sizes = jax.ops.segment_sum(jnp.ones((num_rows,), jnp.int32), key_B, num_segments=padding_key + 1)
    run_starts = jnp.cumsum(run_sizes) - run_sizes
    rank_sorted_B = jnp.arange(num_rows, dtype=jnp.int32) - run_starts[key_B[order_B]]
    return jnp.zeros((num_rows,), jnp.int32).at[order_B].set(rank_sorted_B)


def _keep_first_classes(success_B, ids_B, valid_B, successes_P, failures_P, *, num_prompts) -> Array:
    rank_B = _rank_within_class(success_B, ids_B, valid_B, num_prompts)
    quota_B = jnp.where(success_B, successes_P[ids_B], failures_P[ids_B])
    return (valid_B & (rank_B < quota_B)).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# DAPO (arXiv 2503.14476), docs/allocators.md §1.


def mixed_groups(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, valid_B: Optional[Array] = None) -> Array:
    """DAPO's dynamic-sampling filter (Yu et al., "DAPO", arXiv 2503.14476): keep a prompt's rollouts iff its group
    is mixed.

    Published rule (verl-recipe ``dapo_ray_trainer.py``): keep a group iff the std of its rewards is > 0 or it has
    a single rollout. Here std > 0 is read as ``max_i > min_i``: the group's rewards are not all equal (for binary
    rewards ``0 < K_i < N_i``), so any real rewards work. The two agree in exact arithmetic, not always in floats:
    DAPO's float64 ``np.std`` is > 0 for three equal rewards 0.2 (their mean rounds off 0.2) and 0 for rewards
    1e-170 apart (the squares underflow). We keep ``max > min``, the rule's meaning and exact whatever the order of
    summation, rather than a float std's rounding (which float32 could not reproduce anyway; binary rewards never
    meet it). ``N_i == 1`` groups are kept, as DAPO's code keeps them
    (``std > 0 or len(...) == 1``); under ``maxrl`` and ``grpo`` their advantage is 0 anyway. ``N_i`` counts valid
    rows only, so a prompt with one valid row and padding is a single-rollout group.

    Fixed-budget adaptation (docs §1.4): every chunk of the budget is sampled and filtered, and every kept group
    trains (no truncation to ``train_batch_size`` groups); divide the loss by :func:`kept_groups` (``P_kept``).

    Returns:
      keep_B, float32 0/1.
    """
    rewards_B, prompt_ids_B, valid_B, num_prompts = _check_layout(rewards_B, prompt_ids_B, num_prompts, valid_B,
                                                                  binary=False)
    return _mixed_groups(rewards_B, prompt_ids_B, valid_B, num_prompts=num_prompts)


@functools.partial(jax.jit, static_argnames=("num_prompts",))
def _mixed_groups(rewards_B, prompt_ids_B, valid_B, *, num_prompts):
    ids_B = _safe_ids(prompt_ids_B, valid_B)
    highest_P = jax.ops.segment_max(jnp.where(valid_B, rewards_B, -jnp.inf), ids_B, num_segments=num_prompts)
    lowest_P = jax.ops.segment_min(jnp.where(valid_B, rewards_B, jnp.inf), ids_B, num_segments=num_prompts)
    counts_P = layout._segment_sum(valid_B.astype(jnp.int32), ids_B, num_prompts)
    kept_P = (highest_P > lowest_P) | (counts_P == 1)
    return (valid_B & kept_P[ids_B]).astype(jnp.float32)


def kept_groups(keep_B: Array, prompt_ids_B: Array, num_prompts: int) -> Array:
    """``P_kept``: the number of prompts with at least one kept rollout (int32 scalar; DAPO's loss divisor).

    Rows with ``keep_B == 0`` are ignored, whatever their prompt id (padding may carry any id).
    """
    num_prompts = validation.check_int(num_prompts, "num_prompts", minimum=1)
    keep_B, prompt_ids_B = jnp.asarray(keep_B), jnp.asarray(prompt_ids_B)
    if keep_B.ndim != 1:
        raise ValueError(f"keep_B must have shape (B,), got {keep_B.shape}")
    if prompt_ids_B.shape != keep_B.shape:
        raise ValueError(f"prompt_ids_B must have shape (B,) = {keep_B.shape} like keep_B, got {prompt_ids_B.shape}")
    if not jnp.issubdtype(prompt_ids_B.dtype, jnp.integer):
        raise ValueError(f"prompt_ids_B must be an integer array, got dtype {prompt_ids_B.dtype}")
    validation.require(jnp.where(keep_B > 0, prompt_ids_B, 0), lambda ids: (ids < 0) | (ids >= num_prompts),
                       f"prompt_ids_B of kept rows must lie in [0, num_prompts) = [0, {num_prompts})")
    return _kept_groups(keep_B, prompt_ids_B, num_prompts=num_prompts)


@functools.partial(jax.jit, static_argnames=("num_prompts",))
def _kept_groups(keep_B, prompt_ids_B, *, num_prompts):
    kept_B = keep_B > 0
    ids_B = jnp.where(kept_B, prompt_ids_B, 0).astype(jnp.int32)
    kept_per_prompt_P = layout._segment_sum(kept_B.astype(jnp.int32), ids_B, num_prompts)
    return jnp.sum(kept_per_prompt_P > 0).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------------
# The building blocks: first arrivals per class, and how many of each class to take.


def keep_first(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, successes_P: Array, failures_P: Array,
               valid_B: Optional[Array] = None) -> Array:
    """Keeps, per prompt i, its first ``successes_P[i]`` successes and first ``failures_P[i]`` failures (flat order).

    A prompt with fewer rollouts of a class than asked keeps all of them. A segment-wise running count per class
    (one stable sort, O(B log B)).

    Args:
      rewards_B: binary rewards (0/1).
      prompt_ids_B: prompt of each row, in [0, num_prompts) on valid rows.
      num_prompts: static P.
      successes_P, failures_P: int (P,): how many of each class to keep.
      valid_B: optional bool (B,), False on padding rows.

    Returns:
      keep_B, float32 0/1.
    """
    rewards_B, prompt_ids_B, valid_B, num_prompts = _check_layout(rewards_B, prompt_ids_B, num_prompts, valid_B,
                                                                  binary=True)
    successes_P = _check_per_prompt(successes_P, "successes_P", num_prompts)
    failures_P = _check_per_prompt(failures_P, "failures_P", num_prompts)
    return _keep_first(rewards_B, prompt_ids_B, valid_B, successes_P, failures_P, num_prompts=num_prompts)


@functools.partial(jax.jit, static_argnames=("num_prompts",))
def _keep_first(rewards_B, prompt_ids_B, valid_B, successes_P, failures_P, *, num_prompts):
    return _keep_first_classes(rewards_B > 0.5, _safe_ids(prompt_ids_B, valid_B), valid_B,
                               successes_P.astype(jnp.int32), failures_P.astype(jnp.int32), num_prompts=num_prompts)


def class_split(successes_P: Array, failures_P: Array, take_P: Array, positives_target_P: Array) -> tuple[Array, Array]:
    """How many successes and failures to keep when taking ``take_P`` rollouts: the target, filled from the other class.

    ``pos = clip(target, max(0, take - failures), min(successes, take))``, ``neg = take - pos``: the feasible
    number of successes closest to the target (so when one class is short the other fills the take). Needs
    ``0 <= take <= successes + failures`` (checked on concrete inputs). ``take_P`` and ``positives_target_P`` may
    be scalars (shared by every prompt).

    Returns:
      (pos_P, neg_P), int32, shaped like successes_P.
    """
    successes_P, failures_P = jnp.asarray(successes_P), jnp.asarray(failures_P)
    take_P, positives_target_P = jnp.asarray(take_P), jnp.asarray(positives_target_P)
    if successes_P.ndim != 1:
        raise ValueError(f"successes_P must have shape (P,), got {successes_P.shape}")
    for name, x, allow_scalar in (("failures_P", failures_P, False), ("take_P", take_P, True),
                                  ("positives_target_P", positives_target_P, True)):
        if x.shape != successes_P.shape and not (allow_scalar and x.ndim == 0):
            raise ValueError(f"{name} must have shape (P,) = {successes_P.shape} like successes_P"
                             f"{' (or be a scalar)' if allow_scalar else ''}, got {x.shape}")
    for name, x in (("successes_P", successes_P), ("failures_P", failures_P), ("take_P", take_P),
                    ("positives_target_P", positives_target_P)):
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
    if not validation.is_traced(successes_P, failures_P, take_P):
        s, f, t = np.asarray(successes_P), np.asarray(failures_P), np.asarray(take_P)
        if np.any(s < 0) or np.any(f < 0):
            raise ValueError("successes_P and failures_P must be >= 0")
        if np.any(t < 0) or np.any(t > s + f):
            raise ValueError("take_P must lie in [0, successes_P + failures_P] (a prompt cannot keep more rollouts "
                             "than it has)")
    return _class_split(successes_P, failures_P, take_P, positives_target_P)


@jax.jit
def _class_split(successes_P, failures_P, take_P, positives_target_P):
    successes_P, failures_P = successes_P.astype(jnp.int32), failures_P.astype(jnp.int32)
    take_P = jnp.broadcast_to(take_P, successes_P.shape).astype(jnp.int32)
    lowest_P = jnp.maximum(0, take_P - failures_P)
    highest_P = jnp.minimum(successes_P, take_P)
    pos_P = jnp.clip(positives_target_P.astype(jnp.int32), lowest_P, highest_P)
    return pos_P, take_P - pos_P


def _subset_with_target(rewards_B, prompt_ids_B, num_prompts, keep, valid_B, positives_target: int) -> Array:
    """Per prompt: ``take = min(keep, N_i)`` rollouts, ``positives_target`` successes filled from the failures (and
    vice versa) when short, first arrivals within a class."""
    rewards_B, prompt_ids_B, valid_B, num_prompts = _check_layout(rewards_B, prompt_ids_B, num_prompts, valid_B,
                                                                  binary=True)
    return _subset(rewards_B, prompt_ids_B, valid_B, num_prompts=num_prompts, keep=keep,
                   positives_target=positives_target)


@functools.partial(jax.jit, static_argnames=("num_prompts", "keep", "positives_target"))
def _subset(rewards_B, prompt_ids_B, valid_B, *, num_prompts, keep, positives_target):
    success_B, ids_B = rewards_B > 0.5, _safe_ids(prompt_ids_B, valid_B)
    successes_P, failures_P = _class_counts(success_B, ids_B, valid_B, num_prompts)
    take_P = jnp.minimum(keep, successes_P + failures_P)
    pos_P, neg_P = _class_split(successes_P, failures_P, take_P, jnp.int32(positives_target))
    return _keep_first_classes(success_B, ids_B, valid_B, pos_P, neg_P, num_prompts=num_prompts)


# ---------------------------------------------------------------------------------------------------------
# PODS (arXiv 2504.13818), docs/allocators.md §7.


def max_variance_subset(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, keep: int,
                        valid_B: Optional[Array] = None) -> Array:
    """PODS's max-variance down-sampling (Xu et al., "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM
    Reinforcement Learning", arXiv 2504.13818) for binary rewards.

    Published rule (``maxvargrpo_trainer.py``): of n sampled rollouts keep the m whose rewards have the largest
    variance, among "the top i plus the bottom m - i" of the sorted rewards. For binary rewards: keep j successes
    and m - j failures, with j the value closest to m/2 in ``[max(0, m - (n - K)), min(K, m)]``.

    Choices (docs §7.6): for odd m the tie between floor(m/2) and ceil(m/2) goes to **ceil(m/2)** (what the code
    does in float32 numpy); within a class the lowest flat indices (first arrivals) are kept. A prompt with
    ``N_i <= m`` valid rollouts keeps all of them (PODS always has n > m; this only arises with padding).
    Fixed-budget adaptation (docs §7.4): none, B = P n and P m rollouts train.

    Args:
      keep: static m >= 1, rollouts kept per prompt.

    Returns:
      keep_B, float32 0/1.
    """
    keep = validation.check_int(keep, "keep", minimum=1)
    return _subset_with_target(rewards_B, prompt_ids_B, num_prompts, keep, valid_B, positives_target=(keep + 1) // 2)


# ---------------------------------------------------------------------------------------------------------
# Reinforce-Ada (arXiv 2510.04996), docs/allocators.md §6, the "balanced" variant.


def _check_round_state(counts_P, successes_P) -> tuple[Array, Array]:
    counts_P, successes_P = jnp.asarray(counts_P), jnp.asarray(successes_P)
    if counts_P.ndim != 1:
        raise ValueError(f"counts_P must have shape (P,), got {counts_P.shape}")
    if successes_P.shape != counts_P.shape:
        raise ValueError(f"successes_P must have shape (P,) = {counts_P.shape} like counts_P, got {successes_P.shape}")
    if not validation.is_traced(counts_P, successes_P):
        counts, successes = np.asarray(counts_P), np.asarray(successes_P)
        if np.any(successes < 0) or np.any(successes > counts):
            raise ValueError("successes_P must lie in [0, counts_P] (successes among the rollouts seen)")
    return counts_P, successes_P


def reinforce_ada_finished(counts_P: Array, successes_P: Array, keep: int) -> Array:
    """Reinforce-Ada's "balanced" exit test (Xiong et al., "Reinforce-Ada", arXiv 2510.04996; docs §6.2): a prompt
    is finished once its rollouts seen so far hold ``>= floor(n/2)`` successes and ``>= n - floor(n/2)`` failures,
    n = ``keep`` (``rollout.n``).

    Args:
      counts_P: rollouts seen per prompt (this step, all rounds so far).
      successes_P: successes among them.
      keep: static n >= 1.

    Returns:
      bool (P,).
    """
    keep = validation.check_int(keep, "keep", minimum=1)
    counts_P, successes_P = _check_round_state(counts_P, successes_P)
    return _finished(counts_P, successes_P, keep=keep)


@functools.partial(jax.jit, static_argnames=("keep",))
def _finished(counts_P, successes_P, *, keep):
    positives_needed = keep // 2
    return (successes_P >= positives_needed) & (counts_P - successes_P >= keep - positives_needed)


def _round_robin(amount: Array, mask_P: Array) -> Array:
    """``amount`` over the prompts in ``mask_P`` in index order: ``floor(amount/k)`` each and one more to the first
    ``amount mod k`` of them (k = |mask|; 0 everywhere when k = 0)."""
    k = jnp.sum(mask_P.astype(jnp.int32))
    safe_k = jnp.maximum(k, 1)
    rank_P = jnp.cumsum(mask_P.astype(jnp.int32)) - 1
    share_P = amount // safe_k + (rank_P < amount % safe_k).astype(jnp.int32)
    return jnp.where(mask_P, share_P, 0).astype(jnp.int32)


def reinforce_ada_round(counts_P: Array, successes_P: Array, remaining, *, round_size: int, keep: int) -> Array:
    """Rollouts per prompt in Reinforce-Ada's next sampling round under a fixed budget (arXiv 2510.04996; docs §6).

    Published rule (``_generate_multi_round_adaptive_downsampling``): each round gives every active (unfinished,
    :func:`reinforce_ada_finished`) prompt M = ``round_size`` rollouts, for at most R rounds.

    Fixed-budget adaptation (docs §6.4): the budget replaces R. With A the active prompts and ``remaining`` the
    rollouts left this step:
      * ``|A| >= 1`` and ``|A| M <= remaining``: every active prompt gets M;
      * ``|A| >= 1`` and ``|A| M > remaining`` (the last, partial round): ``remaining`` goes round-robin over the
        active prompts in index order (``floor(remaining/|A|)`` each, the first ``remaining mod |A|`` one more);
      * ``|A| = 0``: ``remaining`` goes round-robin over all P prompts in index order (those rollouts only feed the
        global baseline).
    So ``sum(extra_P) = min(remaining, |A| M)`` when a prompt is active and ``remaining`` when none is; each round
    spends >= 1 rollout while ``remaining > 0``, and the loop "sample ``extra_P``, update counts, subtract
    ``sum(extra_P)``, repeat while ``remaining > 0``" spends the step's budget exactly.

    Args:
      counts_P, successes_P: rollouts seen per prompt this step and their successes.
      remaining: rollouts left (int >= 0; may be traced; a traced negative value is treated as 0).
      round_size: static M >= 1.
      keep: static n >= 1 (the exit test's n).

    Returns:
      extra_P, int32.
    """
    round_size = validation.check_int(round_size, "round_size", minimum=1)
    keep = validation.check_int(keep, "keep", minimum=1)
    remaining = jnp.asarray(remaining)
    if remaining.ndim != 0 or not jnp.issubdtype(remaining.dtype, jnp.integer):
        raise ValueError(f"remaining must be an integer scalar, got shape {remaining.shape} dtype {remaining.dtype}")
    if not validation.is_traced(remaining) and int(remaining) < 0:
        raise ValueError(f"remaining must be >= 0, got {int(remaining)}")
    counts_P, successes_P = _check_round_state(counts_P, successes_P)
    return _round(counts_P, successes_P, remaining, round_size=round_size, keep=keep)


@functools.partial(jax.jit, static_argnames=("round_size", "keep"))
def _round(counts_P, successes_P, remaining, *, round_size, keep):
    remaining = jnp.maximum(remaining.astype(jnp.int32), 0)
    active_P = ~_finished(counts_P, successes_P, keep=keep)
    num_active = jnp.sum(active_P.astype(jnp.int32))
    full_round = (num_active > 0) & (num_active * round_size <= remaining)
    pool_P = jnp.where(num_active > 0, active_P, True)
    return jnp.where(full_round, jnp.where(active_P, round_size, 0), _round_robin(remaining, pool_P)).astype(jnp.int32)


def balanced_subset(rewards_B: Array, prompt_ids_B: Array, num_prompts: int, keep: int,
                    valid_B: Optional[Array] = None) -> Array:
    """Reinforce-Ada's "balanced" down-sampling (arXiv 2510.04996; docs §6.2): which rollouts train.

    Published rule: a finished prompt keeps its first ``floor(n/2)`` successes and first ``n - floor(n/2)`` failures
    (n = ``keep``); an unfinished one after the last round keeps ``take = min(n, seen)`` rollouts with the same
    targets, filled from the other class when one is short (:func:`class_split`). Both are this one rule:
    ``take = min(n, N_i)`` with ``floor(n/2)`` positives targeted, first arrivals (flat order) within a class.
    Every rollout seen stays in the flat layout (weight 0 when not kept) and still enters the global baseline
    (docs §6.6); rollouts a prompt received after it finished come later in flat order, so they are never kept.

    Returns:
      keep_B, float32 0/1.
    """
    keep = validation.check_int(keep, "keep", minimum=1)
    return _subset_with_target(rewards_B, prompt_ids_B, num_prompts, keep, valid_B, positives_target=keep // 2)
