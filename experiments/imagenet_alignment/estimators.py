"""Group estimators of the controlled classification setting as cotangents on the logits (SERA.md §8A).

The classifier is the policy: prompt i is an image with label ``y_i``, a rollout is a label ``y_ij`` drawn
from ``pi_i = softmax(logits_i)``, its reward is ``r_ij = 1{y_ij = y_i}`` and ``p_i = pi_i[y_i]`` exactly.
The score of a rollout with respect to the logits is ``grad_logits log pi_i(y_ij) = onehot(y_ij) - pi_i``, so
an estimator ``g = sum_ij w_ij A_ij grad_theta log pi_i(y_ij)`` is the vector-Jacobian product of the
logits with the cotangent

    c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)                                         (P x K)

and the exact likelihood gradient ``G* = (1/P) sum_i grad log p_i`` is the VJP of
``(1/P) (onehot(y_i) - pi_i)``: the (negated) mean cross-entropy gradient. Everything in this module is
pure jnp on ``(P, K)`` probabilities; no model is involved, so the maths is testable in isolation.

Rollouts use the flat layout of SERA.md §6: ``prompt_ids`` from the counts, labels drawn by inverse-CDF
binary search (``O(B log K)`` work, ``O(B + P K)`` memory: nothing of shape ``B x K`` is built, which
matters for ImageNet's K = 1000 and B up to P * 128). The training step uses the exact layout: B rows, the
budget. The analysis compares many budgets with one compiled program: its layout has a static number of
rows B (the largest budget) and the rows past the (traced) budget belong to an extra padding group (id P)
with zero loss weight. Rollout j of prompt i is labelled from a uniform number keyed by (i, j) alone
(``rollout_uniforms``): common random numbers, so that methods drawing with one key share every rollout they
both hold (the pilot's n0 are ranks 0..n0-1) and their differences are the allocations'.

Shape letters: P prompts (images), K classes, B rows of the flat layout, n0 pilot rollouts per prompt,
Y pilot outcomes (independent pilots averaged for an expectation), g groups of those outcomes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, xlog1py, xlogy

from sera_jax import core

Array = jnp.ndarray

# ----------------------------------------------------------------------------------------------- sampling


def label_cdf(probs_PxK: Array) -> Array:
    """Row-wise cumulative distribution of the softmax; the last column is set to 1 exactly.

    Forcing 1 makes every uniform draw u < 1 land on a class despite float rounding of the cumulative sum.
    """
    cdf_PxK = jnp.cumsum(probs_PxK, axis=1)
    return cdf_PxK.at[:, -1].set(1.0)


def sample_labels(cdf_PxK: Array, prompt_ids_B: Array, u_B: Array) -> Array:
    """Inverse-CDF sampling: ``y_b = min{k : cdf[prompt_b, k] > u_b}``, by a binary search over k.

    ``ceil(log2 K)`` gathers of one CDF entry per rollout; a class of zero probability (equal consecutive
    CDF values) is never returned.
    """
    num_classes = cdf_PxK.shape[1]
    lo_B = jnp.zeros(prompt_ids_B.shape, jnp.int32)
    hi_B = jnp.full(prompt_ids_B.shape, num_classes - 1, jnp.int32)

    def body(_, bracket):
        lo, hi = bracket
        mid = (lo + hi) // 2
        above = cdf_PxK[prompt_ids_B, mid] > u_B
        return jnp.where(above, lo, mid + 1), jnp.where(above, mid, hi)

    iterations = max(1, math.ceil(math.log2(num_classes)))
    lo_B, _ = jax.lax.fori_loop(0, iterations, body, (lo_B, hi_B))
    return lo_B


def flat_layout(counts_P: Array, total, length: int | None = None) -> Array:
    """``prompt_ids_B`` of the flat layout: ``repeat(arange(P), counts_P)``.

    ``length=None``: exactly B = ``total`` (static) rows. Otherwise B = ``length`` (static) rows, of which the
    last ``length - total`` (``total`` may be traced) get the padding id P.
    """
    if length is None:
        return core.prompt_ids_from_counts(counts_P, total)
    counts_ext = jnp.concatenate([counts_P.astype(jnp.int32), jnp.reshape(length - total, (1,)).astype(jnp.int32)])
    return core.prompt_ids_from_counts(counts_ext, length)


def rollout_uniforms(key: Array, prompt_ids_B: Array, rank_B: Array, dtype=jnp.float32) -> Array:
    """The uniform number of each rollout, keyed by (prompt, rank within the prompt):
    ``u_b = U(fold_in(fold_in(key, prompt_ids_B[b]), rank_B[b]))``.

    Common random numbers: rollout j of prompt i gets the same number in every layout that holds it, so methods
    that give prompt i different counts share its first ``min`` rollouts, and a pilot's n0 rollouts are ranks
    0..n0-1 of the same numbers. O(B) work and memory, whatever the largest count."""
    def one(i, j):
        return jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, i), j), (), dtype=dtype)

    return jax.vmap(one)(prompt_ids_B, rank_B)


def sample_rollouts(key: Array, probs_PxK: Array, counts_P: Array, total, *, length: int | None = None
                    ) -> tuple[Array, Array]:
    """``counts_P[i]`` labels of prompt i on the flat layout (see ``flat_layout``): (labels_B, prompt_ids_B).

    Rollout j of prompt i is labelled from ``rollout_uniforms(key, i, j)``: with the same key, two calls agree on
    every (prompt, rank) both hold, whatever their counts; ``sample_pilot`` draws ranks 0..n0-1.
    """
    num_prompts = probs_PxK.shape[0]
    prompt_ids = flat_layout(counts_P, total, length)
    rank = core.rank_within_prompt(prompt_ids, num_prompts + 1)
    u = rollout_uniforms(key, prompt_ids, rank, probs_PxK.dtype)
    labels = sample_labels(label_cdf(probs_PxK), jnp.minimum(prompt_ids, num_prompts - 1), u)
    return labels, prompt_ids


def sample_pilot(key: Array, probs_PxK: Array, labels_P: Array, n0: int) -> tuple[Array, Array]:
    """``n0`` pilot labels per prompt (P x n0) and their successes (P,): rollouts 0..n0-1 of each prompt as
    ``sample_rollouts`` draws them with the same ``key``."""
    num_prompts = probs_PxK.shape[0]
    pilot_ids = jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), n0)
    rank = jnp.tile(jnp.arange(n0, dtype=jnp.int32), num_prompts)
    u = rollout_uniforms(key, pilot_ids, rank, probs_PxK.dtype)
    pilot_Pxn0 = sample_labels(label_cdf(probs_PxK), pilot_ids, u).reshape(num_prompts, n0)
    return pilot_Pxn0, jnp.sum(pilot_Pxn0 == labels_P[:, None], axis=1).astype(jnp.int32)


def pilot_counts(successes_P: Array, n0: int, budget: int, *, n_min: int, n_max: int, estimator: str) -> Array:
    """SERA's total counts (pilot included) after ``n0`` pilot rollouts per prompt (SERA.md §5, ``pilot``)."""
    return core.pilot_allocate(successes_P, n0, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=False)


