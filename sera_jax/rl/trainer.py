"""The RL step as a pure function of (state, prompts, key), its named stages, evaluation, and the RL run.

One step (on-policy, one update per batch, as in MaxRL):

1. ``estimate_success_rates``: ``pilot`` (n0 rollouts each, inside the budget), ``history`` (the Beta tracker
   over earlier epochs), ``epoch_history`` (the SERA authors' estimates, frozen per epoch; a step with a prompt not
   yet estimated is uniform) or ``oracle`` (a task that knows p); nothing for an allocator that needs none;
2. ``allocate_rollouts``: the budget B split by the allocator ``sera.method`` names (``core.get_allocator``);
3. ``sample_rollouts`` on the flat layout (``rl.sample_chunk`` rows per call). One sampling key per step, and
   rollouts keyed by (prompt, rank) (``sera_jax.models.sampler``): the pilot is ranks 0..n0-1 of each prompt and the
   main call continues at rank n0, so at equal parameters every method's rollout j of prompt i is the same
   (common random numbers: differences between allocators are the allocators');
4. ``score_rollouts``: the task's binary rewards, checked;
5. ``policy_gradient_inputs``: advantages (any registered estimator) and multiplicity-corrected loss weights;
6. the update (``step.make_policy_gradient_update``: AdamW on the surrogate), and the tracker's update.

``RLState`` (parameters, optimizer state, tracker, step) goes in and comes out of ``rl_step``; nothing else
carries over between steps. Quantities that follow from it are computed: the training rollouts spent after
``s`` steps are ``s * rl.rollouts_per_step``. ``train_rl`` runs the step in the one loop
(``sera_jax.train.loop``), with the step's data ``task.train_prompts(s, P)`` (``order=seed`` with ``rl.data_order="seed"``) and key ``fold_in(key(seed), s)``,
so a resumed run continues exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import pathlib
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import sera_jax.core as core
from sera_jax.models.sampler import SampleOutput, make_sample_fn
from sera_jax.rl import step as step_lib
from sera_jax.rl.config import prompts_fetched_per_step, validate_rl_config
from sera_jax.rl.task import PromptBatch, RLTask
from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train.distributed import host_array
from sera_jax.train.loop import StepAllowance, run_loop
from sera_jax.train.sharding import Placement
from sera_jax.train.writers import MetricWriter, progress


class RLState(NamedTuple):
    """Everything an RL run carries from one step to the next (checkpointed whole)."""

    params: Any  # nnx.State of the policy
    opt_state: Any
    tracker: core.TrackerState  # Beta success-rate tracker over the training prompts (history estimates)
    step: jax.Array  # int32 scalar: updates done
    skips: core.SkipState  # each training prompt's trailing all-correct / all-wrong visits (GRESO's history)
    epochs: core.EpochHistoryState  # the authors' per-epoch frozen estimates (sera.p_estimate="epoch_history")


class Rollouts(NamedTuple):
    """Rollouts on the flat layout: rollout b belongs to prompt ``prompt_ids_B[b]`` of the step."""

    prompt_ids_B: jax.Array
    sample: SampleOutput
    rewards_B: Optional[jax.Array]  # None until scored
    train_B: Optional[jax.Array] = None  # 0/1: the rollouts that enter the loss (None: all; Allocator.keep_fn)
    counted_B: Optional[jax.Array] = None  # 0/1: real rows (None: all); padding rows count for nothing


class Estimate(NamedTuple):
    """What the allocation is computed from: p_hat (None for uniform), the allocation's target (p_hat, or a
    Beta posterior with ``sera.use_posterior``), and the pilot rollouts and their successes per prompt when the
    pilot made the estimate."""

    p_hat_P: Optional[jax.Array]
    target: Any
    pilot: Optional[Rollouts] = None
    pilot_successes_P: Optional[jax.Array] = None
    posterior: Optional[core.BetaPosterior] = None  # the Beta belief behind p_hat (pilot, history); None otherwise
    pilot_lengths_P: Optional[jax.Array] = None  # mean response length of each prompt's pilot (token budgets)
    cold: bool = False  # epoch_history with a prompt not yet estimated: the step is uniform (the authors' rule)


@dataclasses.dataclass(frozen=True)
class RLContext:
    """What the step is built from, bound once: task, config, model structure, optimizer, compiled functions."""

    task: RLTask
    config: ml_collections.ConfigDict
    graphdef: nnx.GraphDef
    placement: Placement
    sample_fn: Callable
    eval_sample_fn: Callable
    update_fn: Callable  # step.make_policy_gradient_update(graphdef, tx, microbatches)


@dataclasses.dataclass(frozen=True)
class SampleFns:
    """The jitted samplers of a run: ``train`` (pilot and rollouts: ``rl.top_p``, ``rl.sample_slots``) and
    ``eval`` (``eval.top_p``, ``eval.sample_slots``); one object when the two sample alike."""

    train: Callable
    eval: Callable


def sample_fn_settings(graphdef: nnx.GraphDef, task: RLTask, config: ml_collections.ConfigDict) -> tuple:
    """Everything ``make_sample_fns`` reads: runs whose settings are equal can share one ``SampleFns``."""
    return (graphdef, task.max_new_tokens, task.pad_id, config.rl.top_p, config.rl.sample_slots,
            config.eval.top_p, config.eval.sample_slots)


def make_sample_fns(graphdef: nnx.GraphDef, task: RLTask, config: ml_collections.ConfigDict) -> SampleFns:
    """The run's samplers; build once and share between runs of equal ``sample_fn_settings`` (each keeps its own
    compilations, so a rebuilt sampler compiles again)."""
    def build(top_p: float, slots: int):
        return make_sample_fn(graphdef, max_new_tokens=task.max_new_tokens, top_p=top_p, pad_id=task.pad_id,
                              num_slots=slots or None)

    train = build(config.rl.top_p, config.rl.sample_slots)
    same = (config.eval.top_p, config.eval.sample_slots) == (config.rl.top_p, config.rl.sample_slots)
    return SampleFns(train=train, eval=train if same else build(config.eval.top_p, config.eval.sample_slots))


def make_rl_optimizer(config: ml_collections.ConfigDict):
    """AdamW of ``config.rl`` (with global-norm clipping)."""
    rl = config.rl
    return step_lib.make_optimizer(rl.learning_rate, b1=rl.b1, b2=rl.b2, weight_decay=rl.weight_decay,
                                   grad_clip=rl.grad_clip)


def make_update(graphdef: nnx.GraphDef, config: ml_collections.ConfigDict) -> tuple[Any, Callable]:
    """(optimizer, jitted update) of ``config.rl``: build once and share between runs of the same rl settings."""
    tx = make_rl_optimizer(config)
    return tx, step_lib.make_policy_gradient_update(graphdef, tx, config.rl.update_microbatches,
                                                    config.rl.logprob_chunk)


def make_context(task: RLTask, graphdef: nnx.GraphDef, config: ml_collections.ConfigDict, *,
                 placement: Optional[Placement] = None, update_fn: Optional[Callable] = None,
                 sample_fns: Optional[SampleFns] = None) -> RLContext:
    """Validates ``config`` for ``task`` and binds what every step uses (``update_fn``: a shared update from
    ``make_update``, which must have been built from the same ``config.rl``; ``sample_fns``: shared samplers
    from ``make_sample_fns``, built from equal ``sample_fn_settings``)."""
    placement = placement or Placement()
    validate_rl_config(config, endless=task.num_train_prompts is None, knows_success_rates=task.knows_success_rates,
                       num_shards=placement.num_batch_shards, num_train_prompts=task.num_train_prompts,
                       max_new_tokens=task.max_new_tokens)
    if update_fn is None:
        update_fn = make_update(graphdef, config)[1]
    if sample_fns is None:
        sample_fns = make_sample_fns(graphdef, task, config)
    return RLContext(task=task, config=config, graphdef=graphdef, placement=placement,
                     sample_fn=sample_fns.train, eval_sample_fn=sample_fns.eval, update_fn=update_fn)


def init_state(ctx: RLContext, params: Any, tx) -> RLState:
    """The start state on the run's placement (a copy: the update donates its state, the model keeps its own).

    Parameters, optimizer moments, counters and tracker all live on the mesh, so that a restore (which keeps
    each leaf's placement) never mixes one-device and mesh arrays."""
    params = jax.tree.map(jnp.copy, params)
    num_keys = ctx.task.num_train_prompts or 1
    state = RLState(params, tx.init(params), core.tracker_init(num_keys), jnp.zeros((), jnp.int32),
                    core.skip_state_init(num_keys), core.epoch_history_init(num_keys))
    return ctx.placement.tree(state)


# -- the stages --------------------------------------------------------------------------------------


def sample_rollouts(ctx: RLContext, params: Any, prompts: PromptBatch, prompt_ids_B: jax.Array, key: jax.Array,
                    temperature: float, sample_fn: Optional[Callable] = None,
                    rank_offset_P: Optional[jax.Array] = None, rows_per_call: int = 0) -> Rollouts:
    """Samples the rollouts ``prompt_ids_B``, ``rl.sample_chunk`` at a time when that is set (the last chunk is
    padded with rollouts of prompt 0, then dropped, so every call has one compiled shape). ``rows_per_call``:
    calls of exactly that many rows (at most ``rl.sample_chunk``), for callers whose row counts vary (rounds).

    Rollouts are keyed by (prompt, rank) with one ``key``: row b is rollout ``rank_offset_P[i] + r`` of its prompt
    i (default offset 0), r the number of rows of prompt i before it in ``prompt_ids_B``; each chunk starts its
    prompts' ranks where the chunks before it left them, so chunking changes no rollout."""
    sample_fn = sample_fn or ctx.sample_fn
    num = prompt_ids_B.shape[0]
    limit = ctx.config.rl.sample_chunk
    if rows_per_call:
        chunk = min(rows_per_call, limit) if limit else rows_per_call
    else:
        chunk = limit if 0 < limit < num else num
    tokens, lengths = jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P)
    stops = jnp.asarray(ctx.task.stop_tokens, jnp.int32)
    ids_B = jnp.asarray(prompt_ids_B, jnp.int32)
    num_prompts = tokens.shape[0]
    offset_P = (jnp.zeros(num_prompts, jnp.int32) if rank_offset_P is None
                else jnp.asarray(rank_offset_P, jnp.int32))
    parts = []
    for start in range(0, num, chunk):
        ids = ids_B[start:start + chunk]
        real = ids.shape[0]
        padded = jnp.concatenate([ids, jnp.zeros(chunk - real, jnp.int32)]) if real < chunk else ids
        # The padding rows come after the real ones: they never shift a real row's rank.
        out = sample_fn(params, tokens, lengths, ctx.placement.batch(padded), key, temperature, stops, offset_P)
        parts.append(out if real == chunk else SampleOutput(*(x[:real] for x in out)))
        if start + chunk < num:
            offset_P = offset_P + jnp.bincount(ids, length=num_prompts).astype(jnp.int32)
    sample = parts[0] if len(parts) == 1 else SampleOutput(*(jnp.concatenate(f) for f in zip(*parts)))
    return Rollouts(ids_B, sample, None)


