"""The RL step as a pure function of (state, prompts, key), its named stages, and the RL run.

One step (on-policy, one update per batch, as in MaxRL):

1. ``estimate_success_rates``: ``pilot`` (n0 rollouts each, inside the budget), ``history`` (the Beta tracker
   over earlier epochs), ``epoch_history`` (the SERA authors' estimates, frozen per epoch; a step with a prompt not
   yet estimated is uniform) or ``oracle`` (a task that knows p); nothing for an allocator that needs none;
2. ``allocate_rollouts``: the budget B split by the allocator ``sera.method`` names (looked up once, by
   ``make_context``, into ``RLContext.allocator``; every stage reads it there);
3. ``sample_rollouts`` (``sera_jax.rl.rollouts``) on the flat layout (``rl.sample_chunk`` rows per call). One
   sampling key per step, and rollouts keyed by (prompt, rank) (``sera_jax.models.sampler``): the pilot is ranks
   0..n0-1 of each prompt and the main call continues at rank n0, so at equal parameters every method's rollout j
   of prompt i is the same (common random numbers: differences between allocators are the allocators');
4. ``score_rollouts`` (``sera_jax.rl.rollouts``): the task's binary rewards, checked;
5. ``policy_gradient_inputs``: advantages (any registered estimator) and multiplicity-corrected loss weights;
6. the update (``step.make_policy_gradient_update``: AdamW on the surrogate), and the tracker's update.

The step's metrics are assembled in ``sera_jax.rl.metrics`` and evaluation is ``sera_jax.rl.evaluation``; their
functions (and the types of ``sera_jax.rl.context``) stay importable from here under their old names.

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
from sera_jax.rl.config import prompts_fetched_per_step
from sera_jax.rl.settings import RunSettings, parse_run_settings
# The stages and records that moved out of this module, importable from it as before (``train_rl`` calls
# ``evaluate`` through this module's name, so a test that replaces ``trainer.evaluate`` still reaches the run).
from sera_jax.rl.context import Estimate, RLContext, Rollouts  # noqa: F401
from sera_jax.rl.evaluation import evaluate  # noqa: F401
from sera_jax.rl.metrics import (allocation_metrics, rollout_metrics, scale_inputs, step_metrics,  # noqa: F401
                                 task_reward_metrics, weight_metrics)
from sera_jax.rl.rollouts import pad_prompts, sample_rollouts, score_rollouts, take_prompts  # noqa: F401
from sera_jax.rl.task import PromptBatch, RLTask
from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train.distributed import host_array
from sera_jax.train.loop import StepAllowance, run_loop
from sera_jax.train.sharding import Placement
from sera_jax.train.writers import MetricWriter


class RLState(NamedTuple):
    """Everything an RL run carries from one step to the next (checkpointed whole)."""

    params: Any  # nnx.State of the policy
    opt_state: Any
    tracker: core.TrackerState  # Beta success-rate tracker over the training prompts (history estimates)
    step: jax.Array  # int32 scalar: updates done
    skips: core.SkipState  # each training prompt's trailing all-correct / all-wrong visits (GRESO's history)
    epochs: core.EpochHistoryState  # the authors' per-epoch frozen estimates (sera.p_estimate="epoch_history")


@dataclasses.dataclass(frozen=True)
class SampleFns:
    """The jitted samplers of a run: ``train`` (pilot and rollouts: ``rl.top_p``, ``rl.sample_slots``) and
    ``eval`` (``eval.top_p``, ``eval.sample_slots``); one object when the two sample alike."""

    train: Callable
    eval: Callable


def sample_fn_settings(graphdef: nnx.GraphDef, task: RLTask, settings: RunSettings) -> tuple:
    """Everything ``make_sample_fns`` reads: runs whose settings are equal can share one ``SampleFns``."""
    return (graphdef, task.max_new_tokens, task.pad_id, settings.rl.top_p, settings.rl.sample_slots,
            settings.eval.top_p, settings.eval.sample_slots)


def make_sample_fns(graphdef: nnx.GraphDef, task: RLTask, settings: RunSettings) -> SampleFns:
    """The run's samplers; build once and share between runs of equal ``sample_fn_settings`` (each keeps its own
    compilations, so a rebuilt sampler compiles again)."""
    def build(top_p: float, slots: int):
        return make_sample_fn(graphdef, max_new_tokens=task.max_new_tokens, top_p=top_p, pad_id=task.pad_id,
                              num_slots=slots or None)

    train = build(settings.rl.top_p, settings.rl.sample_slots)
    same = (settings.eval.top_p, settings.eval.sample_slots) == (settings.rl.top_p, settings.rl.sample_slots)
    return SampleFns(train=train, eval=train if same else build(settings.eval.top_p, settings.eval.sample_slots))


def make_rl_optimizer(settings: RunSettings):
    """AdamW of ``settings.rl`` (with global-norm clipping)."""
    rl = settings.rl
    return step_lib.make_optimizer(rl.learning_rate, b1=rl.b1, b2=rl.b2, weight_decay=rl.weight_decay,
                                   grad_clip=rl.grad_clip)


def make_update(graphdef: nnx.GraphDef, settings: RunSettings) -> tuple[Any, Callable]:
    """(optimizer, jitted update) of ``settings.rl``: build once and share between runs of the same rl settings."""
    tx = make_rl_optimizer(settings)
    return tx, step_lib.make_policy_gradient_update(graphdef, tx, settings.rl.update_microbatches,
                                                    settings.rl.logprob_chunk)


def make_context(task: RLTask, graphdef: nnx.GraphDef, settings: RunSettings | ml_collections.ConfigDict, *,
                 placement: Optional[Placement] = None, update_fn: Optional[Callable] = None,
                 sample_fns: Optional[SampleFns] = None) -> RLContext:
    """Binds what every step uses: the run's settings (``RunSettings``, parsed once at the run's door; a config is
    parsed here, for ``task``), with the allocator ``sera.method`` names, ``update_fn`` (a shared update from
    ``make_update``, which must have been built from the same ``rl`` settings), ``sample_fns`` (shared samplers
    from ``make_sample_fns``, built from equal ``sample_fn_settings``)."""
    placement = placement or Placement()
    settings = run_settings(settings, task, placement)
    if update_fn is None:
        update_fn = make_update(graphdef, settings)[1]
    if sample_fns is None:
        sample_fns = make_sample_fns(graphdef, task, settings)
    return RLContext(task=task, settings=settings, graphdef=graphdef, placement=placement,
                     sample_fn=sample_fns.train, eval_sample_fn=sample_fns.eval, update_fn=update_fn,
                     allocator=settings.allocator)


def run_settings(settings: RunSettings | ml_collections.ConfigDict, task: RLTask,
                 placement: Placement) -> RunSettings:
    """``settings`` as they are, or a config parsed for ``task`` on ``placement`` (the door of a run started
    without a comparison: ``train_rl(task, model, config, workdir)``)."""
    if isinstance(settings, RunSettings):
        return settings
    return parse_run_settings(settings, endless=task.num_train_prompts is None,
                              knows_success_rates=task.knows_success_rates, num_shards=placement.num_batch_shards,
                              num_train_prompts=task.num_train_prompts, max_new_tokens=task.max_new_tokens)


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


def successes_per_prompt(rollouts: Rollouts, num_prompts: int) -> jax.Array:
    """Successful rollouts of each prompt: a segment sum over the flat layout."""
    return jax.ops.segment_sum(rollouts.rewards_B, rollouts.prompt_ids_B, num_prompts)


def estimate_success_rates(ctx: RLContext, state: RLState, prompts: PromptBatch, key: jax.Array) -> Estimate:
    """Stage 1: p_hat of the step's prompts as ``sera.p_estimate`` says (the pilot spends rollouts of the step:
    ranks 0..n0-1 of each prompt, sampled with the step's sampling ``key``)."""
    c = ctx.settings
    if not ctx.allocator.needs_estimate:
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


