"""Loss weights with SERA's multiplicity correction (docs/method.md §4).

The policy-gradient surrogate is ``L = -sum_b w_b A_b log pi(y_b | x_b)`` (per token: ``w_bt``).

* Corrected: every prompt's rollouts share a total weight of ``1/P``,
  ``L = -(1/P) sum_i (1/N_i) sum_j A_ij log pi(y_ij|x_i)``, so ``E[grad L] = (1/P) sum_i s_i grad log p_i``
  whatever the allocation.
* Uncorrected (the usual batch mean, the ablation): every rollout weighs ``1/B``, so prompt i weighs
  ``N_i / B`` and ``E[grad L] = (1/B) sum_i N_i s_i grad log p_i``: SERA would over-weight the prompts it
  gave more rollouts to.

Token-level aggregation of ``log pi(y|x) = sum_t log pi(y_t | ...)``:

* ``sequence_sum``: the sequence log-prob (sum of its tokens): ``w_bt = w_b m_bt``. This is the estimator
  whose expectation the scale factors describe.
* ``sequence_mean``: per-sequence mean of token log-probs (length-normalised): ``w_bt = w_b m_bt / R_b``.
* ``token_mean``: corrected, prompt i's tokens share ``1/P`` equally, ``w_bt = m_bt / (P sum_j R_ij)``;
  uncorrected, verl's token-mean over the whole batch, ``w_bt = m_bt / sum_b R_b``.
* ``token_mean_microbatch``: the SERA authors' loss (a verl fork), verl's ``agg_loss(loss_agg_mode="token-mean")``
  on each micro-batch (``microbatch_rows`` consecutive rows of the flat layout; 0: the whole batch is one) divided
  by the ``M = B / microbatch_rows`` micro-batches of gradient accumulation, each advantage scaled by the authors'
  prompt weight ``c_b = N0 / N_i`` with ``N0 = B / P`` (``c_b = 1`` without the correction):
  ``w_bt = c_b m_bt / (M T_mb(b))``, ``T_mb = sum_{b in mb} R_b`` the micro-batch's tokens (``max(T_mb, 1)``).
  What holds exactly: ``c_b / B = 1/(P N_i)``, our corrected ``w_b``, so the sequence-level analogue
  (``w_bt = c_b m_bt / B``, verl's mean over rollouts) is our corrected ``sequence_sum`` (each prompt with rollouts
  totals ``1/P``). At token level it is not: with ``M = 1`` prompt i totals ``(1/P) (T_i / N_i) / (T / B)``, ``T_i``
  its tokens and ``T`` the batch's (its mean response length over the batch's); uncorrected, the weights sum to 1
  when every micro-batch has a token (one without adds 0), and ``M = 1`` is the uncorrected ``token_mean``.

With a train mask ``t_b`` (``train_B``: 1 for the rollouts that enter the loss, 0 for those a method discards,
e.g. DAPO's all-0/all-1 groups or PODS's down-sampling) every formula runs over the kept rollouts: ``N_i`` counts
prompt i's kept rollouts and ``P`` becomes ``P_kept``, the prompts with any kept rollout (DAPO's normalisation by
the groups that train); without the correction, ``B`` becomes the kept rollouts' number. No kept rollout: all 0.
``token_mean_microbatch`` likewise (``c_b = (B_kept / P_kept) / N_i``, ``T_mb`` the kept tokens), but its
micro-batches stay the chunks of the flat layout, dropped rows included (they are not compacted away).

Here ``m_bt`` is the response-token mask (``token_mask_BxR``: B rollouts x R response tokens) and
``R_b = sum_t m_bt`` the number of response tokens of rollout b that enter the loss.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax.numpy as jnp

from sera_jax.core import layout, validation

Array = jnp.ndarray

AGGREGATIONS = ("sequence_sum", "sequence_mean", "token_mean", "token_mean_microbatch")


def rollout_weights(prompt_ids_B: Array, num_prompts: int, *, correction: bool = True, dtype=jnp.float32,
                    train_B: Optional[Array] = None) -> Array:
    """Per-rollout weights ``w_b``: ``1 / (P N_i)`` with the correction, ``1 / B`` without. Prompt ids in
    ``[0, num_prompts)``; a prompt without rollouts has no row (and so no weight). Sums to 1 when every prompt has
    rollouts (0 when ``train_B`` keeps nothing; with it, over the kept rollouts: see the module docstring)."""
    num_prompts, prompt_ids_B, train_B = _check_layout(prompt_ids_B, num_prompts, train_B)
    return _rollout_weights(prompt_ids_B, num_prompts, correction=correction, dtype=dtype, train_B=train_B)


def _check_layout(prompt_ids_B, num_prompts, train_B):
    """The flat layout's checks (``core.validation``): P an int >= 1, ids in [0, P), ``train_B`` a 0/1 mask."""
    num_prompts = validation.check_num_prompts(num_prompts)
    prompt_ids_B = validation.check_prompt_ids(prompt_ids_B, num_prompts)
    if train_B is not None:
        train_B = validation.check_mask(train_B, "train_B", prompt_ids_B.shape)
    return num_prompts, prompt_ids_B, train_B


def _rollout_weights(prompt_ids_B, num_prompts, *, correction, dtype, train_B):
    num_rollouts = prompt_ids_B.shape[0]
    if train_B is None:
        if not correction:
            return jnp.full((num_rollouts,), 1.0 / num_rollouts, dtype)
        counts_P = layout._counts(prompt_ids_B, num_prompts).astype(dtype)
        return 1.0 / (num_prompts * counts_P[prompt_ids_B])
    kept = jnp.asarray(train_B, dtype)
    if not correction:
        return kept / jnp.maximum(jnp.sum(kept), 1.0)
    counts_P = layout._segment_sum(kept, prompt_ids_B, num_prompts)
    prompts_kept = jnp.maximum(jnp.sum(counts_P > 0), 1).astype(dtype)
    return kept / (prompts_kept * jnp.maximum(counts_P[prompt_ids_B], 1.0))