def score_rollouts(task: RLTask, prompts: PromptBatch, rollouts: Rollouts) -> jax.Array:
    """The task's binary rewards, checked: anything but 0/1 is a task bug, not something to train on.

    The task scores the sample as it comes (device arrays, sharded over the mesh; a task that reads them on the
    host uses ``distributed.host_array``); its rewards are read here whole (gathered from every host)."""
    rewards = host_array(task.rewards(prompts, host_array(rollouts.prompt_ids_B), rollouts.sample)).astype(
        np.float32)
    num = rollouts.prompt_ids_B.shape[0]
    ok = (rewards == 0) | (rewards == 1)
    if rewards.shape != (num,) or not np.all(ok):
        bad = rewards[~ok][:5].tolist() if rewards.shape == (num,) else []
        raise ValueError(f"task.rewards ({type(task).__name__}.rewards) must return {num} binary (0/1) rewards; "
                         f"got shape {rewards.shape}, offending values {bad}")
    return jnp.asarray(rewards)


def successes_per_prompt(rollouts: Rollouts, num_prompts: int) -> jax.Array:
    """Successful rollouts of each prompt: a segment sum over the flat layout."""
    return jax.ops.segment_sum(rollouts.rewards_B, rollouts.prompt_ids_B, num_prompts)


