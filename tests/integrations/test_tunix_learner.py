"""SERA inside tunix (sera_jax.integrations.tunix): through tunix's real GRPO learner machinery, its vanilla rollout
engine and its own Qwen2 model (tiny), on CPU.

One module-scoped run of two SERA steps (pilot estimates, the ``sera`` allocator, plain SGD so that an update is
``-lr x gradient``) records what tunix generated, scored and trained on; the tests check it against independent
computations: the counts against the registry's allocation of the pilot's own successes, the advantages and
weights against MaxRL's closed form and ``1 / (P N_i T_b)``, the loss and its gradient against ``sera_jax``'s
surrogate on tunix's own log-probs, and the update against ``sera_jax``'s update of the same weights (written by
``save_hf_checkpoint``, loaded by tunix's safetensors loader) on the same rollouts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib

import numpy as np
import pytest

pytest.importorskip("tunix")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.rl import common  # noqa: E402
from tunix.rl import function_registry  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from sera_jax import core  # noqa: E402
from sera_jax.integrations import tunix as sera_tunix  # noqa: E402
from sera_jax.integrations import tunix_models  # noqa: E402
from sera_jax.models.decoder import Decoder, DecoderConfig  # noqa: E402
from sera_jax.rl import step as step_lib  # noqa: E402

LEARNING_RATE = 0.5
NUM_GENERATIONS = 4


def _load_example():
    """scripts/tunix_example.py: its toy task (prompts of graded difficulty), tokenizer and reward serve here too."""
    spec = importlib.util.spec_from_file_location("tunix_example", pathlib.Path(__file__).parents[2] / "scripts"
                                                  / "tunix_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example_script = _load_example()
PROMPTS, ACCEPT = example_script.PROMPTS, example_script.ACCEPT
CharTokenizer, first_char_reward = example_script.CharTokenizer, example_script.first_char_reward


DECODER = DecoderConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                        rope_theta=10_000.0, qkv_bias=True, tie_embeddings=True, init_std=0.3)


def _mesh():
    return jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


# Padding with EOS (as tunix does for a Hugging Face tokenizer without a pad token): tunix masks every token equal to
# the pad id, so a pad id the tiny random policy can sample mid-response would leave holes in a response, which
# sera_jax's decoder refuses (one contiguous span of valid tokens a row); EOS ends a response instead.
PAD = 2


def make_cluster(model, optimizer, max_steps: int, eval_every_n_steps: int = 1000, **training):
    mesh = _mesh()
    roles = {role: mesh for role in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                     rl_cluster_lib.Role.ROLLOUT)}
    config = rl_cluster_lib.ClusterConfig(
        role_to_mesh=roles, rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optimizer, eval_every_n_steps=eval_every_n_steps,
                                                        max_steps=max_steps, **training),
        rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=3, max_prompt_length=8, kv_cache_size=16,
                                                  temperature=1.0))
    return rl_cluster_lib.RLCluster(actor=model, reference=model, tokenizer=CharTokenizer(pad=PAD), cluster_config=config)


def first_char_reward(prompts, completions, accept, **kwargs):
    return [float(len(c) > 0 and c[0] in a) for c, a in zip(completions, accept)]


class RecordingLearner(sera_tunix.SeraLearner):
    """Keeps each training step's parameters (as the step found them), allocation and example."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps, self.metrics, self.eval_metrics = [], [], []
        buffer = self.rl_cluster.buffer_metrics

        def record(metrics, mode=rl_cluster_lib.Mode.TRAIN):  # what the learner hands tunix's metric logger
            if any(name.startswith("sera/") for name in metrics):
                kept = self.metrics if mode == rl_cluster_lib.Mode.TRAIN else self.eval_metrics
                kept.append({name: value for name, (value, _) in metrics.items()})
            return buffer(metrics, mode=mode)

        self.rl_cluster.buffer_metrics = record

    def _generate_and_compute_advantage(self, training_input, mode=rl_cluster_lib.Mode.TRAIN):
        params = jax.tree.map(np.array, nnx.state(self.rl_cluster.actor_trainer.model, nnx.Param))
        example = super()._generate_and_compute_advantage(training_input, mode)
        if mode == rl_cluster_lib.Mode.TRAIN:
            self.steps.append(dict(params=params, example=example, **self.last_allocation))
        return example