# ------------------------------------------------------------------------------------------- cotangents


def score_directions(probs_PxK: Array, labels_P: Array) -> Array:
    """``grad_logits log p_i = onehot(y_i) - pi_i`` (P x K)."""
    return jax.nn.one_hot(labels_P, probs_PxK.shape[1], dtype=probs_PxK.dtype) - probs_PxK


def exact_cotangent(probs_PxK: Array, labels_P: Array) -> Array:
    """Cotangent of the exact gradient ``G* = (1/P) sum_i grad log p_i``: ``(1/P)(onehot(y_i) - pi_i)``."""
    return score_directions(probs_PxK, labels_P) / probs_PxK.shape[0]


def success_probabilities(probs_PxK: Array, labels_P: Array) -> Array:
    """``p_i = pi_i[y_i]``."""
    return jnp.take_along_axis(probs_PxK, labels_P[:, None], axis=1)[:, 0]


def estimator_cotangent(
    probs_PxK: Array,
    labels_P: Array,
    sampled_B: Array,
    prompt_ids_B: Array,
    *,
    estimator: str,
    correction: bool | Array,
    budget=None,
) -> Array:
    """``c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)`` for one draw of rollouts (P x K).

    ``A`` are the group advantages of ``estimator`` (``sera_jax.core.advantages``) and ``w`` the loss weights
    of ``sera_jax.core.loss_weights``: ``1/(P N_i)`` with the multiplicity correction, ``1/budget`` without.
    ``correction`` is a Python bool, or a traced boolean scalar (both weights are formed and one is selected:
    methods with different losses then share one vmapped program). Rows with the padding id P (layouts of B
    rows longer than the ``budget``; ``budget=None``: no padding) form one more group for ``core`` and get
    weight 0: core's weights over P + 1 groups and B rows are rescaled by ``(P + 1)/P`` (corrected) or
    ``B/budget`` (uncorrected). The one-hot sum is a scatter-add: nothing of shape ``B x K`` is formed.
    """
    num_prompts = probs_PxK.shape[0]
    length = sampled_B.shape[0]
    groups = num_prompts + 1
    labels_ext = jnp.concatenate([labels_P, jnp.full((1,), -1, labels_P.dtype)])  # padding never succeeds
    rewards_B = (sampled_B == labels_ext[prompt_ids_B]).astype(probs_PxK.dtype)
    adv_B = core.advantages(rewards_B, prompt_ids_B, groups, estimator)

    def weights(corrected: bool) -> Array:
        w_B = core.loss_weights(prompt_ids_B, groups, correction=corrected, dtype=probs_PxK.dtype)
        return w_B * (groups / num_prompts if corrected else length / (length if budget is None else budget))

    if isinstance(correction, bool):
        w_B = weights(correction)
    else:
        w_B = jnp.where(correction, weights(True), weights(False))
    coef_B = jnp.where(prompt_ids_B < num_prompts, w_B * adv_B, 0.0)
    onehot_sum = jnp.zeros((groups,) + probs_PxK.shape[1:], probs_PxK.dtype).at[prompt_ids_B, sampled_B].add(coef_B)
    coef_sum_P = core.segment_sum(coef_B, prompt_ids_B, groups)[:num_prompts]
    return onehot_sum[:num_prompts] - coef_sum_P[:, None] * probs_PxK