def estimate_success_rates(ctx: RLContext, state: RLState, prompts: PromptBatch, key: jax.Array) -> Estimate:
    """Stage 1: p_hat of the step's prompts as ``sera.p_estimate`` says (the pilot spends rollouts of the step:
    ranks 0..n0-1 of each prompt, sampled with the step's sampling ``key``)."""
    c = ctx.config
    if not core.get_allocator(c.sera.method).needs_estimate:
        return Estimate(None, None)
    if c.sera.p_estimate == "pilot":
        P, n0 = c.rl.prompts_per_step, c.sera.pilot_rollouts
        pilot = sample_rollouts(ctx, state.params, prompts, jnp.repeat(jnp.arange(P, dtype=jnp.int32), n0), key,
                                c.rl.temperature)
        pilot = pilot._replace(rewards_B=score_rollouts(ctx.task, prompts, pilot))
        successes_P = successes_per_prompt(pilot, P)
        posterior = core.pilot_posterior(successes_P, n0)
        lengths_P = jax.ops.segment_sum(pilot.sample.lengths_B.astype(jnp.float32), pilot.prompt_ids_B, P) / n0
        return Estimate(posterior.mean, posterior if c.sera.use_posterior else posterior.mean, pilot, successes_P,
                        posterior, lengths_P)
    if c.sera.p_estimate == "history":
        posterior = core.tracker_posterior(state.tracker, jnp.asarray(prompts.keys_P))
        return Estimate(posterior.mean, posterior if c.sera.use_posterior else posterior.mean, posterior=posterior)
    if c.sera.p_estimate == "epoch_history":  # ``state.epochs`` is at this step's epoch (rl_step advanced it)
        p_hat, known = core.epoch_history_lookup(state.epochs, jnp.asarray(prompts.keys_P))
        if not bool(host_array(jnp.all(known))):
            return Estimate(None, None, cold=True)
        return Estimate(p_hat, p_hat)
    p_hat = jnp.asarray(ctx.task.oracle_success_rates(prompts), jnp.float32)
    return Estimate(p_hat, p_hat)


def allocate_rollouts(config: ml_collections.ConfigDict, estimate: Estimate) -> jax.Array:
    """Stage 2: rollouts per prompt ``counts_P`` (pilot rollouts included), summing to ``rl.rollouts_per_step``;
    with ``sera.budget="tokens"``, whose expected tokens (each prompt's pilot mean length per rollout) fit
    ``sera.tokens_per_step`` and whose rows fit ``rl.rollouts_per_step`` (``core.allocate_tokens``)."""
    P, B = config.rl.prompts_per_step, config.rl.rollouts_per_step
    s = config.sera
    bounds = dict(n_min=s.n_min, n_max=s.n_max, estimator=s.estimator, threshold=s.activation_threshold)
    if s.budget == "tokens":
        target = estimate.posterior if s.use_posterior else estimate.p_hat_P
        # A pilot rollout that wrote nothing still costs its slot: at least one token each.
        costs_P = jnp.maximum(estimate.pilot_lengths_P, 1.0)
        return core.allocate_tokens(target, float(s.tokens_per_step), costs_P, B,
                                    n_min=max(s.n_min, s.pilot_rollouts), n_max=s.n_max, estimator=s.estimator)
    if estimate.pilot is not None:
        return core.pilot_allocate(estimate.pilot_successes_P, s.pilot_rollouts, B, use_posterior=s.use_posterior,
                                   method=s.method, **bounds)
    if estimate.cold:
        return core.uniform_counts(P, B)
    return core.get_allocator(s.method).counts(estimate.target, B, num_prompts=P, **bounds)