def loss_weights(
    prompt_ids_B: Array,
    num_prompts: int,
    *,
    token_mask_BxR: Optional[Array] = None,
    aggregation: str = "sequence_sum",
    correction: bool = True,
    dtype=jnp.float32,
    train_B: Optional[Array] = None,
    microbatch_rows: int = 0,
) -> Array:
    """Weights for ``L = -sum w * A * log pi``: shape (B,) without a token mask, (B, R) with one.

    Args:
      prompt_ids_B: prompt of each rollout, in [0, num_prompts) (ValueError otherwise: an id past P would weigh
        ``1 / (P * 0)``). A prompt without rollouts has no row and weighs nothing; it still counts in ``P`` (the
        authors' ``N0 / N_i`` inside a mean over all ``B = P N0`` rows).
      num_prompts: static P.
      token_mask_BxR: 1 on response tokens that enter the loss (needed by every aggregation but ``sequence_sum``).
      aggregation: ``sequence_sum``, ``sequence_mean``, ``token_mean`` or ``token_mean_microbatch`` (see the module
        docstring).
      correction: SERA's multiplicity correction (False gives the ablation: the plain batch mean).
      train_B: optional 0/1 mask of the rollouts that enter the loss (default: all of them).
      microbatch_rows: static rows of a loss micro-batch for ``token_mean_microbatch`` (0: the whole batch); must
        divide B (checked whatever the aggregation; the others do not read it).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {list(AGGREGATIONS)}")
    num_prompts, prompt_ids_B, train_B = _check_layout(prompt_ids_B, num_prompts, train_B)
    num_rollouts = prompt_ids_B.shape[0]
    if (isinstance(microbatch_rows, bool) or not isinstance(microbatch_rows, int) or microbatch_rows < 0
            or (microbatch_rows and num_rollouts % microbatch_rows)):
        raise ValueError(f"microbatch_rows={microbatch_rows!r} must be an int >= 0 dividing B = {num_rollouts} "
                         "(0: the whole batch is one micro-batch)")
    if token_mask_BxR is None:
        if aggregation != "sequence_sum":
            raise ValueError(f"aggregation {aggregation!r} needs token_mask_BxR")
        return _rollout_weights(prompt_ids_B, num_prompts, correction=correction, dtype=dtype, train_B=train_B)
    token_mask_BxR = jnp.asarray(token_mask_BxR)
    if token_mask_BxR.ndim != 2 or token_mask_BxR.shape[0] != prompt_ids_B.shape[0]:
        raise ValueError(
            f"token_mask_BxR must have shape (B, R) with B = {prompt_ids_B.shape[0]}, got {token_mask_BxR.shape}")
    mask = token_mask_BxR.astype(dtype)
    if train_B is not None:
        mask = mask * jnp.asarray(train_B, dtype)[:, None]
    lengths_B = jnp.sum(mask, axis=1)
    row_weights = functools.partial(_rollout_weights, prompt_ids_B, num_prompts, correction=correction, dtype=dtype,
                                    train_B=train_B)
    if aggregation == "sequence_sum":
        return row_weights()[:, None] * mask
    if aggregation == "sequence_mean":
        return (row_weights() / jnp.maximum(lengths_B, 1.0))[:, None] * mask
    if aggregation == "token_mean_microbatch":
        kept_rollouts = num_rollouts if train_B is None else jnp.sum(jnp.asarray(train_B, dtype))
        prompt_weight_B = kept_rollouts * row_weights()  # B / (P N_i) = N0 / N_i, or 1 (0 on dropped rows)
        rows = microbatch_rows or num_rollouts
        tokens_M = jnp.sum(lengths_B.reshape(num_rollouts // rows, rows), axis=1)
        tokens_B = jnp.repeat(jnp.maximum(tokens_M, 1.0), rows)
        return (prompt_weight_B / (tokens_M.shape[0] * tokens_B))[:, None] * mask
    # token_mean
    if not correction:
        return mask / jnp.maximum(jnp.sum(lengths_B), 1.0)
    tokens_P = layout._segment_sum(lengths_B, prompt_ids_B, num_prompts)
    prompts = num_prompts if train_B is None else jnp.maximum(jnp.sum(tokens_P > 0), 1).astype(dtype)
    return mask / (prompts * jnp.maximum(tokens_P[prompt_ids_B], 1.0))[:, None]


def effective_prompt_weights(scales_P: Array, counts_P: Array, *, correction: bool = True) -> Array:
    """Expected weight of ``grad log p_i`` in the aggregate gradient: ``s_i / P`` or ``N_i s_i / B``, and 0 for a
    prompt with ``N_i = 0``: it has no row in the loss, whatever factor it is handed (``s(p, 0) = 0`` too)."""
    scales_P = jnp.asarray(scales_P)
    counts_P = jnp.asarray(counts_P)
    if scales_P.ndim != 1:
        raise ValueError(f"scales_P must have shape (P,), got {scales_P.shape}")
    if counts_P.shape != scales_P.shape:
        raise ValueError(f"counts_P must have shape (P,) = {scales_P.shape} like scales_P, got {counts_P.shape}")
    validation.require(counts_P, lambda n: ~(n >= 0), "counts_P must be >= 0 (rollouts per prompt)")
    counts_P = counts_P.astype(scales_P.dtype)
    if correction:
        return jnp.where(counts_P > 0, scales_P, 0.0) / scales_P.shape[0]
    return counts_P * scales_P / jnp.maximum(jnp.sum(counts_P), 1.0)