def batches(steps: int, prompts=PROMPTS, accept=ACCEPT, **columns):
    return [dict(prompts=prompts, accept=accept, **columns) for _ in range(steps)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    decoder = Decoder(DECODER, rngs=nnx.Rngs(0))
    with jax.set_mesh(_mesh()):
        model = tunix_models.to_tunix_qwen2(DECODER, decoder, tmp_path_factory.mktemp("start"))
    cluster = make_cluster(model, optax.sgd(LEARNING_RATE), max_steps=2)
    config = sera_tunix.SeraConfig(num_generations=NUM_GENERATIONS, n_min=2, n_max=10, pilot_rollouts=2, seed=3)
    learner = RecordingLearner(rl_cluster=cluster, algo_config=config, reward_fns=first_char_reward)
    learner.train(batches(2))
    return dict(learner=learner, decoder=decoder, model=model, config=config, tmp=tmp_path_factory)


def rows_per_prompt(example_prompt_ids_B, num_prompts):
    return np.bincount(example_prompt_ids_B, minlength=num_prompts)


def test_two_steps_run_through_tunix_and_each_prompt_gets_its_allocated_rollouts(run):
    learner = run["learner"]
    assert learner.rl_cluster.actor_trainer.train_steps == 2
    assert len(learner.steps) == 2
    P, B = len(PROMPTS), len(PROMPTS) * NUM_GENERATIONS
    uneven = False
    for step in learner.steps:
        example = step["example"]
        assert example.completion_ids.shape[0] == B  # tunix's budget: P x num_generations rows
        # The allocation of the pilot's successes by the registry (pilot included), recomputed from the pilot rows.
        pilot = np.concatenate([np.flatnonzero(step["prompt_ids_B"] == i)[:2] for i in range(P)])
        successes = np.bincount(step["prompt_ids_B"][pilot], weights=step["rewards_B"][pilot], minlength=P)
        expected = np.asarray(core.pilot_allocate(jnp.asarray(successes, jnp.float32), 2, B, n_min=2, n_max=10))
        np.testing.assert_array_equal(step["counts_P"], expected)
        np.testing.assert_array_equal(rows_per_prompt(step["prompt_ids_B"], P), expected)
        uneven |= len(set(expected.tolist())) > 1
    assert uneven, "the reward should make SERA's counts uneven in at least one step"


def test_logged_scale_factors_are_posterior_expected_under_the_pilots_beta_belief(run):
    """``sera/scale_est_*``: E[1 - (1-p)^(N-1)] = 1 - B(a, b + N - 1) / B(a, b) under Jeffreys' Beta(0.5 + k,
    0.5 + n0 - k) after k of the pilot's n0 = 2 successes (not the factor at the posterior mean)."""
    learner = run["learner"]
    assert len(learner.metrics) == len(learner.steps) == 2
    for step, logged in zip(learner.steps, learner.metrics):
        n = step["counts_P"]
        pilot = np.concatenate([np.flatnonzero(step["prompt_ids_B"] == i)[:2] for i in range(len(PROMPTS))])
        k = np.bincount(step["prompt_ids_B"][pilot], weights=step["rewards_B"][pilot], minlength=len(PROMPTS))
        a, b = 0.5 + k, 2.5 - k
        log_beta = lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
        expected = np.array([1 - math.exp(log_beta(ai, bi + ni - 1) - log_beta(ai, bi)) for ai, bi, ni in zip(a, b, n)])
        np.testing.assert_allclose(logged["sera/scale_est_min"], expected.min(), rtol=1e-5)
        np.testing.assert_allclose(logged["sera/scale_est_mean"], expected.mean(), rtol=1e-5)
        np.testing.assert_allclose(logged["sera/p_hat_mean"], np.mean(a / (a + b)), rtol=1e-6)
        assert (logged["sera/rollouts_min"], logged["sera/rollouts_max"]) == (n.min(), n.max())


def test_evaluation_draws_num_generations_a_prompt_without_an_estimate(run, tmp_path):
    """tunix's evaluation goes through the same generation path: no pilot and no allocation there (every prompt
    gets num_generations rollouts), so no estimate is logged, and training's allocation is left as it was."""
    with jax.set_mesh(_mesh()):
        model = tunix_models.to_tunix_qwen2(DECODER, Decoder(DECODER, rngs=nnx.Rngs(0)), tmp_path / "start")
    cluster = make_cluster(model, optax.sgd(LEARNING_RATE), max_steps=1, eval_every_n_steps=1)
    learner = RecordingLearner(rl_cluster=cluster, algo_config=run["config"], reward_fns=first_char_reward)
    learner.train(batches(1), eval_ds=batches(1))
    assert len(learner.steps) == len(learner.metrics) == 1 and learner.eval_metrics
    for logged in learner.eval_metrics:
        assert logged["sera/rollouts_min"] == logged["sera/rollouts_max"] == NUM_GENERATIONS
        assert not any(name.startswith(("sera/p_hat", "sera/scale")) for name in logged)
    assert "sera/scale_est_min" in learner.metrics[0]


def test_rewards_are_the_reward_functions_of_each_rows_own_prompt(run):
    # Every row's completion was generated for, and scored against, its own prompt: re-score the decoded texts.
    tok = CharTokenizer()
    for step in run["learner"].steps:
        example = step["example"]
        texts = [tok.decode([t for t in row if t > 2]) for row in np.asarray(example.completion_ids)]
        rescored = first_char_reward(None, texts, ACCEPT[step["prompt_ids_B"]])
        np.testing.assert_array_equal(step["rewards_B"], rescored)
        prompts = ["".join(tok.decode([t for t in row if t > 2])) for row in np.asarray(example.prompt_ids)]
        assert prompts == list(PROMPTS[step["prompt_ids_B"]])


def test_advantages_and_token_weights_are_maxrl_and_seras_correction(run):
    P = len(PROMPTS)
    for step in run["learner"].steps:
        example, ids, r = step["example"], step["prompt_ids_B"], step["rewards_B"]
        K = np.bincount(ids, weights=r, minlength=P)[ids]
        N = np.bincount(ids, minlength=P)[ids].astype(np.float64)
        expected_adv = np.where(K > 0, r * N / np.maximum(K, 1) - 1.0, 0.0)  # MaxRL: (r - K/N) / (K/N)
        np.testing.assert_allclose(np.asarray(example.advantages), expected_adv, rtol=1e-6, atol=1e-6)
        mask = np.asarray(example.completion_ids) != PAD
        T = mask.sum(axis=1)
        expected_w = mask / (P * N * np.maximum(T, 1))[:, None]  # sequence mean, each prompt's rows share 1/P
        np.testing.assert_allclose(np.asarray(example.loss_weights), expected_w, rtol=1e-6)


def _loss_and_grads(model, fn):
    graphdef, state = nnx.split(model)
    return jax.value_and_grad(lambda s: fn(nnx.merge(graphdef, s)))(state)


def test_the_loss_tunix_computes_is_seras_surrogate_on_tunixs_own_logprobs(run):
    learner, model = run["learner"], run["model"]
    step = learner.steps[0]
    example = step["example"]
    nnx.update(model, jax.tree.map(jnp.asarray, step["params"]))  # the weights the step sampled with
    start = model
    loss_fn = function_registry.get_policy_loss_fn(sera_tunix.SERA_POLICY_LOSS)

    def tunix_loss(m):
        return loss_fn(m, example, learner.algo_config, pad_id=PAD, eos_id=2)[0]

    def sera_jax_loss(m):  # sera_jax.rl.step's surrogate, -sum w A log pi, on tunix's log-probs
        g, s = nnx.split(m)
        logp = common.compute_per_token_logps(g, s, prompt_tokens=example.prompt_ids,
                                              completion_tokens=example.completion_ids, pad_id=PAD, eos_id=2,
                                              stop_gradient=False)
        return -jnp.sum(example.loss_weights * example.advantages[:, None] * logp)

    value, grads = _loss_and_grads(start, tunix_loss)
    _, expected_grads = _loss_and_grads(start, sera_jax_loss)
    # On-policy the ratio is 1: the loss is -sum w A, and its gradient that of sera_jax's surrogate.
    expected_value = -np.sum(np.asarray(example.loss_weights) * np.asarray(example.advantages)[:, None])
    np.testing.assert_allclose(float(value), expected_value, rtol=1e-5, atol=1e-7)
    norm = optax.tree.norm(expected_grads)
    assert float(norm) > 1e-4
    diff = optax.tree.norm(jax.tree.map(jnp.subtract, grads, expected_grads))
    assert float(diff) <= 1e-5 * float(norm)


def test_one_update_equals_sera_jaxs_update_on_the_same_rollouts(run):
    learner, decoder = run["learner"], run["decoder"]
    first, second = learner.steps
    example = first["example"]
    # sera_jax's side: the same starting weights, the same rollouts, advantages and weights, sera_jax's update.
    tx = optax.sgd(LEARNING_RATE)
    graphdef, state = step_lib.create_train_state(decoder, tx)
    prompt_tokens = np.asarray(example.prompt_ids)
    batch = step_lib.sequence_batch(jnp.asarray(prompt_tokens), jnp.asarray((prompt_tokens != PAD).sum(axis=1)),
                                    example.completion_ids, example.completion_mask, example.loss_weights)
    update = step_lib.make_policy_gradient_update(graphdef, tx)
    state, _ = update(state, batch, example.advantages)
    ours = nnx.merge(graphdef, state.params)
    # tunix's side: the parameters tunix held when the second step began, read back into a sera_jax decoder.
    tunix_model = run["model"]
    nnx.update(tunix_model, jax.tree.map(jnp.asarray, second["params"]))
    theirs = tunix_models.from_tunix_qwen2(tunix_model, DECODER, run["tmp"].mktemp("after"))
    before = nnx.state(decoder, nnx.Param)
    delta_ours = jax.tree.map(jnp.subtract, nnx.state(ours, nnx.Param), before)
    delta_theirs = jax.tree.map(jnp.subtract, nnx.state(theirs, nnx.Param), before)
    norm = optax.tree.norm(delta_ours)
    assert float(norm) > 1e-3
    diff = optax.tree.norm(jax.tree.map(jnp.subtract, delta_theirs, delta_ours))
    assert float(diff) <= 1e-4 * float(norm), (float(diff), float(norm))


def test_every_generation_call_draws_with_its_own_key(run):
    # tunix takes one seed from the cluster config; a pilot and a main call would draw the same numbers.
    learner = run["learner"]
    seen = []
    original = learner.rl_cluster.rollout.generate

    def recording(prompts, rollout_config, **kwargs):
        seen.append(np.asarray(rollout_config.seed).tolist())
        return original(prompts, rollout_config, **kwargs)

    learner.rl_cluster.rollout.generate = recording
    try:
        learner._generate(list(PROMPTS[:2]), rl_cluster_lib.Mode.TRAIN)
        learner._generate(list(PROMPTS[:2]), rl_cluster_lib.Mode.TRAIN)
    finally:
        learner.rl_cluster.rollout.generate = original
    assert len(seen) == 2 and seen[0] != seen[1]
    assert learner.rl_cluster.cluster_config.rollout_config.seed is None  # the cluster's config is restored


def test_history_tracker_allocates_from_earlier_steps(tmp_path):
    decoder = Decoder(DECODER, rngs=nnx.Rngs(1))
    with jax.set_mesh(_mesh()):
        model = tunix_models.to_tunix_qwen2(DECODER, decoder, tmp_path)
    checkpoints = dict(checkpoint_root_directory=str(tmp_path / "ckpt"),
                       checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=1))
    cluster = make_cluster(model, optax.sgd(0.0), max_steps=2, **checkpoints)
    config = sera_tunix.SeraConfig(num_generations=NUM_GENERATIONS, n_min=2, n_max=10, p_estimate="history",
                                   num_prompts=10, seed=5)
    learner = RecordingLearner(rl_cluster=cluster, algo_config=config, reward_fns=first_char_reward)
    index = np.array([7, 2, 5, 0, 9, 4, 1, 8])
    learner.train(batches(2, prompt_index=index))
    first, second = learner.steps
    P, B = len(PROMPTS), len(PROMPTS) * NUM_GENERATIONS
    np.testing.assert_array_equal(first["counts_P"], np.full(P, NUM_GENERATIONS))  # nothing seen: equal estimates
    # The second step's allocation is the registry's on the tracker after the first step's rollouts.
    tracker = core.tracker_update(core.tracker_init(10), jnp.asarray(index), first["successes_P"], first["counts_P"])
    expected = core.get_allocator("sera").counts(core.tracker_predict(tracker, jnp.asarray(index)), B, n_min=2,
                                                 n_max=10)
    np.testing.assert_array_equal(second["counts_P"], np.asarray(expected))
    saved = learner.tracker_arrays()
    np.testing.assert_allclose(saved["successes"][index], first["successes_P"] + second["successes_P"])
    # A run restored from tunix's last checkpoint continues with that step's tracker (in the checkpoint's metadata).
    resumed = RecordingLearner(rl_cluster=make_cluster(model, optax.sgd(0.0), max_steps=3, **checkpoints),
                               algo_config=config, reward_fns=first_char_reward)
    assert resumed.rl_cluster.actor_trainer.restored_global_step() == 2
    for name in ("successes", "failures"):
        np.testing.assert_array_equal(resumed.tracker_arrays()[name], saved[name])
    learner.restore_tracker(saved)
    with pytest.raises(ValueError, match="num_prompts"):
        learner.restore_tracker({"successes": np.zeros(3), "failures": np.zeros(3)})


