"""Group estimators of the controlled classification setting as cotangents on the logits (docs/method.md §8A).

The classifier is the policy: prompt i is an image with label ``y_i``, a rollout is a label ``y_ij`` drawn
from ``pi_i = softmax(logits_i)``, its reward is ``r_ij = 1{y_ij = y_i}`` and ``p_i = pi_i[y_i]`` exactly.
The score of a rollout with respect to the logits is ``grad_logits log pi_i(y_ij) = onehot(y_ij) - pi_i``, so
an estimator ``g = sum_ij w_ij A_ij grad_theta log pi_i(y_ij)`` is the vector-Jacobian product of the
logits with the cotangent

    c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)                                         (P x K)

and the exact likelihood gradient ``G* = (1/P) sum_i grad log p_i`` is the VJP of
``(1/P) (onehot(y_i) - pi_i)``: the (negated) mean cross-entropy gradient. Everything in this module is
pure jnp on ``(P, K)`` probabilities; no model is involved, so the maths is testable in isolation.

Rollouts use the flat layout of docs/method.md §6: ``prompt_ids`` from the counts, labels drawn by inverse-CDF
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
import numpy as np
from jax.scipy.special import gammaln, xlog1py, xlogy

from sera_jax import core
from sera_jax.core import dars as dars_lib
from sera_jax.core import keep as keep_lib

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
    """SERA's total counts (pilot included) after ``n0`` pilot rollouts per prompt (docs/method.md §5, ``pilot``)."""
    return core.pilot_allocate(successes_P, n0, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=False)


# ------------------------------------------------------------------------------------------- cotangents


def score_directions(probs_PxK: Array, labels_P: Array) -> Array:
    """``grad_logits log p_i = onehot(y_i) - pi_i`` (P x K)."""
    return jax.nn.one_hot(labels_P, probs_PxK.shape[1], dtype=probs_PxK.dtype) - probs_PxK


def exact_cotangent(probs_PxK: Array, labels_P: Array) -> Array:
    """Cotangent of the exact gradient ``G* = (1/P) sum_i grad log p_i``: ``(1/P)(onehot(y_i) - pi_i)``."""
    return score_directions(probs_PxK, labels_P) / probs_PxK.shape[0]


def projected_scales(cot_MxPxK: Array, probs_PxK: Array, labels_P: Array) -> Array:
    """Each draw's estimate of every prompt's effective scale: ``x_mi = P <c_i^m, d_i> / |d_i|^2`` (M x P), with
    ``d_i = onehot(y_i) - pi_i`` the score direction of ``grad log p_i``.

    For any method whose counts, kept rollouts, advantages and weights are decided from the rewards alone,
    ``E[c_i] = (1/P) s_eff_i d_i``: given every reward, prompt i's successes have label y_i (score ``d_i``) and its
    failures are i.i.d. from the failure-conditioned policy, whose expected score is ``-p_i/(1 - p_i) d_i`` (the
    two average to ``E[onehot(y) - pi_i] = 0``). So the mean of ``x_mi`` over draws is unbiased for ``s_eff_i``,
    the prompt's weight relative to the exact objective's (``E g = (1/P) sum_i s_eff_i grad log p_i``); for a
    closed form, ``expected_cotangent``'s ``s_eff_P``. A prompt with ``d_i = 0`` (p = 1 in float) gets 0.
    """
    d_PxK = score_directions(probs_PxK, labels_P)
    norm_sq_P = jnp.sum(d_PxK * d_PxK, axis=1)
    dots_MxP = jnp.einsum("mpk,pk->mp", cot_MxPxK, d_PxK, precision=jax.lax.Precision.HIGHEST)
    safe_P = jnp.where(norm_sq_P > 0, norm_sq_P, 1.0)
    return jnp.where(norm_sq_P > 0, probs_PxK.shape[0] * dots_MxP / safe_P, 0.0)


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