def allocate_rollouts(settings: RunSettings, allocator: core.Allocator, estimate: Estimate) -> jax.Array:
    """Stage 2: rollouts per prompt ``counts_P`` (pilot rollouts included), summing to ``rl.rollouts_per_step``, by
    ``allocator`` (the run's, ``RLContext.allocator``); with ``sera.budget="tokens"``, whose expected tokens (each
    prompt's pilot mean length per rollout) fit ``sera.tokens_per_step`` and whose rows fit
    ``rl.rollouts_per_step`` (``core.allocate_tokens``)."""
    P, B = settings.rl.prompts_per_step, settings.rl.rollouts_per_step
    s = settings.sera
    bounds = dict(n_min=s.n_min, n_max=s.n_max, estimator=s.estimator, threshold=s.activation_threshold)
    if s.budget == "tokens":
        target = estimate.posterior if s.use_posterior else estimate.p_hat_P
        # A pilot rollout that wrote nothing still costs its slot: at least one token each.
        costs_P = jnp.maximum(estimate.pilot_lengths_P, 1.0)
        return core.allocate_tokens(target, float(s.tokens_per_step), costs_P, B,
                                    n_min=max(s.n_min, s.pilot_rollouts), n_max=s.n_max, estimator=s.estimator)
    if estimate.pilot is not None:
        return core.pilot_allocate(estimate.pilot_successes_P, s.pilot_rollouts, B, use_posterior=s.use_posterior,
                                   method=allocator, **bounds)
    if estimate.cold:
        return core.uniform_counts(P, B)
    return allocator.counts(estimate.target, B, num_prompts=P, **bounds)