def test_a_prompt_the_released_rule_skips_runs_through_tunix(tmp_path):
    """The default allocator (the released SERA) gives a prompt whose history says it is hopeless (0 of 1,000)
    no rollouts: tunix samples the others only, exactly the budget, and the step's advantages, weights and
    metrics stay finite."""
    decoder = Decoder(DECODER, rngs=nnx.Rngs(1))
    with jax.set_mesh(_mesh()):
        model = tunix_models.to_tunix_qwen2(DECODER, decoder, tmp_path)
    config = sera_tunix.SeraConfig(num_generations=NUM_GENERATIONS, n_min=2, n_max=10, p_estimate="history",
                                   num_prompts=10, seed=5)
    assert config.allocator == "sera"
    learner = RecordingLearner(rl_cluster=make_cluster(model, optax.sgd(0.0), max_steps=1), algo_config=config,
                               reward_fns=first_char_reward)
    successes, failures = np.full(10, 3.0), np.full(10, 3.0)
    successes[7], failures[7] = 0.0, 1000.0
    learner.restore_tracker({"successes": successes, "failures": failures})
    index = np.array([7, 2, 5, 0, 9, 4, 1, 8])
    learner.train(batches(1, prompt_index=index))
    (step,) = learner.steps
    P, B = len(PROMPTS), len(PROMPTS) * NUM_GENERATIONS
    assert step["counts_P"][0] == 0 and step["counts_P"].sum() == B and (step["counts_P"][1:] >= 2).all()
    assert len(step["prompt_ids_B"]) == B and 0 not in set(np.asarray(step["prompt_ids_B"]).tolist())
    example = step["example"]
    for name in ("advantages", "loss_weights"):
        assert np.all(np.isfinite(np.asarray(getattr(example, name)))), name
    assert all(np.isfinite(v) for m in learner.metrics for v in m.values() if np.ndim(v) == 0)


