"""The RL step's metrics: what a step sampled and trained (``step_metrics``), the scale factors and prompt weights
it implies (estimated and true: ``scale_inputs``, ``weight_metrics``), what its allocation did to the groups
(``allocation_metrics``), and what the task counted while scoring (``task_reward_metrics``);
``rollout_metrics`` assembles them in the step's order. Functions of the step's results alone: nothing here
samples or updates.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

import sera_jax.core as core
from sera_jax.rl.context import Estimate, RLContext, Rollouts
from sera_jax.rl.settings import RunSettings
from sera_jax.rl.task import PromptBatch, RLTask


def rollout_metrics(ctx: RLContext, prompts: PromptBatch, rollouts: Rollouts, successes_P: jax.Array,
                    counts_P: jax.Array, estimate: Estimate, rounds: int) -> dict[str, Any]:
    """Every metric of a step that follows from its rollouts, in the order ``rl_step`` logs them: ``step_metrics``
    (with ``scale_inputs``), ``allocation_metrics``, the sampling rounds (``sampling_rounds``: 1, 2 with a pilot,
    or an online allocator's rounds) and, under a token budget, the tokens the allocation expected to spend
    (``tokens_expected``, each prompt's pilot mean length times its rollouts) against ``token_budget``."""
    c = ctx.settings
    scales = scale_inputs(ctx, prompts, estimate)
    m = step_metrics(c, rollouts, successes_P, counts_P, estimate, **scales)
    m.update(allocation_metrics(c, ctx.allocator, successes_P, counts_P, estimate, scales["true_p_P"]))
    m["sampling_rounds"] = rounds
    if c.sera.budget == "tokens":  # what the allocation expected to spend, against the budget
        m["tokens_expected"] = jnp.sum(jnp.maximum(estimate.pilot_lengths_P, 1.0) * counts_P)
        m["token_budget"] = float(c.sera.tokens_per_step)
    return m


def task_reward_metrics(task: RLTask) -> dict[str, Any]:
    """What the task counted while scoring since the last read, e.g. the math grader's timeouts and errors:
    ``task.reward_metrics()`` (read and reset) where the task has one, else nothing."""
    read = getattr(task, "reward_metrics", None)
    return {} if read is None else dict(read())


def scale_inputs(ctx: RLContext, prompts: PromptBatch, estimate: Estimate) -> dict[str, Any]:
    """What ``step_metrics`` needs for truthful scale factors: the Beta posterior the estimate came from (pilot:
    Jeffreys after the pilot; history: the tracker's before this step's update; None for oracle and uniform),
    and the true success rates when the task knows them."""
    c = ctx.settings
    true_p_P = None
    if estimate.p_hat_P is not None and c.sera.p_estimate == "oracle":
        true_p_P = estimate.p_hat_P  # already the task's answer: do not ask twice
    elif ctx.task.knows_success_rates:
        true_p_P = jnp.asarray(ctx.task.oracle_success_rates(prompts), jnp.float32)
    return {"posterior": estimate.posterior, "true_p_P": true_p_P}


def step_metrics(settings: RunSettings, rollouts: Rollouts, successes_P: jax.Array, counts_P: jax.Array,
                 estimate: Estimate, *, posterior: Optional[core.BetaPosterior] = None,
                 true_p_P: Optional[jax.Array] = None) -> dict[str, jax.Array]:
    """What the step did: rewards, solved prompts, lengths, truncation, the allocation, and its scale factors.

    ``scale_est_{min,max,mean,cv}``: the factors as estimated before sampling. With a ``posterior`` (pilot,
    history) each prompt's is the posterior-expected ``E[s(p_i, N_i) | data]`` (``core.posterior_scale_factor``),
    not ``s(p_hat_i, N_i)`` at the posterior mean, which reads a prompt with 0 of 4 pilot successes as
    p ~ 0.1 whatever its p. With oracle estimates they are the exact factors. ``scale_true_*``: ``s(p_i, N_i)`` at
    the true p (``true_p_P``: tasks that know it, any method, uniform included). With a pilot, the allocation
    depends on the pilot rollouts, so ``s(p_i, N_i)`` is the factor of prompt i's N_i rollouts as if they were
    drawn fresh; the factor of the expected gradient given the pilot differs slightly. ``weight_est_*`` and
    ``weight_true_*``: the same factors turned into each prompt's weight relative to the exact likelihood
    objective (``weight_metrics``), which differs from ``s_i`` only without the multiplicity correction.
    """
    sample = rollouts.sample
    m = {"reward_mean": jnp.mean(rollouts.rewards_B), "prompts_solved_frac": jnp.mean(successes_P > 0),
         "response_len_mean": jnp.mean(sample.lengths_B.astype(jnp.float32)),
         "truncated_frac": 1.0 - jnp.mean(sample.finished_B.astype(jnp.float32)),
         "counts_min": jnp.min(counts_P), "counts_max": jnp.max(counts_P),
         "rollouts_sampled": rollouts.prompt_ids_B.shape[0],
         "tokens_sampled": jnp.sum(sample.lengths_B.astype(jnp.float32))}  # the sampler's cost, pilot included
    kept = jnp.ones_like(rollouts.rewards_B) if rollouts.train_B is None else rollouts.train_B
    m.update({"rollouts_trained": jnp.sum(kept), "tokens_trained": jnp.sum(kept * sample.lengths_B),
              "prompts_trained": core.kept_groups(kept, rollouts.prompt_ids_B, counts_P.shape[0])})
    if rollouts.train_B is not None:
        # A rule that keeps rollouts by their rewards changes the estimator's factor (docs/allocators.md §0):
        # s(p, N) of the sampled counts would misreport it, so no scale factors are logged for it.
        return m
    s = settings.sera
    # A prompt given no rollouts (the released rule's inactive ones) gets no gradient: factor 0. The factors are
    # computed at N >= 1 and masked, so no rule on N = 0 is asked of them.
    sampled_P = counts_P > 0
    at_least_one_P = jnp.maximum(counts_P, 1)
    estimated = None
    if posterior is not None:
        posterior = core.BetaPosterior(jnp.asarray(posterior.alpha, jnp.float32),
                                       jnp.asarray(posterior.beta, jnp.float32))
        estimated = core.posterior_scale_factor(posterior, at_least_one_P, s.estimator, max_n=s.n_max, check=False)
    elif estimate.p_hat_P is not None:
        estimated = core.scale_factor(estimate.p_hat_P.astype(jnp.float32), at_least_one_P, s.estimator,
                                      max_n=s.n_max, check=False)
    if estimated is not None:
        estimated = jnp.where(sampled_P, estimated, 0.0)
    if estimated is not None:
        m.update({f"scale_est_{k}": v for k, v in core.scale_factor_stats(estimated).items()})
        p_hat_P = posterior.mean if posterior is not None else estimate.p_hat_P
        m.update(weight_metrics("weight_est", settings, estimated, counts_P, p_hat_P))
    if true_p_P is not None:
        true = core.scale_factor(jnp.asarray(true_p_P, jnp.float32), at_least_one_P, s.estimator, max_n=s.n_max)
        true = jnp.where(sampled_P, true, 0.0)
        m.update({f"scale_true_{k}": v for k, v in core.scale_factor_stats(true).items()})
        m.update(weight_metrics("weight_true", settings, true, counts_P, true_p_P))
    return m


def weight_metrics(prefix: str, settings: RunSettings, scales_P: jax.Array, counts_P: jax.Array,
                   p_P: jax.Array) -> dict[str, jax.Array]:
    """Each prompt's weight on ``grad log p_i`` relative to the exact likelihood objective's (1: exact; issue 22
    §3): ``s_i`` with the multiplicity correction, ``N_i s_i / N_bar`` without it (more rollouts, more weight).
    ``{prefix}_{min,max,mean,cv}`` and, ranking the prompts by ``p_P``, the mean weight of the harder half
    (``_hard``, the lower ceil(P/2)) and of the rest (``_easy``): a method that under-weights hard prompts has
    ``_hard < _easy``. Sequence-sum aggregation only: the others weigh tokens, not sequences (nothing logged)."""
    if settings.sera.aggregation != "sequence_sum":
        return {}
    num_prompts = scales_P.shape[0]
    weights_P = num_prompts * core.effective_prompt_weights(scales_P, counts_P, correction=settings.sera.correction)
    m = {f"{prefix}_{k}": v for k, v in core.scale_factor_stats(weights_P).items()}
    if num_prompts >= 2:
        ranked = weights_P[jnp.argsort(jnp.asarray(p_P, jnp.float32), stable=True)]
        half = (num_prompts + 1) // 2
        m[f"{prefix}_hard"], m[f"{prefix}_easy"] = jnp.mean(ranked[:half]), jnp.mean(ranked[half:])
    return m


def dropped_prompts(counts_P: jax.Array, p_hat_P: jax.Array) -> dict[str, jax.Array]:
    """The step's prompts given no rollouts, by the side of their estimate: ``dropped_hard`` (p-hat below 1/2: a
    rule's active set drops these for a near-zero chance of any success) and ``dropped_easy`` (the rest: a near-zero
    chance of any failure). Under epoch estimates these are the prompts that failed (passed) every rollout of their
    last visits."""
    dropped_P = jnp.asarray(counts_P) == 0
    hard_P = jnp.asarray(p_hat_P, jnp.float32) < 0.5
    return {"dropped_hard": jnp.sum(dropped_P & hard_P).astype(jnp.float32),
            "dropped_easy": jnp.sum(dropped_P & ~hard_P).astype(jnp.float32)}


def allocation_metrics(settings: RunSettings, allocator: core.Allocator, successes_P: jax.Array,
                       counts_P: jax.Array, estimate: Estimate, true_p_P: Optional[jax.Array] = None) -> dict[str, Any]:
    """What the allocation did, for every allocator (``core.group_outcomes``): the prompts sampled at all, the
    sampled groups that ended mixed / all-fail / all-pass, the rollouts spent on unmixed groups, and the mixed
    fraction expected from the step's estimates (``_expected``) and from the true p (``_true``, tasks that know it);
    ``cold_start``: an epoch_history step made uniform; ``waterline_tau``: the equalised level of a rule that has one
    (its factors' common value ``1 - exp(-tau)``; 0 for a step it did not allocate: uniform, or a token budget).
    ``allocator``: the run's (``RLContext.allocator``), the one ``config.sera.method`` names."""
    m = core.group_outcomes(successes_P, counts_P, estimate.p_hat_P)
    if true_p_P is not None:
        m["useful_group_fraction_true"] = core.group_outcomes(successes_P, counts_P, true_p_P)[
            "useful_group_fraction_expected"]
    if estimate.p_hat_P is not None:
        m.update(dropped_prompts(counts_P, estimate.p_hat_P))
    else:  # a step without estimates (uniform, or epoch 0 of epoch estimates) gives every prompt rollouts
        m.update(dropped_hard=jnp.float32(0.0), dropped_easy=jnp.float32(0.0))
    m["cold_start"] = float(estimate.cold)
    s = settings.sera
    waterline_fn = allocator.waterline_fn
    if waterline_fn is not None:
        m["waterline_tau"] = 0.0
        if estimate.p_hat_P is not None and s.budget == "rollouts":
            n0 = s.pilot_rollouts if estimate.pilot is not None else 0
            m["waterline_tau"] = waterline_fn(estimate.p_hat_P, settings.rl.rollouts_per_step, n_min=max(s.n_min, n0),
                                              n_max=s.n_max, estimator=s.estimator, floor=n0,
                                              threshold=s.activation_threshold)
    return m