def main_rollout_ids(config: ml_collections.ConfigDict, counts_P: jax.Array, estimate: Estimate) -> jax.Array:
    """The flat layout of the rollouts still to sample: ``counts_P`` less the pilot's, prompt by prompt (their
    ranks start at ``main_rank_offset``). Under a token budget the number of rows varies, so the layout is sized
    on the host (the sampling calls keep one shape: ``main_rows_per_call``)."""
    rows = config.rl.rollouts_per_step - (0 if estimate.pilot is None else estimate.pilot.prompt_ids_B.shape[0])
    n0 = config.sera.pilot_rollouts if estimate.pilot is not None else 0
    if config.sera.budget == "tokens":
        extra_P = np.asarray(host_array(counts_P), np.int64) - n0
        return jnp.asarray(np.repeat(np.arange(extra_P.shape[0], dtype=np.int32), extra_P))
    return jnp.repeat(jnp.arange(counts_P.shape[0], dtype=jnp.int32), counts_P - n0, total_repeat_length=rows)


def main_rows_per_call(config: ml_collections.ConfigDict) -> int:
    """Rows of each main sampling call under a token budget: the step's rows less the pilot's, whatever the
    allocation spends (0: the layout's own length, fixed for a rollout budget)."""
    if config.sera.budget != "tokens":
        return 0
    return config.rl.rollouts_per_step - config.rl.prompts_per_step * config.sera.pilot_rollouts


def pad_rollouts(rollouts: Rollouts, rows: int, pad_id: int) -> Rollouts:
    """``rollouts`` followed by empty rows up to ``rows`` (the update's fixed shape): prompt 0, no tokens, reward
    0, not trained and not counted in any prompt's K_i or N_i (``counted_B``)."""
    real = rollouts.prompt_ids_B.shape[0]
    if real == rows:
        return rollouts
    extra = rows - real

    def pad(x, value):
        return jnp.concatenate([x, jnp.full((extra,) + x.shape[1:], value, x.dtype)])

    sample = rollouts.sample
    sample = SampleOutput(pad(sample.tokens_BxR, pad_id), pad(sample.mask_BxR, False), pad(sample.lengths_B, 0),
                          pad(sample.finished_B, True), pad(sample.logp_policy_BxR, 0.0),
                          pad(sample.logp_sample_BxR, 0.0))
    train = jnp.ones(real, jnp.float32) if rollouts.train_B is None else rollouts.train_B
    counted = jnp.ones(real, jnp.float32) if rollouts.counted_B is None else rollouts.counted_B
    return Rollouts(pad(rollouts.prompt_ids_B, 0), sample, pad(rollouts.rewards_B, 0.0), pad(train, 0.0),
                    pad(counted, 0.0))


def main_rank_offset(config: ml_collections.ConfigDict, estimate: Estimate) -> jax.Array:
    """Rank of each prompt's first main rollout: the pilot's rollouts per prompt (0 without a pilot), so that the
    main call continues the pilot's ranks and rollout j of prompt i is the same for every method."""
    n0 = config.sera.pilot_rollouts if estimate.pilot is not None else 0
    return jnp.full((config.rl.prompts_per_step,), n0, jnp.int32)


def join_rollouts(first: Optional[Rollouts], second: Rollouts) -> Rollouts:
    if first is None:
        return second
    return Rollouts(*(jax.tree.map(lambda a, b: jnp.concatenate([a, b]), x, y) for x, y in zip(first, second)))


def sample_in_rounds(ctx: RLContext, params: Any, prompts: PromptBatch, key: jax.Array,
                     round_fn: Callable) -> tuple[Rollouts, jax.Array, int]:
    """Stages 1-4 of an online allocator (``Allocator.round_fn``, e.g. Reinforce-Ada): rounds of sampling, each
    round's rollouts per prompt chosen from the successes of the rounds before, until ``rl.rollouts_per_step``
    are spent. Returns the scored rollouts in arrival order, the counts per prompt and the number of rounds.

    Every call has ``P * sera.round_size`` rows (padded), so the sampler compiles once; rollouts are keyed by
    (prompt, rank) with the step's one ``key``, round r continuing each prompt's ranks: a prompt's rollout j is
    the one every other method draws as its rollout j at the same parameters."""
    c = ctx.config
    P, remaining = c.rl.prompts_per_step, c.rl.rollouts_per_step
    counts_P, successes_P = jnp.zeros(P, jnp.int32), jnp.zeros(P, jnp.float32)
    parts, rounds = None, 0
    while remaining > 0:
        extra_P = np.asarray(round_fn(counts_P, successes_P, remaining, c.sera), np.int64)
        spent = int(extra_P.sum())
        if spent <= 0 or spent > remaining:
            raise ValueError(f"allocator {c.sera.method!r}: a round must spend 1..{remaining} rollouts, its "
                             f"round_fn gave {spent}")
        ids = jnp.asarray(np.repeat(np.arange(P, dtype=np.int32), extra_P))
        part = sample_rollouts(ctx, params, prompts, ids, key, c.rl.temperature, rank_offset_P=counts_P,
                               rows_per_call=P * c.sera.round_size)
        part = part._replace(rewards_B=score_rollouts(ctx.task, prompts, part))
        counts_P = counts_P + jnp.asarray(extra_P, jnp.int32)
        successes_P = successes_P + successes_per_prompt(part, P)
        parts, remaining, rounds = join_rollouts(parts, part), remaining - spent, rounds + 1
    return parts, counts_P, rounds


def select_prompts(ctx: RLContext, state: RLState, candidates: PromptBatch, key: jax.Array) -> PromptBatch:
    """The step's ``rl.prompts_per_step`` prompts: the first ones fetched, or, for a selection allocator
    (``Allocator.select_fn``: MoPPS, GRESO), its choice among the ``sera.candidate_ratio * P`` candidates of
    the stream, made from ``state``'s history of earlier steps (the tracker and the skip streaks) and ``key``."""
    c = ctx.config
    P = c.rl.prompts_per_step
    select_fn = core.get_allocator(c.sera.method).select_fn
    if select_fn is None:
        return candidates
    idx = np.asarray(host_array(select_fn(state, jnp.asarray(candidates.keys_P), P, key, c.sera)))
    if idx.shape != (P,) or len(set(idx.tolist())) != P or idx.min() < 0 or idx.max() >= len(candidates.keys_P):
        raise ValueError(f"allocator {c.sera.method!r}: select_fn must pick {P} distinct candidates of "
                         f"{len(candidates.keys_P)}, got {idx.tolist()}")
    return take_prompts(candidates, idx)