def main_rollout_ids(settings: RunSettings, counts_P: jax.Array, estimate: Estimate) -> jax.Array:
    """The flat layout of the rollouts still to sample: ``counts_P`` less the pilot's, prompt by prompt (their
    ranks start at ``main_rank_offset``). Under a token budget the number of rows varies, so the layout is sized
    on the host (the sampling calls keep one shape: ``main_rows_per_call``)."""
    rows = settings.rl.rollouts_per_step - (0 if estimate.pilot is None else estimate.pilot.prompt_ids_B.shape[0])
    n0 = settings.sera.pilot_rollouts if estimate.pilot is not None else 0
    if settings.sera.budget == "tokens":
        extra_P = np.asarray(host_array(counts_P), np.int64) - n0
        return jnp.asarray(np.repeat(np.arange(extra_P.shape[0], dtype=np.int32), extra_P))
    return jnp.repeat(jnp.arange(counts_P.shape[0], dtype=jnp.int32), counts_P - n0, total_repeat_length=rows)


def main_rows_per_call(settings: RunSettings) -> int:
    """Rows of each main sampling call under a token budget: the step's rows less the pilot's, whatever the
    allocation spends (0: the layout's own length, fixed for a rollout budget)."""
    if settings.sera.budget != "tokens":
        return 0
    return settings.rl.rollouts_per_step - settings.rl.prompts_per_step * settings.sera.pilot_rollouts


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


def main_rank_offset(settings: RunSettings, estimate: Estimate) -> jax.Array:
    """Rank of each prompt's first main rollout: the pilot's rollouts per prompt (0 without a pilot), so that the
    main call continues the pilot's ranks and rollout j of prompt i is the same for every method."""
    n0 = settings.sera.pilot_rollouts if estimate.pilot is not None else 0
    return jnp.full((settings.rl.prompts_per_step,), n0, jnp.int32)


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
    c = ctx.settings
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
    c = ctx.settings
    P = c.rl.prompts_per_step
    select_fn = ctx.allocator.select_fn
    if select_fn is None:
        return candidates
    idx = np.asarray(host_array(select_fn(state, jnp.asarray(candidates.keys_P), P, key, c.sera)))
    if idx.shape != (P,) or len(set(idx.tolist())) != P or idx.min() < 0 or idx.max() >= len(candidates.keys_P):
        raise ValueError(f"allocator {c.sera.method!r}: select_fn must pick {P} distinct candidates of "
                         f"{len(candidates.keys_P)}, got {idx.tolist()}")
    return take_prompts(candidates, idx)