def scale_factors(p_P: Array, counts_P: Array, *, estimator: str, max_n: int) -> Array:
    """``s(p_i, N_i)`` (``core.scale_factor``) of the prompts with rollouts, and 0 where ``N_i = 0``: a prompt
    without rollouts has no advantage, so no gradient (docs/method.md §2).

    Masked here, whatever core's convention for N = 0 (its closed forms taken at N = 0 give ``1 - 1/(1 - p)``:
    -10,266 at p = 0.9999, -inf at p = 1); core only ever sees N >= 1. Every consumer of counts in this experiment
    takes its factors from here: the expected cotangents, the effective scales and their statistics, the
    gradient-norm figure, the p-estimate study."""
    scales_P = core.scale_factor(p_P, jnp.maximum(counts_P, 1), estimator, max_n=max_n, check=False)
    return jnp.where(counts_P > 0, scales_P, 0.0)


@jax.jit
def scale_statistics(s_P: Array, counts_P: Array) -> dict[str, Array]:
    """``core.scale_factor_stats`` (min, max, mean, CV) of the factors ``s_P`` over the prompts with rollouts
    (``counts_P > 0``); NaN when no prompt has any. A prompt without rollouts has factor 0 by definition
    (``scale_factors``); left in, it would make ``min`` 0 for any rule that skips prompts (the released SERA) and
    say nothing about the prompts the rule does sample. How many those are is ``active_frac`` (analysis.py)."""
    s_P = jnp.asarray(s_P)
    active_P = jnp.asarray(counts_P) > 0
    count = jnp.sum(active_P)
    mean = jnp.sum(jnp.where(active_P, s_P, 0.0)) / jnp.maximum(count, 1)
    std = jnp.sqrt(jnp.sum(jnp.where(active_P, (s_P - mean) ** 2, 0.0)) / jnp.maximum(count, 1))
    cv = jnp.where(mean > 0, std / jnp.where(mean > 0, mean, 1.0), 0.0)
    stats = {"min": jnp.min(jnp.where(active_P, s_P, jnp.inf)), "max": jnp.max(jnp.where(active_P, s_P, -jnp.inf)),
             "mean": mean, "cv": cv}
    return {k: jnp.where(count > 0, v, jnp.nan) for k, v in stats.items()}


def expected_cotangent(
    probs_PxK: Array,
    labels_P: Array,
    counts_P: Array,
    *,
    estimator: str,
    correction: bool | Array,
    max_n: int,
) -> tuple[Array, Array]:
    """Analytic expected cotangent for a fixed allocation (any counts, 0 included), and the effective scales
    ``s_eff_P``.

    ``E[c_i] = v_i s(p_i, N_i) (onehot(y_i) - pi_i)`` with ``v_i = 1/P`` (corrected) or ``N_i / budget``
    (uncorrected; docs/method.md §4), i.e. ``E[g] = (1/P) sum_i s_eff_i grad log p_i`` with ``s_eff_i = P v_i s_i``.
    A prompt without rollouts (``N_i = 0``: the released SERA's skipped prompts) has ``E[c_i] = 0`` and
    ``s_eff_i = 0`` under either loss (``scale_factors``; its weight is masked too, whatever core's weights do at
    N = 0). ``correction``: a Python bool or a traced boolean scalar (as in ``estimator_cotangent``).
    """
    num_prompts = probs_PxK.shape[0]
    p_P = success_probabilities(probs_PxK, labels_P)
    scales_P = scale_factors(p_P, counts_P, estimator=estimator, max_n=max_n)
    if isinstance(correction, bool):
        weights_P = core.effective_prompt_weights(scales_P, counts_P, correction=correction)
    else:
        weights_P = jnp.where(correction, core.effective_prompt_weights(scales_P, counts_P, correction=True),
                              core.effective_prompt_weights(scales_P, counts_P, correction=False))
    weights_P = jnp.where(counts_P > 0, weights_P, 0.0)
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
        # 1/(P N_i); 0 for a prompt without rollouts (none here: the pilot's n0 >= 1 are counted).
        w_P = jnp.where(counts_P > 0, 1.0 / (num_prompts * jnp.maximum(counts_P, 1).astype(p_P.dtype)), 0.0)
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