def expected_cotangent(
    probs_PxK: Array,
    labels_P: Array,
    counts_P: Array,
    *,
    estimator: str,
    correction: bool | Array,
    max_n: int,
) -> tuple[Array, Array]:
    """Analytic expected cotangent for a fixed allocation (any counts), and the effective scales ``s_eff_P``.

    ``E[c_i] = v_i s(p_i, N_i) (onehot(y_i) - pi_i)`` with ``v_i = 1/P`` (corrected) or ``N_i / budget``
    (uncorrected; SERA.md §4), i.e. ``E[g] = (1/P) sum_i s_eff_i grad log p_i`` with ``s_eff_i = P v_i s_i``.
    ``correction``: a Python bool or a traced boolean scalar (as in ``estimator_cotangent``).
    """
    num_prompts = probs_PxK.shape[0]
    p_P = success_probabilities(probs_PxK, labels_P)
    scales_P = core.scale_factor(p_P, counts_P, estimator, max_n=max_n, check=False)
    if isinstance(correction, bool):
        weights_P = core.effective_prompt_weights(scales_P, counts_P, correction=correction)
    else:
        weights_P = jnp.where(correction, core.effective_prompt_weights(scales_P, counts_P, correction=True),
                              core.effective_prompt_weights(scales_P, counts_P, correction=False))
    return weights_P[:, None] * score_directions(probs_PxK, labels_P), num_prompts * weights_P


