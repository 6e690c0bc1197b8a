"""SERA inside tunix's RL learners (``pip install 'sera_jax[tunix]'``; built on google-tunix 0.1.7).

tunix's GRPO learner draws ``num_generations`` rollouts of every prompt and reshapes by that number, so one
integer fixes every group. :class:`SeraLearner` is tunix's ``GRPOLearner`` with one stage replaced: the step
that turns a batch of prompts into a ``TrainExample``. It keeps the budget tunix already spends,
``B = P x num_generations`` rollouts (``num_generations`` is the mean count N̄), and gives it out as SERA does:

1. estimate each prompt's success rate: a pilot of ``pilot_rollouts`` inside the budget, or the Beta
   ``history`` tracker keyed by a dataset-wide prompt index (``sera_jax.core.success_rates``);
2. allocate the budget with a registered counts allocator (``sera`` by default: the rule its authors released,
   which gives prompts with little chance of a mixed group no rollouts; ``sera_all_active`` the max-min of
   ``min_i s(p_i, N_i)`` over every prompt; ``uniform`` is MaxRL), every sampled prompt between ``n_min`` and
   ``n_max``;
3. generate the rest of each prompt's rollouts with tunix's own rollout engine, as one ragged flat batch
   (``prompt_ids_B``: no reshape by a fixed group size anywhere);
4. score them with the user's reward functions, then MaxRL's advantages (or any ``sera_jax`` estimator) on the
   flat layout and SERA's multiplicity-corrected per-token loss weights (each prompt's rollouts share 1/P);
5. hand tunix a :class:`SeraTrainExample` (the usual fields plus ``loss_weights``) that its trainer feeds to
   the ``sera`` policy loss registered here: ``L = -sum_bt w_bt min(r A_b, clip(r) A_b)`` (+ ``beta`` KL),
   whose gradient on-policy (``r = 1``) is ``sera_jax``'s ``-sum_bt w_bt A_b grad log pi`` (docs/method.md §4).

tunix's model classes, rollout engines, optimizer, checkpoints and metric loggers stay tunix's. The module also
registers ``maxrl`` in tunix's advantage-estimator registry, so a plain ``GRPOLearner`` can run MaxRL's estimator
on its uniform groups. Usage::

    from sera_jax.integrations import tunix as sera_tunix
    config = sera_tunix.SeraConfig(num_generations=16, n_min=4, n_max=64, pilot_rollouts=4)
    learner = sera_tunix.SeraLearner(rl_cluster=cluster, algo_config=config, reward_fns=reward_fn)
    learner.train(dataset)  # batches of {"prompts": np.array([...]), ...}: tunix's own format

Rewards must be 0/1 (the success-rate estimates and MaxRL's estimator are defined for binary rewards).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable, List, Optional, Sequence

import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as generate_utils
from tunix.rl import common
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner

from sera_jax import core

SERA_POLICY_LOSS = "sera"  # the name of the policy loss below in tunix's registry
MAXRL_ADVANTAGE = "maxrl"  # MaxRL's estimator for tunix's uniform groups (GRPOLearner)
P_ESTIMATES = ("pilot", "history")

Mode = rl_cluster_lib.Mode


@flax.struct.dataclass(frozen=True)
class SeraTrainExample(common.TrainExample):
    """tunix's ``TrainExample`` plus the per-token loss weights ``w_bt`` (B, T) of ``sera_jax.loss_weights``,
    already scaled for tunix's averaging over micro-batches (so an optimizer update sees SERA's loss)."""

    loss_weights: Optional[jax.Array] = None


@dataclasses.dataclass(kw_only=True)
class SeraConfig(grpo_learner.GRPOConfig):
    """tunix's GRPO settings plus SERA's. ``num_generations`` is the mean rollouts a prompt N̄: a step spends
    ``P x num_generations`` rollouts, as a GRPO step would, allocated unevenly.

    Attributes:
      allocator: a counts allocator of ``sera_jax.core.allocators`` (``sera``, ``uniform``, ``sera_sum``,
        ``dynamo``, ``knapsack``).
      advantage_estimator: a ``sera_jax`` estimator (``maxrl``, ``grpo``, ``rloo``, ...), on the flat layout.
      n_min, n_max: bounds on each prompt's rollouts (pilot included); ``n_max=0``: no cap but the budget.
      p_estimate: ``pilot`` (``pilot_rollouts`` of each prompt first, inside the budget; every rollout trains) or
        ``history`` (a Beta tracker of earlier steps, keyed by the integer column ``prompt_index_key`` of the
        training data, values in ``[0, num_prompts)``; ``history_decay`` < 1 forgets older steps).
      use_posterior: allocate on the Beta posterior (its expected scale factor) rather than its mean.
      correction: SERA's multiplicity correction (False: every rollout weighs alike, the ablation).
      aggregation: ``sequence_mean`` (each rollout's tokens share its weight, tunix's default), ``token_mean``
        (verl's, MaxRL's) or ``sequence_sum`` (``sera_jax.core.weights``).
      generation_chunk: rows a rollout call generates at once (0: all of a call's rows).
      seed: the rollouts' sampling seed; every generation call of every step draws with its own key from it.
    """

    algo_variant: str = "sera"
    advantage_estimator: str = "maxrl"
    policy_loss_fn: str = SERA_POLICY_LOSS
    loss_agg_mode: str = "sequence-mean-token-mean"  # unused by the sera loss: see ``aggregation``
    beta: float = 0.0  # MaxRL trains without a KL penalty
    allocator: str = "sera"
    n_min: int = 2
    n_max: int = 0
    p_estimate: str = "pilot"
    pilot_rollouts: int = 2
    use_posterior: bool = False
    num_prompts: int = 0
    prompt_index_key: str = "prompt_index"
    history_decay: float = 1.0
    correction: bool = True
    aggregation: str = "sequence_mean"
    generation_chunk: int = 0
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        est = core.get_estimator(self.advantage_estimator)  # ValueError naming the known estimators
        if self.n_min < est.min_rollouts:
            raise ValueError(f"SeraConfig.n_min={self.n_min}: estimator {est.name!r} needs at least "
                             f"{est.min_rollouts} rollouts a prompt")
        allocator = core.get_allocator(self.allocator)
        self._registered_allocator = allocator  # looked up once: not a field (tunix lists and copies those)
        if allocator.kind != "counts" or allocator.keep_fn is not None:
            raise ValueError(f"SeraConfig.allocator={self.allocator!r} is a {allocator.kind} allocator that "
                             "decides after sampling; the tunix learner takes counts allocators only "
                             f"({', '.join(counts_allocators())})")
        allocator.check_estimator(est)
        if self.p_estimate not in P_ESTIMATES:
            raise ValueError(f"SeraConfig.p_estimate={self.p_estimate!r} is not one of {P_ESTIMATES}")
        if allocator.needs_estimate and self.p_estimate not in allocator.p_estimates:
            raise ValueError(f"SeraConfig.p_estimate={self.p_estimate!r}: allocator {self.allocator!r} is "
                             f"defined for {allocator.p_estimates}")
        if self.aggregation not in core.weights.AGGREGATIONS:
            raise ValueError(f"SeraConfig.aggregation={self.aggregation!r} is not one of {core.weights.AGGREGATIONS}")
        if self.n_min < 1:
            raise ValueError(f"SeraConfig.n_min={self.n_min} must be >= 1")
        if self.n_max and self.n_max < max(self.n_min, self.pilot_rollouts):
            raise ValueError(f"SeraConfig.n_max={self.n_max} is below n_min={self.n_min} or "
                             f"pilot_rollouts={self.pilot_rollouts}")
        if self.n_min > self.num_generations:
            raise ValueError(f"SeraConfig.n_min={self.n_min} exceeds the mean count num_generations="
                             f"{self.num_generations}: the budget cannot give every prompt n_min rollouts")
        if self.uses_pilot and not 1 <= self.pilot_rollouts <= self.num_generations:
            raise ValueError(f"SeraConfig.pilot_rollouts={self.pilot_rollouts} must be in [1, num_generations="
                             f"{self.num_generations}]")
        if self.uses_history and self.num_prompts < 1:
            raise ValueError("SeraConfig.num_prompts must be the training set's size (>= 1) with "
                             "p_estimate='history'")
        if not 0.0 < self.history_decay <= 1.0:
            raise ValueError(f"SeraConfig.history_decay={self.history_decay} must be in (0, 1]")
        if self.generation_chunk < 0:
            raise ValueError(f"SeraConfig.generation_chunk={self.generation_chunk} must be >= 0")

    @property
    def registered_allocator(self) -> core.Allocator:
        """The registry's entry ``allocator`` names, looked up once by ``__post_init__`` (again only if the field
        was changed since)."""
        if self._registered_allocator.name != self.allocator:
            self._registered_allocator = core.get_allocator(self.allocator)
        return self._registered_allocator

    @property
    def needs_estimate(self) -> bool:
        return self.registered_allocator.needs_estimate

    @property
    def uses_pilot(self) -> bool:
        return self.needs_estimate and self.p_estimate == "pilot"

    @property
    def uses_history(self) -> bool:
        return self.needs_estimate and self.p_estimate == "history"


def counts_allocators() -> list[str]:
    """The registered allocators that choose counts before sampling (the ones the tunix learner runs)."""
    return sorted(name for name, a in core.ALLOCATORS.items() if a.kind == "counts" and a.keep_fn is None)


@function_registry.register_advantage_estimator(MAXRL_ADVANTAGE)
def maxrl_group_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """MaxRL's advantages for tunix's uniform groups (consecutive blocks of ``num_generations``)."""
    rewards = np.asarray(rewards, np.float32)
    num_prompts = rewards.shape[0] // num_generations
    prompt_ids = np.repeat(np.arange(num_prompts, dtype=np.int32), num_generations)
    return np.asarray(core.advantages(jnp.asarray(rewards), jnp.asarray(prompt_ids), num_prompts, "maxrl"))


@function_registry.register_policy_loss_fn(SERA_POLICY_LOSS)
def sera_policy_loss(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    """``L = -sum_bt w_bt min(r_bt A_b, clip(r_bt, 1 - eps, 1 + eps_high) A_b) + beta sum_bt w_bt KL_bt``.

    ``w_bt``: the example's ``loss_weights`` (``sera_jax.loss_weights``, 0 on padding); ``r_bt``: the ratio to
    the rollout policy (1 on-policy, where the gradient is ``-sum_bt w_bt A_b grad log pi``: docs/method.md §4).
    """
    del kwargs
    weights_BxT = getattr(train_example, "loss_weights", None)
    if weights_BxT is None:
        raise ValueError(f"the {SERA_POLICY_LOSS!r} policy loss needs SeraTrainExample.loss_weights: train with "
                         "sera_jax.integrations.tunix.SeraLearner")
    graphdef, state = nnx.split(model)
    logp_BxT = common.compute_per_token_logps(
        graphdef, state, prompt_tokens=train_example.prompt_ids, completion_tokens=train_example.completion_ids,
        pad_id=pad_id, eos_id=eos_id, stop_gradient=False, temperature=algo_config.temperature)
    logp_BxT = logp_BxT.astype(jnp.float32)
    weights_BxT = weights_BxT.astype(jnp.float32)
    old_BxT = (jax.lax.stop_gradient(logp_BxT) if train_example.old_per_token_logps is None
               else train_example.old_per_token_logps.astype(jnp.float32))
    ratio_BxT = jnp.exp(jnp.clip(logp_BxT - old_BxT, -20.0, 20.0))
    eps_low = algo_config.epsilon
    eps_high = getattr(algo_config, "epsilon_high", None) or eps_low
    adv_Bx1 = train_example.advantages.astype(jnp.float32)[:, None]
    unclipped = ratio_BxT * adv_Bx1
    clipped = jnp.clip(ratio_BxT, 1.0 - eps_low, 1.0 + eps_high) * adv_Bx1
    loss = -jnp.sum(weights_BxT * jnp.minimum(unclipped, clipped))
    scored = weights_BxT != 0
    aux = {"pg_loss": loss,
           "pg_clipfrac": jnp.sum(jnp.where(scored, clipped < unclipped, False)) / jnp.maximum(jnp.sum(scored), 1),
           "kl": jnp.zeros((), jnp.float32)}
    if train_example.ref_per_token_logps is not None:
        kl_BxT = common.compute_kl_divergence(logp_BxT, train_example.ref_per_token_logps, algo_config.kl_loss_mode)
        kl = jnp.sum(weights_BxT * kl_BxT)
        aux["kl"] = kl
        if algo_config.beta:
            loss = loss + algo_config.beta * kl
    return loss, aux


def _left_pad(tokens_BxT: np.ndarray, length: int, pad_id: int) -> np.ndarray:
    extra = length - tokens_BxT.shape[1]
    return np.pad(tokens_BxT, ((0, 0), (extra, 0)), constant_values=pad_id) if extra else tokens_BxT


class SeraLearner(grpo_learner.GRPOLearner[SeraConfig]):
    """tunix's GRPO learner with SERA's allocation, estimator and loss weights (see the module docstring).

    Allocation is over the prompts of one optimizer update, so the rollout stage must see all of them at once:
    ``RLTrainingConfig.rollout_micro_batch_size`` and ``compute_logps_micro_batch_size`` must be unset or at
    least ``mini_batch_size`` (``train_micro_batch_size`` may be smaller: the weights are scaled so that tunix's
    mean over the accumulated micro-batches is SERA's loss). ``SeraConfig.generation_chunk`` bounds the rows
    generated at once. Evaluation batches get ``num_generations`` rollouts each (no allocation).

    After each training step, ``last_allocation`` holds the step's ``counts_P`` (pilot included), ``p_hat_P``,
    ``prompt_ids_B`` and ``rewards_B`` (each prompt's pilot rows first). With ``p_estimate='history'``, ``tracker``
    is the Beta tracker; it travels in the custom metadata of tunix's actor checkpoints (``sera_tracker``), so a run
    restored from a checkpoint continues with the tracker of that step (with rollout and actor on one mesh, where
    tunix generates a step only after the previous update).
    """

    def __init__(self, rl_cluster: rl_cluster_lib.RLCluster, algo_config: SeraConfig, reward_fns, metric_fns=None,
                 data_shuffle_seed: int | None = None):
        if not isinstance(algo_config, SeraConfig):
            raise ValueError(f"SeraLearner needs a SeraConfig, got {type(algo_config).__name__}")
        super().__init__(rl_cluster=rl_cluster, algo_config=algo_config, reward_fns=reward_fns,
                         metric_fns=metric_fns, data_shuffle_seed=data_shuffle_seed)
        if self._training_config.max_seq_token_per_tpu is not None:
            raise ValueError("SeraLearner does not support sequence packing (RLTrainingConfig.max_seq_token_per_tpu):"
                             " the loss weights are per row and token")
        self.tracker = core.tracker_init(algo_config.num_prompts) if algo_config.uses_history else None
        if self.tracker is not None:
            self._checkpoint_tracker()
        self.last_allocation: dict[str, np.ndarray] = {}
        self._calls = 0  # generation calls so far: each draws with its own key

    # -- tunix's hooks -------------------------------------------------------------------------------------------

    def train(self, train_ds: Iterable[Any], eval_ds: Iterable[Any] | None = None, skip_jit: bool = False) -> None:
        iterator = iter(train_ds)
        first = next(iterator)
        self._check_batching(len(first["prompts"]))
        super().train(itertools.chain([first], iterator), eval_ds, skip_jit)

    def _generate_and_compute_advantage(self, training_input, mode: Mode = Mode.TRAIN) -> SeraTrainExample:
        c = self.algo_config
        prompts_B = [str(x) for x in training_input["prompts"]]
        if len(prompts_B) % c.num_generations:
            raise ValueError(f"SeraLearner: {len(prompts_B)} rows are not whole groups of num_generations="
                             f"{c.num_generations}")
        budget = len(prompts_B)
        num_prompts = budget // c.num_generations
        prompts_P = prompts_B[::c.num_generations]  # tunix repeats each prompt num_generations times
        columns_P = {k: np.asarray(v)[::c.num_generations] for k, v in training_input.items()
                     if k not in ("prompts", "trajectory_ids")}
        train = mode == Mode.TRAIN

        pilot = None
        if train and c.uses_pilot:
            pilot_ids = np.repeat(np.arange(num_prompts, dtype=np.int32), c.pilot_rollouts)
            pilot = self._rollouts(prompts_P, columns_P, pilot_ids, mode)
        counts_P, posterior = self._allocate(num_prompts, budget, columns_P, pilot, train)
        p_hat_P = (np.full(num_prompts, np.nan, np.float32) if posterior is None
                   else np.asarray(posterior.mean, np.float32))
        drawn_P = np.zeros(num_prompts, np.int64) if pilot is None else np.full(num_prompts, c.pilot_rollouts)
        main_ids = np.repeat(np.arange(num_prompts, dtype=np.int32), counts_P - drawn_P)
        main = self._rollouts(prompts_P, columns_P, main_ids, mode)
        rows = main if pilot is None else _join(pilot, main, self.rl_cluster.rollout.pad_id())
        prompt_ids_B = rows["prompt_ids_B"]

        adv_B = core.advantages(jnp.asarray(rows["rewards_B"]), jnp.asarray(prompt_ids_B), num_prompts,
                                c.advantage_estimator)
        mask_BxT = rows["completion_ids_BxT"] != self.rl_cluster.rollout.pad_id()
        weights_BxT = core.loss_weights(jnp.asarray(prompt_ids_B), num_prompts, token_mask_BxR=jnp.asarray(mask_BxT),
                                        aggregation=c.aggregation, correction=c.correction)
        # tunix averages the gradients of an update's micro-batches; the weights already sum over all of them.
        weights_BxT = weights_BxT * self._micro_batches_per_update()
        if train:
            successes_P = np.bincount(prompt_ids_B, weights=rows["rewards_B"], minlength=num_prompts)
            if self.tracker is not None:
                keys_P = jnp.asarray(columns_P[c.prompt_index_key].astype(np.int32))
                self.tracker = core.tracker_update(self.tracker, keys_P, successes_P, counts_P, c.history_decay)
            self.last_allocation = dict(counts_P=counts_P, p_hat_P=p_hat_P, prompt_ids_B=prompt_ids_B,
                                        rewards_B=rows["rewards_B"], successes_P=successes_P)
        self._buffer_step_metrics(rows, counts_P, posterior, mask_BxT, mode)
        prompt_tokens = jnp.asarray(rows["prompt_tokens_BxL"])
        completion_tokens = jnp.asarray(rows["completion_ids_BxT"])
        ref_logps, old_logps = self._reference_and_old_logps(prompt_tokens, completion_tokens)
        return SeraTrainExample(
            prompt_ids=prompt_tokens, prompt_mask=prompt_tokens != self.rl_cluster.rollout.pad_id(),
            completion_ids=completion_tokens, completion_mask=jnp.asarray(mask_BxT),
            ref_per_token_logps=ref_logps, advantages=jax.device_put(adv_B), old_per_token_logps=old_logps,
            loss_weights=weights_BxT)

    # -- stages --------------------------------------------------------------------------------------------------

    def _allocate(self, num_prompts: int, budget: int, columns_P, pilot, train: bool):
        """``counts_P`` (pilot included, summing to ``budget``) and the Beta belief about each prompt's p that
        allocated them (Jeffreys after the pilot, or the history tracker's; None without an estimate)."""
        c = self.algo_config
        if not train:
            return np.full(num_prompts, c.num_generations, np.int64), None
        n_max = c.n_max or budget - (num_prompts - 1) * c.n_min
        bounds = dict(n_min=c.n_min, n_max=n_max, estimator=c.advantage_estimator)
        allocator = c.registered_allocator
        if pilot is not None:
            successes_P = np.bincount(pilot["prompt_ids_B"], weights=pilot["rewards_B"], minlength=num_prompts)
            counts = core.pilot_allocate(jnp.asarray(successes_P, jnp.float32), c.pilot_rollouts, budget,
                                         use_posterior=c.use_posterior, method=allocator, **bounds)
            posterior = core.pilot_posterior(jnp.asarray(successes_P, jnp.float32), c.pilot_rollouts)
        elif self.tracker is not None:
            keys_P = columns_P.get(c.prompt_index_key)
            if keys_P is None:
                raise ValueError(f"SeraConfig.p_estimate='history' reads the integer column "
                                 f"{c.prompt_index_key!r} of the training batches; they have {sorted(columns_P)}")
            keys_P = np.asarray(keys_P).astype(np.int64)
            if keys_P.min() < 0 or keys_P.max() >= c.num_prompts:
                raise ValueError(f"column {c.prompt_index_key!r} holds {keys_P.min()}..{keys_P.max()}, outside "
                                 f"[0, SeraConfig.num_prompts={c.num_prompts})")
            posterior = core.tracker_posterior(self.tracker, jnp.asarray(keys_P, jnp.int32))
            counts = allocator.counts(posterior if c.use_posterior else posterior.mean, budget, **bounds)
        else:
            counts, posterior = allocator.counts(None, budget, num_prompts=num_prompts, **bounds), None
        return np.asarray(counts, np.int64), posterior

    def _rollouts(self, prompts_P: List[str], columns_P, prompt_ids_B: np.ndarray, mode: Mode) -> dict[str, Any]:
        """Generate one rollout per row of the flat layout ``prompt_ids_B`` with tunix's engine, then score them."""
        if prompt_ids_B.size == 0:
            return dict(prompt_ids_B=prompt_ids_B, rewards_B=np.zeros(0, np.float32), completion_ids_BxT=None,
                        prompt_tokens_BxL=None, texts=[])
        prompts_B = [prompts_P[i] for i in prompt_ids_B]
        output = self._generate(prompts_B, mode)
        config = self.rl_cluster.get_rollout_config(mode)
        pad_id = self.rl_cluster.rollout.pad_id()
        completion_ids = np.array([generate_utils.pad_to_length(np.asarray(ids), target_length=config.max_tokens_to_generate,
                                                                pad_value=pad_id, left=False)
                                   for ids in output.tokens])
        columns_B = {k: v[prompt_ids_B] for k, v in columns_P.items()}
        rewards = np.asarray(self._compute_rewards(prompts=prompts_B, completions=output.text, mode=mode, **columns_B),
                             np.float32)
        if rewards.shape != prompt_ids_B.shape or not np.all((rewards == 0) | (rewards == 1)):
            raise ValueError("SeraLearner needs one 0/1 reward per completion (the sum of the reward functions): "
                             f"got shape {rewards.shape} with values {np.unique(rewards)[:8]}")
        return dict(prompt_ids_B=prompt_ids_B, rewards_B=rewards, completion_ids_BxT=completion_ids,
                    prompt_tokens_BxL=np.asarray(output.left_padded_prompt_tokens), texts=list(output.text))

    def _generate(self, prompts_B: List[str], mode: Mode):
        """tunix's ``RLCluster.generate`` with this call's own sampling key. tunix takes the seed from the cluster's
        rollout config alone, so every call would reuse one key: a prompt's pilot and main rollouts at the same row
        would be copies. The config is swapped for the call and restored."""
        cluster = self.rl_cluster
        saved = cluster.cluster_config
        key = jax.random.fold_in(jax.random.PRNGKey(self.algo_config.seed), self._calls)
        self._calls += 1
        if isinstance(saved.rollout_config, dict):
            rollout_config = dict(saved.rollout_config)
            rollout_config[mode] = dataclasses.replace(rollout_config[mode], seed=key)
        else:
            rollout_config = dataclasses.replace(saved.rollout_config, seed=key)
        cluster.cluster_config = dataclasses.replace(saved, rollout_config=rollout_config)
        try:
            return cluster.generate(prompts=prompts_B, mode=mode,
                                    micro_batch_size=self.algo_config.generation_chunk or len(prompts_B))
        finally:
            cluster.cluster_config = saved

    def _reference_and_old_logps(self, prompt_tokens, completion_tokens):
        c = self.algo_config
        pad_id, eos_id = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
        chunk = c.generation_chunk or prompt_tokens.shape[0]
        ref = None
        if c.beta:
            ref = self.rl_cluster.get_ref_per_token_logps(prompt_tokens=prompt_tokens,
                                                          completion_tokens=completion_tokens, pad_id=pad_id,
                                                          eos_id=eos_id, micro_batch_size=chunk)
        old = None
        if c.num_iterations > 1:
            old = self.rl_cluster.get_old_per_token_logps(prompt_tokens=prompt_tokens,
                                                          completion_tokens=completion_tokens, micro_batch_size=chunk)
        return ref, old

    def _buffer_step_metrics(self, rows, counts_P, posterior, mask_BxT, mode: Mode) -> None:
        """The step's rewards, lengths and allocation; with an estimate, its mean p and the scale factors as
        estimated, ``E[s(p_i, N_i)]`` under each prompt's Beta belief (as the trainer's ``scale_est_*``: the factor
        at the posterior mean would read 0 of 2 pilot successes as p = 0.17 whatever the prompt's p)."""
        rewards = rows["rewards_B"]
        lengths = mask_BxT.sum(axis=-1)
        metrics = {
            "rewards/score/mean": (float(np.mean(rewards)), np.mean),
            "completions/mean_length": (float(np.mean(lengths)), np.mean),
            "completions/max_length": (float(np.max(lengths)), np.max),
            "sera/rollouts_min": (float(np.min(counts_P)), np.min),
            "sera/rollouts_max": (float(np.max(counts_P)), np.max),
            # Prompts sampled at all (the released rule gives hopeless ones none), and how their groups ended.
            **{f"sera/{k}": (float(v), np.mean) for k, v in core.group_outcomes(
                np.bincount(rows["prompt_ids_B"], weights=rewards, minlength=len(counts_P)), counts_P,
                None if posterior is None else posterior.mean).items()},
        }
        if posterior is not None:
            c = self.algo_config
            # A skipped prompt gets no gradient: its factor at N = 0 is 0.
            scales = np.asarray(core.posterior_scale_factor(posterior, jnp.asarray(counts_P), c.advantage_estimator,
                                                            max_n=max(int(np.max(counts_P)), 1)))
            metrics["sera/p_hat_mean"] = (float(np.mean(posterior.mean)), np.mean)
            metrics["sera/scale_est_min"] = (float(np.min(scales)), np.min)
            metrics["sera/scale_est_mean"] = (float(np.mean(scales)), np.mean)
        self.rl_cluster.buffer_metrics(metrics, mode=mode)

    # -- checks --------------------------------------------------------------------------------------------------

    def _check_batching(self, full_batch_size: int) -> None:
        t = self._training_config
        mini = t.mini_batch_size or full_batch_size
        for name in ("rollout_micro_batch_size", "compute_logps_micro_batch_size"):
            value = getattr(t, name)
            if value is not None and value < mini:
                raise ValueError(f"RLTrainingConfig.{name}={value} is below mini_batch_size={mini}: SeraLearner "
                                 "allocates over the prompts of one optimizer update, so the rollout stage must see "
                                 "them all (leave it unset; SeraConfig.generation_chunk bounds generation instead)")
        if t.rollout_micro_batch_size is None and t.train_micro_batch_size not in (None, mini):
            raise ValueError(f"RLTrainingConfig.train_micro_batch_size={t.train_micro_batch_size} < mini_batch_size="
                             f"{mini} needs rollout_micro_batch_size=mini_batch_size={mini} (tunix defaults it to the "
                             "train micro-batch, which would split an update's prompts over allocations)")
        self._update_micro_batches = mini // (t.train_micro_batch_size or mini)

    def _micro_batches_per_update(self) -> int:
        return getattr(self, "_update_micro_batches", 1)

    # -- the history tracker for checkpoints ---------------------------------------------------------------------

    def _checkpoint_tracker(self) -> None:
        """Adds the tracker to the custom metadata tunix saves with each actor checkpoint, and restores it from the
        checkpoint tunix restored (if any). tunix keeps the restored metadata in a private field of its trainer."""
        trainer = self.rl_cluster.actor_trainer
        metadata_fn = trainer.custom_checkpoint_metadata_fn
        trainer.custom_checkpoint_metadata_fn = lambda: {
            **metadata_fn(), "sera_tracker": {k: v.tolist() for k, v in self.tracker_arrays().items()}}
        restored = (getattr(trainer, "_restored_custom_metadata", None) or {}).get("sera_tracker")
        if restored is not None:
            self.restore_tracker({k: np.asarray(v, np.float32) for k, v in restored.items()})
        elif trainer.restored_global_step():
            raise ValueError(f"the checkpoint of step {trainer.restored_global_step()} has no SERA history tracker "
                             "(sera_tracker); it was not written by a SeraLearner with p_estimate='history'")

    def tracker_arrays(self) -> dict[str, np.ndarray]:
        """The history tracker as plain arrays (to save beside tunix's checkpoint)."""
        if self.tracker is None:
            return {}
        return {"successes": np.asarray(self.tracker.successes), "failures": np.asarray(self.tracker.failures)}

    def restore_tracker(self, arrays: dict[str, np.ndarray]) -> None:
        """Puts back a tracker saved with :meth:`tracker_arrays`; its size must be ``SeraConfig.num_prompts``."""
        if self.tracker is None:
            raise ValueError("restore_tracker: this learner has no history tracker (SeraConfig.p_estimate='history')")
        shape = (self.algo_config.num_prompts,)
        for name in ("successes", "failures"):
            if name not in arrays or np.shape(arrays[name]) != shape:
                raise ValueError(f"restore_tracker: {name!r} must be an array of shape {shape} "
                                 "(SeraConfig.num_prompts)")
        self.tracker = core.TrackerState(jnp.asarray(arrays["successes"], jnp.float32),
                                         jnp.asarray(arrays["failures"], jnp.float32))


def _join(a: dict[str, Any], b: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """Two scored row sets as one, each prompt's rollouts contiguous (pilot first, then the rest)."""
    if b["completion_ids_BxT"] is None:
        return a
    length = max(a["prompt_tokens_BxL"].shape[1], b["prompt_tokens_BxL"].shape[1])
    joined = dict(
        prompt_ids_B=np.concatenate([a["prompt_ids_B"], b["prompt_ids_B"]]),
        rewards_B=np.concatenate([a["rewards_B"], b["rewards_B"]]),
        completion_ids_BxT=np.concatenate([a["completion_ids_BxT"], b["completion_ids_BxT"]]),
        prompt_tokens_BxL=np.concatenate([_left_pad(a["prompt_tokens_BxL"], length, pad_id),
                                          _left_pad(b["prompt_tokens_BxL"], length, pad_id)]),
        texts=a["texts"] + b["texts"])
    order = np.argsort(joined["prompt_ids_B"], kind="stable")
    return {k: ([v[i] for i in order] if isinstance(v, list) else v[order]) for k, v in joined.items()}