# ------------------------------------------------------- online and train-mask methods (docs/allocators.md §0 (c))
#
# DAPO, PODS, Reinforce-Ada and DARS decide which sampled rollouts train (a 0/1 mask on the flat layout,
# sera_jax.core.keep) and, for Reinforce-Ada and DARS, how many each prompt gets from what was sampled. With
# common random numbers prompt i's rollouts are its ranks 0..N_i-1 (``rollout_uniforms``), so an online rule only
# decides N_i; the rollouts themselves are those every method draws.

ONLINE_RULES = {"dapo": "mixed", "pods": "max_variance", "reinforce_ada": "balanced", "dars_et": "mixed"}


def train_mask(rule: str, rewards_B: Array, prompt_ids_B: Array, num_prompts: int, keep: int) -> Array:
    """The 0/1 train mask of ``rule`` (``ONLINE_RULES``) on a flat layout whose rows with id ``num_prompts`` are
    padding (never kept): DAPO's mixed groups, PODS's max-variance subset or Reinforce-Ada's balanced subset of
    ``keep`` rollouts per prompt (``sera_jax.core.keep``)."""
    valid_B = prompt_ids_B < num_prompts
    if rule == "mixed":
        return keep_lib.mixed_groups(rewards_B, prompt_ids_B, num_prompts, valid_B=valid_B)
    if rule == "max_variance":
        return keep_lib.max_variance_subset(rewards_B, prompt_ids_B, num_prompts, keep, valid_B=valid_B)
    if rule == "balanced":
        return keep_lib.balanced_subset(rewards_B, prompt_ids_B, num_prompts, keep, valid_B=valid_B)
    raise ValueError(f"unknown train-mask rule {rule!r}; known: {sorted(set(ONLINE_RULES.values()))}")


def kept_cotangent(probs_PxK: Array, labels_P: Array, sampled_B: Array, prompt_ids_B: Array, train_B: Array, *,
                   estimator: str, advantages_from_kept: bool) -> Array:
    """``c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)`` with the published peers' loss: the plain mean over the
    kept rollouts, ``w = t / sum(t)`` (``core.loss_weights(correction=False, train_B=t)``; 0 everywhere when
    nothing is kept), and advantages from every sampled rollout of the prompt, or from its kept ones only
    (``advantages_from_kept``: PODS; ``core.advantages(rows_B=t)``). Padding rows (id P) are never kept."""
    num_prompts = probs_PxK.shape[0]
    groups = num_prompts + 1
    labels_ext = jnp.concatenate([labels_P, jnp.full((1,), -1, labels_P.dtype)])
    rewards_B = (sampled_B == labels_ext[prompt_ids_B]).astype(probs_PxK.dtype)
    adv_B = core.advantages(rewards_B, prompt_ids_B, groups, estimator,
                            rows_B=train_B if advantages_from_kept else None)
    w_B = core.loss_weights(prompt_ids_B, groups, correction=False, dtype=probs_PxK.dtype, train_B=train_B)
    coef_B = jnp.where(prompt_ids_B < num_prompts, w_B * adv_B, 0.0)
    onehot_sum = jnp.zeros((groups,) + probs_PxK.shape[1:], probs_PxK.dtype).at[prompt_ids_B, sampled_B].add(coef_B)
    coef_sum_P = core.segment_sum(coef_B, prompt_ids_B, groups)[:num_prompts]
    return onehot_sum[:num_prompts] - coef_sum_P[:, None] * probs_PxK