def train_mask(config: ml_collections.ConfigDict, rollouts: Rollouts) -> Optional[jax.Array]:
    """Which rollouts enter the loss: ``Allocator.keep_fn`` of the scored rollouts (None: every one)."""
    keep_fn = core.get_allocator(config.sera.method).keep_fn
    if keep_fn is None:
        return None
    return jnp.asarray(keep_fn(rollouts.rewards_B, rollouts.prompt_ids_B, config.rl.prompts_per_step, config.sera),
                       jnp.float32)


@functools.partial(jax.jit, static_argnames=("estimator", "aggregation", "correction", "share_prompts",
                                             "advantages_from_kept", "microbatch_rows"))
def policy_gradient_inputs(prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, tokens_BxR, mask_BxR, rewards_B,
                           train_B=None, counted_B=None, *, estimator: str, aggregation: str, correction: bool,
                           share_prompts: bool, advantages_from_kept: bool = False, microbatch_rows: int = 0):
    """Stage 5: advantages and multiplicity-corrected token weights on the flat layout, as the update's batch:
    the prompts once and the rollouts' rows (``share_prompts``), or joined sequences. ``train_B``: the rollouts
    that enter the loss (the others weigh 0; their rewards still make their prompt's K_i and N_i unless
    ``advantages_from_kept``); ``counted_B``: the real rows (padding rows count for nothing); ``microbatch_rows``:
    the loss micro-batch of ``token_mean_microbatch`` (``sera.loss_microbatch_rows``)."""
    num_prompts = prompt_tokens_PxT.shape[0]
    adv = core.advantages(rewards_B, prompt_ids_B, num_prompts, estimator,
                          rows_B=train_B if advantages_from_kept else counted_B)
    weights = core.loss_weights(prompt_ids_B, num_prompts, token_mask_BxR=mask_BxR, aggregation=aggregation,
                                correction=correction, train_B=train_B, microbatch_rows=microbatch_rows)
    if share_prompts:
        rows = step_lib.RolloutRows(prompt_ids_B.astype(jnp.int32), tokens_BxR.astype(jnp.int32),
                                    mask_BxR.astype(bool), weights.astype(jnp.float32))
        return step_lib.SharedPromptBatch(prompt_tokens_PxT.astype(jnp.int32), prompt_lengths_P.astype(jnp.int32),
                                          rows), adv
    batch = step_lib.sequence_batch(prompt_tokens_PxT[prompt_ids_B], prompt_lengths_P[prompt_ids_B], tokens_BxR,
                                    mask_BxR, weights)
    return batch, adv


def update_policy(ctx: RLContext, state: RLState, prompts: PromptBatch,
                  rollouts: Rollouts) -> tuple[RLState, dict[str, jax.Array]]:
    """Stage 6: one AdamW step on the policy-gradient surrogate of ``rollouts`` (tracker untouched).

    When the train mask keeps no rollout (every group all-0 or all-1 under DAPO's filter) there is nothing to
    learn from: the step is counted but the parameters and the optimizer's moments stay (AdamW's momentum would
    move them on a zero gradient); ``update_skipped`` says so."""
    s = ctx.config.sera
    if rollouts.train_B is not None and not float(host_array(jnp.sum(rollouts.train_B))) > 0:
        zero = jnp.zeros((), jnp.float32)  # the surrogate and its gradient are 0 with every weight 0
        return state._replace(step=state.step + 1), {"loss": zero, "grad_norm": zero, "update_skipped": zero + 1}
    batch, adv = policy_gradient_inputs(
        jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P), rollouts.prompt_ids_B,
        rollouts.sample.tokens_BxR, rollouts.sample.mask_BxR, rollouts.rewards_B, rollouts.train_B,
        rollouts.counted_B, estimator=s.estimator, aggregation=s.aggregation, correction=s.correction,
        share_prompts=ctx.config.rl.share_prompts,
        advantages_from_kept=core.get_allocator(s.method).advantages_from_kept,
        microbatch_rows=s.loss_microbatch_rows)
    if isinstance(batch, step_lib.SharedPromptBatch):  # prompts on every device, rollouts split over the shards
        batch = step_lib.SharedPromptBatch(*ctx.placement.tree((batch.prompt_tokens_PxT, batch.prompt_lengths_P)),
                                           jax.tree.map(ctx.placement.batch, batch.rows))
    else:
        batch = jax.tree.map(ctx.placement.batch, batch)
    train = step_lib.TrainState(state.params, state.opt_state, state.step)
    train, metrics = ctx.update_fn(train, batch, ctx.placement.batch(adv))
    metrics["update_skipped"] = jnp.zeros((), jnp.float32)
    return state._replace(params=train.params, opt_state=train.opt_state, step=train.step), metrics