# ------------------------------------------------------------------ expected cotangent with a pilot


def failure_directions(probs_PxK: Array, labels_P: Array) -> Array:
    """``E[onehot(y') - pi_i | y' != y_i] = pi_{-y} / (1 - p_i) - pi_i`` (P x K).

    ``1 - p_i`` is summed from the other classes (no cancellation when p is close to 1); a prompt whose
    failures have zero probability gets the zero vector (it is multiplied by zero-probability terms anyway).
    """
    others_PxK = probs_PxK * (1.0 - jax.nn.one_hot(labels_P, probs_PxK.shape[1], dtype=probs_PxK.dtype))
    q_P = jnp.sum(others_PxK, axis=1, keepdims=True)
    fail_PxK = others_PxK / jnp.where(q_P > 0, q_P, 1.0)
    return jnp.where(q_P > 0, fail_PxK - probs_PxK, 0.0)


def conditional_moments_table(
    p_P: Array, k0_P: Array, n0: int, counts_P: Array, *, estimator: str, max_extra: int
) -> tuple[Array, Array]:
    """``a = E[K f(1,K,N)]`` and ``b = E[(N-K) f(0,K,N)]`` given ``k0`` pilot successes of ``n0``, for any
    estimator, by summing over ``K' = K - k0 ~ Binom(N - n0, p)``: O(P max_extra) work.

    Given (K, N) a prompt's cotangent has expectation ``w (a (onehot(y) - pi) + b (E[onehot(y')|fail] - pi))``:
    success labels are y and failure labels are i.i.d. from the failure-conditioned policy, whatever the
    pilot did. ``max_extra`` (static) bounds ``N - n0``; ``k_PxM`` and ``n_PxM`` run over the
    M = max_extra + 1 values of K'.
    """
    f = core.get_estimator(estimator).advantage
    dtype = p_P.dtype
    extra_P = (counts_P - n0).astype(dtype)[:, None]
    kk = jnp.arange(max_extra + 1, dtype=dtype)[None, :]
    valid = kk <= extra_P
    safe_m = jnp.maximum(extra_P, kk)  # keeps gammaln's arguments positive where masked out
    log_pmf = (gammaln(safe_m + 1) - gammaln(kk + 1) - gammaln(safe_m - kk + 1)
               + xlogy(kk, p_P[:, None]) + xlog1py(safe_m - kk, -p_P[:, None]))
    pmf = jnp.where(valid, jnp.exp(log_pmf), 0.0)
    k_PxM = k0_P.astype(dtype)[:, None] + kk
    n_PxM = counts_P.astype(dtype)[:, None] * jnp.ones_like(kk)
    a_P = jnp.sum(pmf * k_PxM * f(jnp.ones_like(k_PxM), k_PxM, n_PxM), axis=1)
    b_P = jnp.sum(pmf * (n_PxM - k_PxM) * f(jnp.zeros_like(k_PxM), k_PxM, n_PxM), axis=1)
    return a_P, b_P


def conditional_moments(
    p_P: Array, k0_P: Array, n0: int, counts_P: Array, *, estimator: str, max_extra: int
) -> tuple[Array, Array]:
    """``(a, b)`` of ``conditional_moments_table``, in closed form where the advantage allows it.

    With ``m = N - n0`` fresh rollouts and ``z = 1{k0 = 0} (1 - p)^m = P(K = 0)``:

    * ``maxrl`` (``A = (N - K)/K`` on successes, ``-1`` on failures, 0 if K = 0):
      ``a = -b = E[(N - K) 1{K > 0}] = N - k0 - m p - N z``;
    * ``maxrl_no_baseline`` (``A = N/K`` on successes, 0 on failures): ``a = N (1 - z)``, ``b = 0``.

    Other estimators use the O(P max_extra) table.
    """
    dtype = p_P.dtype
    n_P = counts_P.astype(dtype)
    m_P = n_P - n0
    k0 = k0_P.astype(dtype)
    z_P = jnp.where(k0_P == 0, jnp.exp(xlog1py(m_P, -p_P)), 0.0)  # xlog1py: exact at m = 0 and p = 1
    if estimator == "maxrl":
        a_P = n_P - k0 - m_P * p_P - n_P * z_P
        return a_P, -a_P
    if estimator == "maxrl_no_baseline":
        return n_P * (1.0 - z_P), jnp.zeros_like(p_P)
    return conditional_moments_table(p_P, k0_P, n0, counts_P, estimator=estimator, max_extra=max_extra)