def train_mask(settings: RunSettings, allocator: core.Allocator,
               rollouts: Rollouts) -> Optional[jax.Array]:
    """Which rollouts enter the loss: ``allocator.keep_fn`` of the scored rollouts (None: every one)."""
    keep_fn = allocator.keep_fn
    if keep_fn is None:
        return None
    return jnp.asarray(keep_fn(rollouts.rewards_B, rollouts.prompt_ids_B, settings.rl.prompts_per_step, settings.sera),
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
    s = ctx.settings.sera
    if rollouts.train_B is not None and not float(host_array(jnp.sum(rollouts.train_B))) > 0:
        zero = jnp.zeros((), jnp.float32)  # the surrogate and its gradient are 0 with every weight 0
        return state._replace(step=state.step + 1), {"loss": zero, "grad_norm": zero, "update_skipped": zero + 1}
    batch, adv = policy_gradient_inputs(
        jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P), rollouts.prompt_ids_B,
        rollouts.sample.tokens_BxR, rollouts.sample.mask_BxR, rollouts.rewards_B, rollouts.train_B,
        rollouts.counted_B, estimator=s.estimator, aggregation=s.aggregation, correction=s.correction,
        share_prompts=ctx.settings.rl.share_prompts,
        advantages_from_kept=ctx.allocator.advantages_from_kept,
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
    tracker = core.tracker_update(state.tracker, keys, successes_P, counts_P, decay=ctx.settings.sera.history_decay)
    epochs = core.epoch_history_record(state.epochs, keys, successes_P, counts_P)
    fetched_before = (state.step.astype(jnp.int32) - 1) * prompts_fetched_per_step(ctx.settings, ctx.allocator)
    skips = state.skips
    if not ctx.allocator.may_skip_prompts:  # GRESO's streaks read every prompt's group
        skips = core.greso_update(state.skips, keys, successes_P, counts_P,
                                  epoch_started=fetched_before >= ctx.task.num_train_prompts)
    return state._replace(tracker=tracker, skips=skips, epochs=epochs)


def advance_epochs(ctx: RLContext, state: RLState) -> RLState:
    """The authors' estimator at the epoch of the step ``state.step`` is about to take: at an epoch boundary the
    last epoch's outcomes join the (discounted) evidence and the estimates freeze for the new epoch. A function of
    the step alone, so a run resumed mid-epoch continues exactly."""
    if ctx.task.num_train_prompts is None:
        return state
    s = ctx.settings.sera
    per_epoch = core.epoch_length(ctx.task.num_train_prompts, prompts_fetched_per_step(ctx.settings, ctx.allocator))
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
    c = ctx.settings
    P = c.rl.prompts_per_step
    allocator = ctx.allocator
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
        counts_P = phases.done("allocate", allocate_rollouts(c, allocator, estimate))
        main = sample_rollouts(ctx, state.params, prompts, main_rollout_ids(c, counts_P, estimate), key,
                               c.rl.temperature, rank_offset_P=main_rank_offset(c, estimate),
                               rows_per_call=main_rows_per_call(c))
        phases.done("sample", main)
        main = main._replace(rewards_B=phases.done("reward", score_rollouts(ctx.task, prompts, main)))
        rollouts, rounds = join_rollouts(estimate.pilot, main), 1 + (estimate.pilot is not None)
    rollouts = rollouts._replace(train_B=train_mask(c, allocator, rollouts))
    new_state, metrics = update_policy(ctx, state, prompts,
                                       pad_rollouts(rollouts, c.rl.rollouts_per_step, ctx.task.pad_id))
    successes_P = successes_per_prompt(rollouts, P)
    new_state = phases.done("update", update_tracker(ctx, new_state, prompts, successes_P, counts_P))
    metrics.update(rollout_metrics(ctx, prompts, rollouts, successes_P, counts_P, estimate, rounds))
    metrics.update(task_reward_metrics(ctx.task))
    total = sum(phases.seconds.values())
    metrics["step_seconds"] = total
    metrics.update({f"time_share/{k}": v / max(total, 1e-9) for k, v in phases.seconds.items()})
    return new_state, metrics


SELECTION_STREAM = 0x5E1EC7  # folded into the step's key for a selection allocator's draws (not the rollouts')


# -- the run -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class RLRun:
    state: RLState
    history: list[dict[str, float]]
    evaluations: list[dict[str, Any]]

    @property
    def step(self) -> int:
        return int(host_array(self.state.step))


def data_order(task: RLTask, settings: RunSettings, seed: int) -> Callable[[int, int], PromptBatch]:
    """``(step, P) -> prompts`` of a run: the task's one order (``rl.data_order="fixed"``) or seed ``seed``'s
    (``"seed"``: ``task.train_prompts(step, P, order=seed)``); ValueError when the task cannot reorder."""
    if settings.rl.data_order == "fixed":
        return task.train_prompts
    if "order" not in inspect.signature(task.train_prompts).parameters:
        raise ValueError(f"config.rl.data_order='seed': {type(task).__name__}.train_prompts(step, num) takes no "
                         "order=; give it one or use data_order='fixed'")
    return functools.partial(task.train_prompts, order=seed)


def train_rl(task: RLTask, model: nnx.Module, settings: RunSettings | ml_collections.ConfigDict,
             workdir: str | pathlib.Path, *, seed: int = 0, writer: Optional[MetricWriter] = None,
             placement: Optional[Placement] = None,
             fingerprint: Optional[dict] = None, update: Optional[tuple[Any, Callable]] = None,
             sample_fns: Optional[SampleFns] = None, allowance: Optional[StepAllowance] = None,
             show_progress: bool = True, start_evaluation: Optional[dict[str, Any]] = None,
             desc: str = "rl") -> RLRun:
    """RL of ``model`` on ``task`` from the latest checkpoint in ``workdir/checkpoints`` (or the model) to
    ``rl.steps``. ``settings``: the run's ``RunSettings``, or a config, parsed here for ``task``; ``desc`` names
    the run in its progress lines; ``update``: a shared ``make_update(graphdef,
    settings)`` for runs of the same rl settings;
    ``sample_fns``: a shared ``make_sample_fns(graphdef, task, settings)`` for runs of equal sampling settings;
    ``start_evaluation``: the step-0 evaluation of another run of this ``model``, ``seed`` and ``config.eval``
    (another method of a comparison's seed), reused instead of sampled again: it depends on nothing else."""
    graphdef, params = nnx.split(model)
    settings = run_settings(settings, task, placement or Placement())
    tx, update_fn = update or make_update(graphdef, settings)
    ctx = make_context(task, graphdef, settings, placement=placement, update_fn=update_fn, sample_fns=sample_fns)
    base_key = jax.random.key(seed)

    prompts_of_step = data_order(task, settings, seed)
    fetched = prompts_fetched_per_step(settings, ctx.allocator)

    def step_fn(state: RLState, step: int):
        return rl_step(ctx, state, prompts_of_step(step, fetched), jax.random.fold_in(base_key, step))

    def evaluate_fn(state: RLState, step: int):
        if step == 0 and start_evaluation is not None:
            record = copy.deepcopy(start_evaluation)
        else:
            record = evaluate(ctx, state.params, step, seed, show_progress=show_progress)
        record.pop("step")
        metrics = {f"eval/pass@{k}": v for k, v in zip(record["k"], record["pass_at_k"])}
        metrics.update({f"eval/pass@{k}_bootstrap": v
                        for k, v in zip(record["k"], record.get("pass_at_k_bootstrap", ()))})
        return record, metrics

    checkpointer = ckpt_lib.Checkpointer(pathlib.Path(workdir) / "checkpoints", max_to_keep=settings.ckpt.max_to_keep,
                                         config_fingerprint=fingerprint)
    with checkpointer:
        out = run_loop(init_state(ctx, params, tx), step_fn, num_steps=settings.rl.steps, checkpointer=checkpointer,
                       desc=desc, evaluate=evaluate_fn, eval_every=settings.eval.every,
                       save_every=settings.ckpt.every,
                       writer=writer, allowance=allowance, show_progress=show_progress,
                       num_steps_field="config.rl.steps")
    return RLRun(out.state, out.history, out.evaluations)