def update_tracker(ctx: RLContext, state: RLState, prompts: PromptBatch, successes_P: jax.Array,
                   counts_P: jax.Array) -> RLState:
    """The history (the Beta tracker and the skip streaks) sees every rollout of the step (pilot and discarded
    rollouts included: ``successes_P`` of ``counts_P``); endless tasks have none. GRESO's skip probabilities adapt
    once the step's prompts come from past the first pass over the training set (its code adapts from the second
    epoch). ``state`` is the state after this step's update: its ``step`` counts this step."""
    if ctx.task.num_train_prompts is None:
        return state
    keys = jnp.asarray(prompts.keys_P)
    tracker = core.tracker_update(state.tracker, keys, successes_P, counts_P, decay=ctx.config.sera.history_decay)
    epochs = core.epoch_history_record(state.epochs, keys, successes_P, counts_P)
    fetched_before = (state.step.astype(jnp.int32) - 1) * prompts_fetched_per_step(ctx.config)
    skips = state.skips
    if not core.get_allocator(ctx.config.sera.method).may_skip_prompts:  # GRESO's streaks read every prompt's group
        skips = core.greso_update(state.skips, keys, successes_P, counts_P,
                                  epoch_started=fetched_before >= ctx.task.num_train_prompts)
    return state._replace(tracker=tracker, skips=skips, epochs=epochs)


def advance_epochs(ctx: RLContext, state: RLState) -> RLState:
    """The authors' estimator at the epoch of the step ``state.step`` is about to take: at an epoch boundary the
    last epoch's outcomes join the (discounted) evidence and the estimates freeze for the new epoch. A function of
    the step alone, so a run resumed mid-epoch continues exactly."""
    if ctx.task.num_train_prompts is None:
        return state
    s = ctx.config.sera
    per_epoch = core.epoch_length(ctx.task.num_train_prompts, prompts_fetched_per_step(ctx.config))
    epochs = core.epoch_history_advance(state.epochs, state.step, per_epoch, prior=tuple(s.epoch_prior),
                                        discount=s.epoch_discount)
    return state._replace(epochs=epochs)