def pilot_successes(key: Array, p_P: Array, n0: int, num_draws: int) -> Array:
    """Successes among ``n0`` pilot rollouts per prompt, for Y = ``num_draws`` independent pilots (Y x P)."""
    return jnp.sum(jax.random.bernoulli(key, p_P, (num_draws, n0, p_P.shape[0])), axis=1).astype(jnp.int32)


def pilot_expected_from_outcomes(
    probs_PxK: Array,
    labels_P: Array,
    k0_YxP: Array,
    counts_YxP: Array,
    *,
    n0: int,
    estimator: str,
    max_extra: int,
    num_groups: int = 1,
) -> tuple[Array, Array]:
    """Rao-Blackwellised expected cotangent of ``sera_pilot`` from Y pilot outcomes and their allocations.

    The allocation depends on the pilot successes ``k0`` of every prompt, so there is no closed form; we
    average over pilot outcomes the exact conditional expectation given ``k0`` (corrected weights
    ``w_i = 1/(P N_i)``): ``E[c_i | k0] = w_i (a_i (onehot(y_i) - pi_i) + b_i (E[onehot|fail] - pi_i))``
    (``conditional_moments``). Unbiased; the Monte Carlo error comes from the pilot outcomes only. The Y
    outcomes are split into g = ``num_groups`` groups, one cotangent each (g x P x K), so that the caller can
    tell that noise from the signal. Also returns ``s_eff_P = P E[w_i (a_i - b_i p_i / (1 - p_i))]``, the
    factor multiplying ``grad log p_i`` in the expected gradient.
    """
    num_prompts = probs_PxK.shape[0]
    num_draws = k0_YxP.shape[0]
    p_P = success_probabilities(probs_PxK, labels_P)
    onehot_PxK = jax.nn.one_hot(labels_P, probs_PxK.shape[1], dtype=probs_PxK.dtype)
    q_P = jnp.sum(probs_PxK * (1.0 - onehot_PxK), axis=1)  # 1 - p without cancellation

    def one(k0_P, counts_P):
        a_P, b_P = conditional_moments(p_P, k0_P, n0, counts_P, estimator=estimator, max_extra=max_extra)
        w_P = 1.0 / (num_prompts * counts_P.astype(p_P.dtype))
        return w_P * a_P, w_P * b_P

    # lax.map keeps the (draws x P x max_extra) binomial tables to a few draws at a time.
    wa_YxP, wb_YxP = jax.lax.map(lambda args: one(*args), (k0_YxP, counts_YxP), batch_size=min(8, num_draws))
    per_group = num_draws // num_groups
    alpha_gxP = jnp.mean(wa_YxP[:per_group * num_groups].reshape(num_groups, per_group, num_prompts), axis=1)
    beta_gxP = jnp.mean(wb_YxP[:per_group * num_groups].reshape(num_groups, per_group, num_prompts), axis=1)
    cot_gxPxK = (alpha_gxP[:, :, None] * score_directions(probs_PxK, labels_P)[None]
                 + beta_gxP[:, :, None] * failure_directions(probs_PxK, labels_P)[None])
    ratio_P = jnp.where(q_P > 0, p_P / jnp.where(q_P > 0, q_P, 1.0), 0.0)
    s_eff_P = num_prompts * (jnp.mean(alpha_gxP, axis=0) - jnp.mean(beta_gxP, axis=0) * ratio_P)
    return cot_gxPxK, s_eff_P