def test_maxrl_is_registered_for_tunixs_uniform_groups():
    estimator = function_registry.get_advantage_estimator(sera_tunix.MAXRL_ADVANTAGE)
    rewards = np.array([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0], np.float32)
    expected = np.array([3, -1, -1, -1, 1 / 3, 1 / 3, -1, 1 / 3, 0, 0, 0, 0], np.float32)  # r N / K - 1
    np.testing.assert_allclose(estimator(rewards=rewards, num_generations=4), expected, rtol=1e-6)


@pytest.mark.parametrize("settings, field", [
    (dict(allocator="dapo"), "allocator"),
    (dict(allocator="nope"), "unknown allocation method"),
    (dict(advantage_estimator="nope"), "unknown estimator"),
    (dict(p_estimate="oracle"), "p_estimate"),
    (dict(p_estimate="history"), "num_prompts"),
    (dict(aggregation="mean"), "aggregation"),
    (dict(n_min=8), "n_min"),
    (dict(n_max=1), "n_max"),
    (dict(pilot_rollouts=9), "pilot_rollouts"),
    (dict(history_decay=0.0), "history_decay"),
])
def test_bad_settings_are_refused_by_name(settings, field):
    with pytest.raises(ValueError, match=field):
        sera_tunix.SeraConfig(num_generations=4, **settings)


