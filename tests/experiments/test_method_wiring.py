"""Every compared method's settings reach the loss: for each entry of the maze and math experiments' ``METHODS``
tables, the advantages and per-token weights the update receives from ``rl_step`` equal those computed here
through the core API (``core.advantages``, ``core.loss_weights``) from the same rewards and layout, with the
estimator and correction read from the table itself (not from the trainer's config).

The task's rewards are replaced by seeded coin flips with per-prompt rates (the tiny policies rarely succeed),
so advantages are non-zero and SERA's counts non-uniform: a trainer that ignored ``sera.estimator`` or
``sera.correction`` would pass an all-zero or all-uniform case, and the discrimination checks below make sure
each case can tell the settings apart.

Both update layouts (``rl.share_prompts``) run every method that has its own path through the update's inputs: one
of each kind (counts, rounds, selection), each train-mask rule, each estimator and correction. The rows that
differ from one of those only in how the counts are made (which happens before the layout matters) run in the
default layout alone. The methods share their samplers (``comparison.shared_sample_fns``) and update, as in
``run_comparison``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sera_jax.core as core
from experiments.math_reasoning import experiment as math_experiment
from experiments.maze import experiment as maze_experiment
from sera_jax.core import keep
from sera_jax.rl import comparison
from sera_jax.rl import config as rl_config
from sera_jax.rl import step as step_lib
from sera_jax.rl import trainer as T

EXPERIMENTS = {"maze": maze_experiment.EXPERIMENT, "math_reasoning": math_experiment.EXPERIMENT}
CONFIGS = {"maze": maze_experiment.config_lib.get_config, "math_reasoning": math_experiment.config_lib.get_config}
# Rows that differ from a method run in both layouts only in how their counts are made (before the layout matters):
# sera_sum, dynamo and knapsack (other counts on SERA's estimate) and sera_no_correction (SERA's counts, without the
# correction as dapo, pods, reinforce_ada and dars). They run in the default layout (share_prompts=True) only.
DEFAULT_LAYOUT_ONLY = ("sera_no_correction", "sera_sum", "dynamo", "knapsack")


def spread_rates(num_prompts: int) -> np.ndarray:
    """Success rates from nearly-never to nearly-always over a step's prompts (so a pilot of 2 tells them apart)."""
    return np.linspace(0.02, 0.98, num_prompts)


class CoinFlipRewards:
    """The experiment's task with its training rewards replaced by coin flips (``spread_rates``); records
    every scored call's layout, mask and rewards in call order (pilot first, then the main rollouts)."""

    def __init__(self, task, seed: int):
        self._task, self._rng, self.calls = task, np.random.default_rng(seed), []

    def __getattr__(self, name):
        return getattr(self._task, name)

    def rewards(self, prompts, prompt_ids_B, sample):
        ids = np.asarray(prompt_ids_B)
        rate_P = spread_rates(len(prompts.keys_P))
        rewards = (self._rng.uniform(size=ids.shape) < rate_P[ids]).astype(np.float32)
        self.calls.append((ids, np.asarray(sample.mask_BxR), rewards))
        return rewards


def _captured_update(ctx: T.RLContext):
    """``ctx`` whose update records the batch and advantages it is given."""
    seen = {}

    def update_fn(train, batch, adv):
        seen["batch"], seen["adv"] = batch, adv
        return ctx.update_fn(train, batch, adv)

    return ctx.__class__(**{**ctx.__dict__, "update_fn": update_fn}), seen


def reference_train_mask(method: str, settings, rewards_B, ids_B, num_prompts):
    """The rollouts that train, from the peer's own rule in ``core.keep`` named here (not read from the
    registry's ``keep_fn``), and whether its advantages come from the kept rollouts alone; (None, False) for the
    methods that train on every rollout."""
    rewards, ids = jnp.asarray(rewards_B), jnp.asarray(ids_B)
    if method in ("dapo", "dars_et", "dars_hw", "greso"):  # DAPO's filter (DARS and GRESO apply it too)
        return keep.mixed_groups(rewards, ids, num_prompts), False
    if method == "pods":
        return keep.max_variance_subset(rewards, ids, num_prompts, settings.keep_per_prompt), True
    if method == "reinforce_ada":
        return keep.balanced_subset(rewards, ids, num_prompts, settings.keep_per_prompt), False
    return None, False