def online_cotangent(method: str, key: Array, probs_PxK: Array, labels_P: Array, counts_P: Array, total, *,
                     estimator: str, keep: int, length: int, sampled=None) -> tuple[Array, Array]:
    """One draw of ``method``'s cotangent (P x K) and the number of rollouts it trains: ``counts_P`` rollouts
    (``sample_rollouts`` with ``key``: common random numbers; or the given ``sampled = (labels_B, ids_B)`` of
    those counts), its train mask, advantages and loss (``kept_cotangent``)."""
    labels_B, ids_B = sampled if sampled is not None else sample_rollouts(key, probs_PxK, counts_P, total,
                                                                          length=length)
    num_prompts = probs_PxK.shape[0]
    labels_ext = jnp.concatenate([labels_P, jnp.full((1,), -1, labels_P.dtype)])
    rewards_B = (labels_B == labels_ext[ids_B]).astype(probs_PxK.dtype)
    train_B = train_mask(ONLINE_RULES[method], rewards_B, ids_B, num_prompts, keep)
    # Advantages from the kept rollouts alone where the registry's entry says so (PODS).
    cot = kept_cotangent(probs_PxK, labels_P, labels_B, ids_B, train_B, estimator=estimator,
                         advantages_from_kept=core.get_allocator(method).advantages_from_kept)
    return cot, jnp.sum(train_B)


# ---------------------------------------------------------------------- Reinforce-Ada's rounds under CRN


def reinforce_ada_counts(key: Array, probs_PxK: Array, labels_P: Array, budget, *, round_size: int, keep: int,
                         length: int | None = None) -> tuple[Array, Array]:
    """Reinforce-Ada's rollouts per prompt when ``budget`` is spent in rounds of
    ``core.keep.reinforce_ada_round`` (docs/allocators.md §6.4), prompt i's rollouts being its ranks 0, 1, ... as
    ``sample_rollouts`` draws them with ``key``; returns (counts_P, number of rounds).

    The rounds are not run one by one (a prompt that no rollout finishes, p ~ 0, would take one round of M =
    ``round_size`` rollouts per round until the budget is spent: thousands of rounds). With common random
    numbers a prompt is finished at count c iff c >= F_i, its finish rank (the first count whose ranks hold
    ``keep // 2`` successes and ``keep - keep // 2`` failures), and while h prompts are unfinished at the common
    level l (every unfinished prompt has had the same full rounds), the next q = remaining // (h M) rounds are full
    whatever finishes during them. So one *phase* draws the ranks l..l+qM-1 of the h unfinished prompts (<= the
    remaining budget rows), finds each one's F_i there and gives it ``l + M ceil((F_i - l) / M)`` (the round it
    finished in) or ``l + qM``. A phase that finishes no prompt leaves less than h M, so the next one is the last,
    partial, round: ``remaining`` round-robin over the unfinished prompts in index order (over all P when every
    prompt has finished), ``reinforce_ada_round`` itself. Hence at most P + 2 phases: a ``while_loop`` bounded by
    that count and stopped after the last round (a data-dependent loop: give it replicated inputs, as
    ``draws.online_counts`` does, and run draws under ``lax.map`` rather than ``vmap``, which would run every
    draw's loop to the slowest one's end); each phase draws one flat layout of ``length`` rows (static; default
    ``budget``, which is then static too; a traced ``budget <= length`` serves every budget with one program).
    """
    length = budget if length is None else length
    num_prompts = probs_PxK.shape[0]
    m = round_size
    need_successes, need_failures = keep // 2, keep - keep // 2
    cdf_PxK = label_cdf(probs_PxK)
    labels_ext = jnp.concatenate([labels_P, jnp.full((1,), -1, labels_P.dtype)])
    zeros = jnp.zeros((num_prompts,), jnp.int32)

    def last_round(state):
        counts, settled, level, successes, remaining, done, rounds = state
        extra_P = keep_lib.reinforce_ada_round(counts, successes, remaining, round_size=m, keep=keep)
        return (counts + extra_P, settled, level, successes, jnp.int32(0), jnp.asarray(True),
                rounds + (remaining > 0).astype(jnp.int32))

    def full_rounds(state):
        counts, settled, level, successes, remaining, done, rounds = state
        unfinished = ~settled
        h = jnp.sum(unfinished.astype(jnp.int32))
        q = remaining // (jnp.maximum(h, 1) * m)
        span = q * m
        extra_P = jnp.where(unfinished, span, 0)
        ids_B = flat_layout(extra_P, jnp.sum(extra_P), length)
        valid_B = ids_B < num_prompts
        offset_B = core.rank_within_prompt(ids_B, num_prompts + 1)  # t = rank - l, 0..span-1
        u_B = rollout_uniforms(key, ids_B, level + offset_B, probs_PxK.dtype)
        drawn_B = sample_labels(cdf_PxK, jnp.minimum(ids_B, num_prompts - 1), u_B)
        success_B = (valid_B & (drawn_B == labels_ext[ids_B])).astype(jnp.int32)
        inclusive_B = jnp.cumsum(success_B)
        exclusive_B = inclusive_B - success_B
        run_B = inclusive_B - exclusive_B[jnp.arange(length) - offset_B]  # successes of ranks l..l+t
        safe_ids = jnp.minimum(ids_B, num_prompts - 1)
        s_after = successes[safe_ids] + run_B
        f_after = level - successes[safe_ids] + offset_B + 1 - run_B
        hit_B = valid_B & (s_after >= need_successes) & (f_after >= need_failures)
        first_P = jax.ops.segment_min(jnp.where(hit_B, offset_B, span), ids_B, num_segments=num_prompts + 1)
        first_P = jnp.minimum(first_P[:num_prompts], span)
        found_P = unfinished & (first_P < span)
        rounds_P = (first_P + m) // m  # the round it finished in: ceil((F_i - l) / M), F_i - l = first + 1
        new_counts = jnp.where(found_P, level + rounds_P * m, jnp.where(unfinished, level + span, counts))
        # Successes among each prompt's ranks below its new count (core's round then sees exact states).
        seen_B = valid_B & (offset_B < (new_counts - level)[safe_ids])
        successes = successes + core.segment_sum(success_B * seen_B, ids_B, num_prompts + 1)[:num_prompts]
        still = unfinished & ~found_P
        phase_rounds = jnp.where(jnp.any(still), q, jnp.max(jnp.where(found_P, rounds_P, 0)))
        spent = jnp.sum(new_counts - counts)
        return (new_counts.astype(jnp.int32), settled | found_P, (level + span).astype(jnp.int32),
                successes.astype(jnp.int32), (remaining - spent).astype(jnp.int32), jnp.asarray(False),
                (rounds + phase_rounds).astype(jnp.int32))

    def phase(carry):
        i, state = carry
        settled, remaining = state[1], state[4]
        h = jnp.sum((~settled).astype(jnp.int32))
        final = (h == 0) | (h * m > remaining)
        return i + 1, jax.lax.cond(final, last_round, full_rounds, state)

    state = (zeros, jnp.zeros((num_prompts,), jnp.bool_), jnp.int32(0), zeros, jnp.asarray(budget, jnp.int32),
             jnp.asarray(False), jnp.int32(0))
    # Bounded by P + 2 phases (see above) and stopped at the last round.
    _, state = jax.lax.while_loop(lambda c: ~c[1][5] & (c[0] < num_prompts + 2), phase, (jnp.int32(0), state))
    return state[0], state[6]