class _Phases:
    """Wall time per stage (each stage's result is waited for, so the times are the stage's own)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def done(self, name: str, result: Any) -> Any:
        jax.block_until_ready(result)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now
        return result


def rl_step(ctx: RLContext, state: RLState, prompts: PromptBatch, key: jax.Array) -> tuple[RLState, dict[str, Any]]:
    """One RL step: estimate p -> allocate -> sample -> reward -> advantages and weights -> update.

    Pure: the new state and the step's metrics are functions of ``(state, prompts, key)`` alone. ``key`` is the
    step's one sampling key, the pilot's and the main rollouts' (keyed by (prompt, rank), the main call's ranks
    continuing the pilot's): from the same state, every method draws the same rollout j of prompt i.
    """
    c = ctx.config
    P = c.rl.prompts_per_step
    allocator = core.get_allocator(c.sera.method)
    phases = _Phases()
    task_reward_metrics(ctx.task)  # drops what was counted before this step (e.g. by an evaluation)
    state = advance_epochs(ctx, state)
    prompts = select_prompts(ctx, state, prompts, jax.random.fold_in(key, SELECTION_STREAM))
    if allocator.round_fn is not None:
        estimate = Estimate(None, None)
        rollouts, counts_P, rounds = sample_in_rounds(ctx, state.params, prompts, key, allocator.round_fn)
        phases.done("sample", rollouts)
    else:
        estimate = estimate_success_rates(ctx, state, prompts, key)
        if estimate.pilot is not None:
            phases.done("pilot", estimate)
        counts_P = phases.done("allocate", allocate_rollouts(c, estimate))
        main = sample_rollouts(ctx, state.params, prompts, main_rollout_ids(c, counts_P, estimate), key,
                               c.rl.temperature, rank_offset_P=main_rank_offset(c, estimate),
                               rows_per_call=main_rows_per_call(c))
        phases.done("sample", main)
        main = main._replace(rewards_B=phases.done("reward", score_rollouts(ctx.task, prompts, main)))
        rollouts, rounds = join_rollouts(estimate.pilot, main), 1 + (estimate.pilot is not None)
    rollouts = rollouts._replace(train_B=train_mask(c, rollouts))
    new_state, metrics = update_policy(ctx, state, prompts,
                                       pad_rollouts(rollouts, c.rl.rollouts_per_step, ctx.task.pad_id))
    successes_P = successes_per_prompt(rollouts, P)
    new_state = phases.done("update", update_tracker(ctx, new_state, prompts, successes_P, counts_P))
    scales = scale_inputs(ctx, prompts, estimate)
    metrics.update(step_metrics(c, rollouts, successes_P, counts_P, estimate, **scales))
    metrics.update(allocation_metrics(c, successes_P, counts_P, estimate, scales["true_p_P"]))
    metrics["sampling_rounds"] = rounds
    if c.sera.budget == "tokens":  # what the allocation expected to spend, against the budget
        metrics["tokens_expected"] = jnp.sum(jnp.maximum(estimate.pilot_lengths_P, 1.0) * counts_P)
        metrics["token_budget"] = float(c.sera.tokens_per_step)
    metrics.update(task_reward_metrics(ctx.task))
    total = sum(phases.seconds.values())
    metrics["step_seconds"] = total
    metrics.update({f"time_share/{k}": v / max(total, 1e-9) for k, v in phases.seconds.items()})
    return new_state, metrics


def allocation_metrics(config: ml_collections.ConfigDict, successes_P: jax.Array, counts_P: jax.Array,
                       estimate: Estimate, true_p_P: Optional[jax.Array] = None) -> dict[str, Any]:
    """What the allocation did, for every allocator (``core.group_outcomes``): the prompts sampled at all, the
    sampled groups that ended mixed / all-fail / all-pass, the rollouts spent on unmixed groups, and the mixed
    fraction expected from the step's estimates (``_expected``) and from the true p (``_true``, tasks that know it);
    ``cold_start``: an epoch_history step made uniform; ``waterline_tau``: the equalised level of a rule that has one
    (its factors' common value ``1 - exp(-tau)``; 0 for a step it did not allocate: uniform, or a token budget)."""
    m = core.group_outcomes(successes_P, counts_P, estimate.p_hat_P)
    if true_p_P is not None:
        m["useful_group_fraction_true"] = core.group_outcomes(successes_P, counts_P, true_p_P)[
            "useful_group_fraction_expected"]
    m["cold_start"] = float(estimate.cold)
    s = config.sera
    waterline_fn = core.get_allocator(s.method).waterline_fn
    if waterline_fn is not None:
        m["waterline_tau"] = 0.0
        if estimate.p_hat_P is not None and s.budget == "rollouts":
            n0 = s.pilot_rollouts if estimate.pilot is not None else 0
            m["waterline_tau"] = waterline_fn(estimate.p_hat_P, config.rl.rollouts_per_step, n_min=max(s.n_min, n0),
                                              n_max=s.n_max, estimator=s.estimator, floor=n0,
                                              threshold=s.activation_threshold)
    return m


SELECTION_STREAM = 0x5E1EC7  # folded into the step's key for a selection allocator's draws (not the rollouts')


def task_reward_metrics(task: RLTask) -> dict[str, Any]:
    """What the task counted while scoring since the last read, e.g. the math grader's timeouts and errors:
    ``task.reward_metrics()`` (read and reset) where the task has one, else nothing."""
    read = getattr(task, "reward_metrics", None)
    return {} if read is None else dict(read())


def scale_inputs(ctx: RLContext, prompts: PromptBatch, estimate: Estimate) -> dict[str, Any]:
    """What ``step_metrics`` needs for truthful scale factors: the Beta posterior the estimate came from (pilot:
    Jeffreys after the pilot; history: the tracker's before this step's update; None for oracle and uniform),
    and the true success rates when the task knows them."""
    c = ctx.config
    true_p_P = None
    if estimate.p_hat_P is not None and c.sera.p_estimate == "oracle":
        true_p_P = estimate.p_hat_P  # already the task's answer: do not ask twice
    elif ctx.task.knows_success_rates:
        true_p_P = jnp.asarray(ctx.task.oracle_success_rates(prompts), jnp.float32)
    return {"posterior": estimate.posterior, "true_p_P": true_p_P}


def step_metrics(config: ml_collections.ConfigDict, rollouts: Rollouts, successes_P: jax.Array, counts_P: jax.Array,
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
    s = config.sera
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
        m.update(weight_metrics("weight_est", config, estimated, counts_P, p_hat_P))
    if true_p_P is not None:
        true = core.scale_factor(jnp.asarray(true_p_P, jnp.float32), at_least_one_P, s.estimator, max_n=s.n_max)
        true = jnp.where(sampled_P, true, 0.0)
        m.update({f"scale_true_{k}": v for k, v in core.scale_factor_stats(true).items()})
        m.update(weight_metrics("weight_true", config, true, counts_P, true_p_P))
    return m


def weight_metrics(prefix: str, config: ml_collections.ConfigDict, scales_P: jax.Array, counts_P: jax.Array,
                   p_P: jax.Array) -> dict[str, jax.Array]:
    """Each prompt's weight on ``grad log p_i`` relative to the exact likelihood objective's (1: exact; issue 22
    §3): ``s_i`` with the multiplicity correction, ``N_i s_i / N_bar`` without it (more rollouts, more weight).
    ``{prefix}_{min,max,mean,cv}`` and, ranking the prompts by ``p_P``, the mean weight of the harder half
    (``_hard``, the lower ceil(P/2)) and of the rest (``_easy``): a method that under-weights hard prompts has
    ``_hard < _easy``. Sequence-sum aggregation only: the others weigh tokens, not sequences (nothing logged)."""
    if config.sera.aggregation != "sequence_sum":
        return {}
    num_prompts = scales_P.shape[0]
    weights_P = num_prompts * core.effective_prompt_weights(scales_P, counts_P, correction=config.sera.correction)
    m = {f"{prefix}_{k}": v for k, v in core.scale_factor_stats(weights_P).items()}
    if num_prompts >= 2:
        ranked = weights_P[jnp.argsort(jnp.asarray(p_P, jnp.float32), stable=True)]
        half = (num_prompts + 1) // 2
        m[f"{prefix}_hard"], m[f"{prefix}_easy"] = jnp.mean(ranked[:half]), jnp.mean(ranked[half:])
    return m


# -- evaluation --------------------------------------------------------------------------------------


def evaluate(ctx: RLContext, params: Any, step: int, seed: int, *, show_progress: bool = False) -> dict[str, Any]:
    """Unbiased pass@k on the task's held-out prompts with ``eval.samples_per_prompt`` samples each; the task's
    rewards are checked as in training (``score_rollouts``: 0/1 only, a fraction or NaN is a ValueError)."""
    c = ctx.config.eval
    prompts = ctx.task.eval_prompts()
    n = c.samples_per_prompt
    num_q = prompts.tokens_PxT.shape[0]
    per_call = max(1, c.max_rollouts_per_call // n)
    correct = np.zeros(num_q, np.int64)
    key = jax.random.fold_in(jax.random.key(seed + 1_000_003), step)
    chunks = range(0, num_q, per_call)
    ids = jnp.repeat(jnp.arange(per_call, dtype=jnp.int32), n)
    for start in progress(chunks, desc=f"eval at step {step}", leave=False,
                          disable=not show_progress or len(chunks) < 2):
        idx = np.arange(start, min(start + per_call, num_q))
        chunk = pad_prompts(take_prompts(prompts, idx), per_call)  # static shapes: the sampler compiles once
        rollouts = sample_rollouts(ctx, params, chunk, ids, jax.random.fold_in(key, start), c.temperature,
                                   ctx.eval_sample_fn)
        rewards = np.asarray(score_rollouts(ctx.task, chunk, rollouts))  # checked 0/1, as in training
        correct[idx] = np.bincount(host_array(ids), weights=rewards, minlength=per_call)[: len(idx)].astype(np.int64)
    ks = [k for k in c.ks if k <= n]
    curve = core.mean_pass_at_k(n, correct, ks)
    rates = correct / n
    return {"step": step, "rollouts_spent": step * ctx.config.rl.rollouts_per_step, "k": ks,
            "pass_at_k": [float(v) for v in curve], "solved_frac": float(np.mean(correct > 0)),
            "p_quantiles": {str(q): float(np.quantile(rates, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}}


def _take_payload(payload: Any, idx: np.ndarray) -> Any:
    if payload is None:
        return None
    if isinstance(payload, (list, tuple)):
        return [payload[i] for i in idx]
    return jax.tree.map(lambda x: np.asarray(x)[idx], payload)


def take_prompts(batch: PromptBatch, idx: np.ndarray) -> PromptBatch:
    return PromptBatch(batch.keys_P[idx], batch.tokens_PxT[idx], batch.lengths_P[idx],
                       _take_payload(batch.payload, idx))


def pad_prompts(batch: PromptBatch, num: int) -> PromptBatch:
    """Repeats the first prompt up to ``num`` prompts (their samples are ignored) to keep shapes static."""
    pad = num - len(batch.keys_P)
    if pad <= 0:
        return batch
    return take_prompts(batch, np.concatenate([np.arange(len(batch.keys_P)), np.zeros(pad, np.int64)]))


# -- the run -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class RLRun:
    state: RLState
    history: list[dict[str, float]]
    evaluations: list[dict[str, Any]]

    @property
    def step(self) -> int:
        return int(host_array(self.state.step))


def data_order(task: RLTask, config: ml_collections.ConfigDict, seed: int) -> Callable[[int, int], PromptBatch]:
    """``(step, P) -> prompts`` of a run: the task's one order (``rl.data_order="fixed"``) or seed ``seed``'s
    (``"seed"``: ``task.train_prompts(step, P, order=seed)``); ValueError when the task cannot reorder."""
    if config.rl.data_order == "fixed":
        return task.train_prompts
    if "order" not in inspect.signature(task.train_prompts).parameters:
        raise ValueError(f"config.rl.data_order='seed': {type(task).__name__}.train_prompts(step, num) takes no "
                         "order=; give it one or use data_order='fixed'")
    return functools.partial(task.train_prompts, order=seed)


def train_rl(task: RLTask, model: nnx.Module, config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
             seed: int = 0, writer: Optional[MetricWriter] = None, placement: Optional[Placement] = None,
             fingerprint: Optional[dict] = None, update: Optional[tuple[Any, Callable]] = None,
             sample_fns: Optional[SampleFns] = None, allowance: Optional[StepAllowance] = None,
             show_progress: bool = True, start_evaluation: Optional[dict[str, Any]] = None) -> RLRun:
    """RL of ``model`` on ``task`` from the latest checkpoint in ``workdir/checkpoints`` (or the model) to
    ``rl.steps``; ``update``: a shared ``make_update(graphdef, config)`` for runs of the same rl settings;
    ``sample_fns``: a shared ``make_sample_fns(graphdef, task, config)`` for runs of equal sampling settings;
    ``start_evaluation``: the step-0 evaluation of another run of this ``model``, ``seed`` and ``config.eval``
    (another method of a comparison's seed), reused instead of sampled again: it depends on nothing else."""
    graphdef, params = nnx.split(model)
    tx, update_fn = update or make_update(graphdef, config)
    ctx = make_context(task, graphdef, config, placement=placement, update_fn=update_fn, sample_fns=sample_fns)
    base_key = jax.random.key(seed)

    prompts_of_step = data_order(task, config, seed)

    def step_fn(state: RLState, step: int):
        return rl_step(ctx, state, prompts_of_step(step, prompts_fetched_per_step(config)),
                       jax.random.fold_in(base_key, step))

    def evaluate_fn(state: RLState, step: int):
        if step == 0 and start_evaluation is not None:
            record = copy.deepcopy(start_evaluation)
        else:
            record = evaluate(ctx, state.params, step, seed, show_progress=show_progress)
        record.pop("step")
        return record, {f"eval/pass@{k}": v for k, v in zip(record["k"], record["pass_at_k"])}

    checkpointer = ckpt_lib.Checkpointer(pathlib.Path(workdir) / "checkpoints", max_to_keep=config.ckpt.max_to_keep,
                                         config_fingerprint=fingerprint)
    with checkpointer:
        out = run_loop(init_state(ctx, params, tx), step_fn, num_steps=config.rl.steps, checkpointer=checkpointer,
                       desc="rl", evaluate=evaluate_fn, eval_every=config.eval.every, save_every=config.ckpt.every,
                       writer=writer, allowance=allowance, show_progress=show_progress,
                       num_steps_field="config.rl.steps")
    return RLRun(out.state, out.history, out.evaluations)