def _update_inputs(batch) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids or None, per-token weights) of either update layout."""
    if isinstance(batch, step_lib.SharedPromptBatch):
        return np.asarray(batch.rows.prompt_ids_B), np.asarray(batch.rows.weights_BxR)
    return None, np.asarray(batch.weights_BxR)


@pytest.fixture(scope="module", params=sorted(EXPERIMENTS))
def experiment_setup(request, tmp_path_factory):
    name = request.param
    experiment, config = EXPERIMENTS[name], CONFIGS[name]("tiny")
    if name == "maze":  # a fixed training set, so that the methods on history estimates run too
        config.maze.num_train = config.rl.prompts_per_step  # every step revisits it
    task = experiment.make_task(config, tmp_path_factory.mktemp(name))
    model = experiment.build_model(config, task, 0, None)
    graphdef = nnx.graphdef(model)
    update = T.make_update(graphdef, config)  # the methods share config.rl, as in run_comparison
    return name, experiment, config, task, model, update, {}  # {}: samplers by sampling settings


def _one_step(experiment_setup, method: str, share_prompts: bool):
    name, experiment, config, task, model, update, samplers = experiment_setup
    c = rl_config.method_config(config, experiment.methods, method)
    with c.unlocked():
        c.rl.share_prompts = share_prompts
        # Peers that train on a subset keep half of a prompt's rollouts, so their train masks matter here.
        c.sera.keep_per_prompt = max(1, c.rl.rollouts_per_step // c.rl.prompts_per_step // 2)
        c.sera.round_size = 2  # Reinforce-Ada: several rounds within the tiny budget
    scored = CoinFlipRewards(task, seed=7)
    ctx = T.make_context(scored, nnx.graphdef(model), c, update_fn=update[1],
                         sample_fns=comparison.shared_sample_fns(samplers, nnx.graphdef(model), task, c))
    ctx, seen = _captured_update(ctx)
    state = T.init_state(ctx, nnx.state(model), update[0])
    prompts = T.data_order(task, c, 0)(0, T.prompts_fetched_per_step(c))
    if c.sera.method != "uniform" and c.sera.p_estimate == "history":  # a history that is not the flat prior
        keys = jnp.asarray(prompts.keys_P)
        rate_P = spread_rates(len(keys))
        tries = jnp.full(keys.shape, 16.0)
        state = state._replace(tracker=core.tracker_update(state.tracker, keys, jnp.asarray(np.round(16 * rate_P)),
                                                           tries, decay=c.sera.history_decay))
    if c.sera.method != "uniform" and c.sera.p_estimate == "epoch_history":  # estimates frozen for epoch 0
        keys = jnp.asarray(prompts.keys_P)
        epochs = state.epochs
        state = state._replace(epochs=epochs._replace(
            mean_E=epochs.mean_E.at[keys].set(jnp.asarray(spread_rates(len(keys)), epochs.mean_E.dtype)),
            epoch=jnp.zeros_like(epochs.epoch)))
    T.rl_step(ctx, state, prompts, jax.random.key(3))
    return c, scored.calls, seen


@pytest.mark.parametrize("share_prompts", [True, False])
def test_every_method_trains_on_the_core_advantages_and_weights(experiment_setup, share_prompts):
    name, experiment, config, *_ = experiment_setup
    P = config.rl.prompts_per_step
    methods = {m: f for m, f in experiment.methods.items() if share_prompts or m not in DEFAULT_LAYOUT_ONLY}
    kinds = {core.get_allocator(f["method"]).kind for f in methods.values()}
    assert kinds == {core.get_allocator(f["method"]).kind for f in experiment.methods.values()}, kinds
    for method, fields in methods.items():
        c, calls, seen = _one_step(experiment_setup, method, share_prompts)
        ids_B = np.concatenate([ids for ids, _, _ in calls])
        rewards_B = np.concatenate([r for _, _, r in calls])
        mask_BxR = np.concatenate([m for _, m, _ in calls])
        B = ids_B.size
        # A token budget scores what it allocated, within the update's fixed rows (the rest is zero-weight padding).
        assert B == c.rl.rollouts_per_step or (c.sera.budget == "tokens" and B <= c.rl.rollouts_per_step), \
            (name, method, B)
        batch_ids, weights = _update_inputs(seen["batch"])
        assert np.all(weights[B:] == 0), (name, method, "padding rows weigh")
        weights = weights[:B]
        if batch_ids is not None:
            np.testing.assert_array_equal(batch_ids[:B], ids_B)
        estimator, correction = fields["estimator"], fields["correction"]
        train_B, from_kept = reference_train_mask(fields["method"], c.sera, rewards_B, ids_B, P)
        want_adv = core.advantages(jnp.asarray(rewards_B), jnp.asarray(ids_B), P, estimator,
                                   rows_B=train_B if from_kept else None)
        want_w = core.loss_weights(jnp.asarray(ids_B), P, token_mask_BxR=jnp.asarray(mask_BxR),
                                   aggregation=c.sera.aggregation, correction=correction, train_B=train_B)
        if "adv" not in seen:  # the train mask kept nothing: the update is skipped, so nothing to compare
            assert train_B is not None and float(jnp.sum(train_B)) == 0, (name, method)
            continue
        np.testing.assert_allclose(np.asarray(seen["adv"])[:B], want_adv, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name}/{method}: advantages")
        np.testing.assert_allclose(weights, want_w, rtol=1e-6, atol=1e-9, err_msg=f"{name}/{method}: weights")
        # The case can tell the settings apart: the other estimator's advantages and the other correction's
        # weights differ from what the update received (else a trainer ignoring the field would pass).
        other = "grpo" if estimator != "grpo" else "maxrl"
        assert not np.allclose(core.advantages(jnp.asarray(rewards_B), jnp.asarray(ids_B), P, other), want_adv), \
            (name, method, "advantages do not depend on the estimator here")
        if train_B is not None:  # and the train mask matters: it drops some rollouts here
            assert 0 < float(jnp.sum(train_B)) < ids_B.size, (name, method, "the train mask keeps all or nothing")
        allocator = core.get_allocator(fields["method"])
        trained = np.ones(ids_B.size) if train_B is None else np.asarray(train_B)
        if allocator.needs_estimate or allocator.kind == "rounds":  # counts that vary with the rewards
            assert len(set(np.bincount(ids_B, minlength=P).tolist())) > 1, (name, method, "uniform counts")
        kept_P = np.bincount(ids_B, weights=trained, minlength=P)
        if len(set(kept_P[kept_P > 0].tolist())) > 1:  # the correction matters
            flipped = core.loss_weights(jnp.asarray(ids_B), P, token_mask_BxR=jnp.asarray(mask_BxR),
                                        aggregation=c.sera.aggregation, correction=not correction, train_B=train_B)
            assert not np.allclose(flipped, want_w), (name, method, "weights do not depend on the correction here")