def test_the_config_looks_its_allocator_up_once(monkeypatch):
    """``SeraConfig`` resolves ``allocator`` in the registry once, at construction: its properties and the
    learner's allocation (``_allocate``, which hands the entry to ``core.pilot_allocate``) read that entry, not the
    name again; a field changed after construction is looked up again, once."""
    lookups, get_allocator = [], core.get_allocator
    for module in (core, core.allocators):  # core.pilot_allocate looks a name up in its own module
        monkeypatch.setattr(module, "get_allocator", lambda name: lookups.append(name) or get_allocator(name))
    config = sera_tunix.SeraConfig(num_generations=4, n_min=2, n_max=10, pilot_rollouts=2)
    assert lookups == ["sera"] and config.registered_allocator is core.ALLOCATORS["sera"]
    assert config.needs_estimate and config.uses_pilot and not config.uses_history
    learner = object.__new__(sera_tunix.SeraLearner)  # _allocate reads the config and the tracker only
    learner.algo_config, learner.tracker = config, None
    successes = np.array([1, 0, 0, 2], np.float32)
    pilot = {"prompt_ids_B": np.repeat(np.arange(4), 2), "rewards_B": np.array([1, 0, 0, 0, 0, 0, 1, 1], np.float32)}
    counts, _ = learner._allocate(4, 16, {}, pilot, train=True)
    assert lookups == ["sera"]
    np.testing.assert_array_equal(counts, core.pilot_allocate(jnp.asarray(successes), 2, 16, n_min=2, n_max=10))
    config.allocator = "uniform"
    assert not config.needs_estimate and config.registered_allocator is core.ALLOCATORS["uniform"]
    assert lookups == ["sera", "sera", "uniform"]  # the reference's pilot_allocate above, then the changed field