# ---------------------------------------------------------------------------------------------- DARS


def dars_draw_counts(pilot_successes_MxP, n0: int, budget: int, *, n_max: int) -> Array:
    """DARS-ET's counts (M x P) after each draw's pilot: its ranks 0..n0-1 (the pilot ``sera_pilot`` uses), their
    raw success fraction K / n0, then ``sera_jax.core.dars.dars_counts`` (ET; ``n_max`` the analysis's, in place
    of the published 32). Called draw by draw on concrete pilots: core's jitted parts then compile once for every
    budget (the budget is static in ``dars_counts``'s checks)."""
    successes = np.asarray(pilot_successes_MxP)
    return jnp.stack([dars_lib.dars_counts(jnp.asarray(k / n0, jnp.float32), budget, n_pilot=n0, n_max=n_max,
                                           variant="et") for k in successes])


# ------------------------------------------------------------------------------ DAPO's expected cotangent

_GAUSS_NODES, _GAUSS_WEIGHTS = (x.astype(np.float32) for x in np.polynomial.legendre.leggauss(16))


def dapo_expected_cotangent(probs_PxK: Array, labels_P: Array, n, *, estimator: str, max_n: int,
                            dyadic_pieces: int = 30) -> tuple[Array, Array]:
    """Closed-form expected cotangent of ``dapo`` (uniform counts n, the mixed groups train, weights
    ``1 / (n P_kept)``; the zero update when ``P_kept = 0``), and its effective scales ``s_eff_P``.

    On the event that prompt i is mixed, ``P_kept = 1 + X_-i`` with ``X_-i`` the number of other mixed prompts,
    independent of prompt i's rollouts; so ``E[c_i] = alpha_i E[1{mixed_i} (1/n) sum_j A_ij e_ij]`` with
    ``alpha_i = E[1 / (1 + X_-i)] = int_0^1 prod_{k != i} (1 - m_k x) dx``, ``m_k = 1 - p_k^n - (1 - p_k)^n``.
    Removing the unmixed groups from ``E[(1/n) sum_j A_ij e_ij] = s(p_i, n) d_i``: all successes give
    ``f(1, n, n) d_i`` (every score is ``d_i = onehot(y_i) - pi_i``), all failures ``f(0, 0, n) (-p_i / (1 - p_i))
    d_i`` (a failure's expected score), so ``E[c_i] = alpha_i s~_i d_i`` with
    ``s~ = s - f(1,n,n) p^n + f(0,0,n) p (1-p)^(n-1)`` and ``s_eff = P alpha s~``. ``alpha`` is integrated by
    16-point Gauss-Legendre on the dyadic pieces ``[2^-j, 2^-j+1]`` of x (and ``[0, 2^-dyadic_pieces]``), where
    the integrand, ~ exp(-x sum m), is smooth at every scale. ``n = 1`` keeps every group: uniform's estimate.
    ``n`` (<= ``max_n``) may be traced: one program for every budget.
    """
    num_prompts = probs_PxK.shape[0]
    dtype = probs_PxK.dtype
    p_P = success_probabilities(probs_PxK, labels_P)
    n_P = jnp.full((num_prompts,), n, jnp.int32)
    s_P = core.scale_factor(p_P, n_P, estimator, max_n=max_n, check=False)
    f = core.get_estimator(estimator).advantage
    nf = jnp.asarray(n, dtype)
    all_success = f(jnp.asarray(1.0, dtype), nf, nf)
    all_failure = f(jnp.asarray(0.0, dtype), jnp.asarray(0.0, dtype), nf)
    p_n = jnp.exp(xlogy(nf, p_P))
    q_n1 = jnp.exp(xlog1py(nf - 1.0, -p_P))
    s_tilde = s_P - all_success * p_n + all_failure * p_P * q_n1
    mixed_P = jnp.clip(1.0 - p_n - q_n1 * (1.0 - p_P), 0.0, 1.0)
    lo = [0.0] + [2.0 ** -j for j in range(dyadic_pieces, 0, -1)]
    hi = lo[1:] + [1.0]
    lo, hi = jnp.asarray(lo, dtype), jnp.asarray(hi, dtype)
    x_Q = (0.5 * (hi - lo)[:, None] * (_GAUSS_NODES[None, :] + 1.0) + lo[:, None]).reshape(-1)
    w_Q = (0.5 * (hi - lo)[:, None] * _GAUSS_WEIGHTS[None, :]).reshape(-1)
    log_terms_QxP = jnp.log1p(-mixed_P[None, :] * x_Q[:, None])
    total_Q = jnp.sum(log_terms_QxP, axis=1)
    alpha_P = jnp.sum(w_Q[:, None] * jnp.exp(total_Q[:, None] - log_terms_QxP), axis=0)
    single = nf == 1  # one rollout a group: every group is kept, P_kept = P
    alpha_P, s_tilde = jnp.where(single, 1.0 / num_prompts, alpha_P), jnp.where(single, s_P, s_tilde)
    s_eff_P = num_prompts * alpha_P * s_tilde
    return (alpha_P * s_tilde)[:, None] * score_directions(probs_PxK, labels_P), s_eff_P