def test_non_binary_rewards_and_split_allocations_are_refused(run, tmp_path):
    learner = run["learner"]
    saved = learner.reward_manager
    learner.reward_manager = lambda **kwargs: {"rewards": np.full(len(kwargs["prompts"]), 0.5), "log_metrics": {}}
    try:
        with pytest.raises(ValueError, match="0/1 reward"):
            learner._generate_and_compute_advantage(dict(prompts=np.repeat(PROMPTS[:2], 4),
                                                         accept=np.repeat(ACCEPT[:2], 4)))
    finally:
        learner.reward_manager = saved
    cluster = make_cluster(run["model"], optax.sgd(0.0), max_steps=1, mini_batch_size=6, train_micro_batch_size=3,
                           rollout_micro_batch_size=3)
    split = sera_tunix.SeraLearner(rl_cluster=cluster, algo_config=dataclasses.replace(run["config"]),
                                   reward_fns=first_char_reward)
    with pytest.raises(ValueError, match="rollout_micro_batch_size"):
        split.train(batches(1))
    with pytest.raises(ValueError, match="SeraConfig"):
        sera_tunix.SeraLearner(rl_cluster=cluster, algo_config=grpo_learner.GRPOConfig(num_generations=4),
                               reward_fns=first_char_reward)


def test_the_example_script_runs(capsys):
    example_script.main(["--steps=1"])
    out = capsys.readouterr().out
    assert "step 0: rollouts" in out and "done: 1 tunix steps" in out


def test_an_update_accumulated_over_micro_batches_is_the_whole_batchs_update(run, tmp_path):
    # tunix averages the gradients of an update's micro-batches (optax.MultiSteps); SERA's weights are normalised
    # over the whole update, so the learner scales them by the number of micro-batches: the same update either way.
    def one_step_delta(**training):
        decoder = Decoder(DECODER, rngs=nnx.Rngs(0))
        with jax.set_mesh(_mesh()):
            model = tunix_models.to_tunix_qwen2(DECODER, decoder, tmp_path / str(len(training)))
        before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
        learner = RecordingLearner(rl_cluster=make_cluster(model, optax.sgd(LEARNING_RATE), max_steps=1, **training),
                                   algo_config=run["config"], reward_fns=first_char_reward)
        learner.train(batches(1))
        after = nnx.state(learner.rl_cluster.actor_trainer.model, nnx.Param)
        return learner.steps[0], jax.tree.map(lambda a, b: np.asarray(a) - b, after, before)

    whole_step, whole = one_step_delta()
    split_step, split = one_step_delta(mini_batch_size=len(PROMPTS), train_micro_batch_size=len(PROMPTS) // 2,
                                       rollout_micro_batch_size=len(PROMPTS))
    np.testing.assert_array_equal(split_step["prompt_ids_B"], whole_step["prompt_ids_B"])  # the same draws
    np.testing.assert_array_equal(split_step["rewards_B"], whole_step["rewards_B"])
    norm = optax.tree.norm(whole)
    assert float(norm) > 1e-3
    assert float(optax.tree.norm(jax.tree.map(np.subtract, split, whole))) <= 1e-4 * float(norm)
