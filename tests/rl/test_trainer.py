"""The RL step and trainer on a one-token bandit task whose success probabilities are known exactly."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sera_jax.core as core
from sera_jax.models import decoder
from sera_jax.rl import step as step_lib
from sera_jax.rl.sampler import SampleOutput
from sera_jax.rl.trainer import PromptBatch, RLTrainer, default_rl_config
from sera_jax.train.sharding import batch_sharding, make_mesh, default_mesh_config

VOCAB, BOS, STOP, NUM_PROMPTS = 16, 1, 2, 12
TARGETS = 4 + np.arange(NUM_PROMPTS) % 8  # the rewarded answer token of each prompt


class BanditTask:
    """Prompt k = [BOS, 3 + k % 13]; the answer is one token then STOP; reward 1 iff it is TARGETS[k]."""

    stop_tokens = (STOP,)
    pad_id = 0
    max_new_tokens = 2
    num_train_prompts = NUM_PROMPTS

    def __init__(self, nan_rewards_from_step=None):
        self.nan_from = nan_rewards_from_step
        self.step = 0

    def _batch(self, keys):
        tokens = np.stack([np.full(len(keys), BOS), 3 + keys % 13], 1).astype(np.int32)
        return PromptBatch(keys, tokens, np.full(len(keys), 2, np.int32), TARGETS[keys])

    def train_prompts(self, step, num):
        self.step = step
        return self._batch(np.random.default_rng(step).permutation(NUM_PROMPTS)[:num])

    def eval_prompts(self):
        return self._batch(np.arange(NUM_PROMPTS))

    def rewards(self, prompts, prompt_ids_B, sample: SampleOutput):
        r = (sample.tokens_BxN[:, 0] == prompts.payload[prompt_ids_B]).astype(np.float32)
        if self.nan_from is not None and self.step >= self.nan_from:
            r[:] = np.nan
        return r

    def oracle_success_rates(self, prompts):
        return np.full(len(prompts.keys_P), 0.3, np.float32)


def _model(seed=0):
    return decoder.Decoder(decoder.tiny(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                                        head_dim=8, ffn_dim=32, max_seq_len=8), rngs=nnx.Rngs(seed))


def _config(**sera):
    c = default_rl_config()
    c.rl.update(steps=4, prompts_per_step=4, rollouts_per_step=16, learning_rate=3e-2)
    c.sera.update(n_max=8, **sera)
    c.eval.update(every=2, samples_per_prompt=4, ks=(1, 2, 4), max_rollouts_per_call=16)
    c.ckpt.update(every=1)
    return c


@pytest.mark.parametrize("sera", [dict(method="uniform"), dict(p_estimate="pilot"),
                                  dict(p_estimate="history", use_posterior=True), dict(p_estimate="oracle")])
def test_every_estimate_runs_and_spends_the_budget(tmp_path, sera):
    trainer = RLTrainer(BanditTask(), _model(), _config(**sera), tmp_path)
    out = trainer.train(show_progress=False)
    assert out["rollouts_spent"] == 4 * 16
    assert [e["step"] for e in out["evaluations"]] == [0, 2, 4] and out["evaluations"][-1]["k"] == [1, 2, 4]
    for m in out["history"]:
        assert 2 <= m["counts_min"] <= m["counts_max"] <= 8


def test_rl_step_gradient_is_the_weighted_score_sum():
    """rl_step's update direction equals sum_b w_b A_b grad log pi(y_b), computed here from raw logits."""
    model = _model(1)
    tx = step_lib.make_optimizer(1.0, b1=0.0, b2=0.0, grad_clip=None)  # not used for the gradient itself
    graphdef, state = step_lib.create_train_state(model, tx)
    rng = np.random.default_rng(0)
    prompts = np.stack([np.full(6, BOS), rng.integers(3, 16, 6)], 1)
    response = np.stack([rng.integers(3, 16, 6), np.full(6, STOP)], 1)
    mask = np.ones((6, 2), bool)
    weights = rng.uniform(size=(6, 2)).astype(np.float32)
    adv = rng.normal(size=6).astype(np.float32)
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.full(6, 2), jnp.asarray(response),
                                    jnp.asarray(mask), jnp.asarray(weights))

    def reference_loss(params):
        logits = nnx.merge(graphdef, params)(jnp.asarray(np.concatenate([prompts, response], 1)))
        logp = jax.nn.log_softmax(logits, -1)  # position t predicts token t + 1
        picked = jnp.take_along_axis(logp[:, 1:3], jnp.asarray(response)[..., None], -1)[..., 0]
        return -jnp.sum(weights * adv[:, None] * picked)

    expected = jax.grad(reference_loss)(state.params)
    got = jax.grad(lambda p: -jnp.sum(weights * adv[:, None] * step_lib.response_logprobs(graphdef, p, batch)))(
        state.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), expected, got)


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    config = _config(p_estimate="pilot")
    straight = RLTrainer(BanditTask(), _model(), config, tmp_path / "a").train(show_progress=False)
    first = RLTrainer(BanditTask(), _model(), config, tmp_path / "b")
    first.train(max_steps=2, show_progress=False)
    resumed = RLTrainer(BanditTask(), _model(), config, tmp_path / "b")
    assert resumed.restore() == 2
    out = resumed.train(show_progress=False)
    for a, b in zip(straight["history"], out["history"]):
        assert a["step"] == b["step"]
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        assert a["reward_mean"] == b["reward_mean"]
    assert straight["evaluations"] == out["evaluations"]


def test_nan_rewards_are_a_clear_error(tmp_path):
    trainer = RLTrainer(BanditTask(nan_rewards_from_step=1), _model(), _config(method="uniform"), tmp_path)
    with pytest.raises(ValueError, match="binary \\(0/1\\) rewards.*nan"):
        trainer.train(show_progress=False)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    config = _config(method="uniform")
    config.rl.update(learning_rate=1e38, grad_clip=None)  # the first update overflows the logits
    trainer = RLTrainer(BanditTask(), _model(), config, tmp_path)
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step (\d+).*last good checkpoint \(step \1\)") as e:
        trainer.train(show_progress=False)
    failed_step = int(re.search(r"step (\d+)", str(e.value)).group(1))
    again = RLTrainer(BanditTask(), _model(), config, tmp_path)
    assert again.restore() == failed_step  # the checkpoint before the failing step, intact


def test_rl_step_sharded_equals_unsharded():
    mesh = make_mesh(default_mesh_config())
    sharding = batch_sharding(mesh)
    tx = step_lib.make_optimizer(1e-2)
    rng = np.random.default_rng(1)
    b = 16
    prompts = np.stack([np.full(b, BOS), rng.integers(3, 16, b)], 1)
    response = np.stack([rng.integers(3, 16, b), np.full(b, STOP)], 1)
    ids = jnp.asarray(np.repeat(np.arange(4), 4))
    weights = core.loss_weights(ids, 4, token_mask_BxT=jnp.ones((b, 2)))
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.full(b, 2), jnp.asarray(response),
                                    jnp.ones((b, 2), bool), weights)
    adv = jnp.asarray(rng.normal(size=b), jnp.float32)
    results = []
    for place in (lambda x: x, lambda x: jax.device_put(x, sharding)):
        graphdef, state = step_lib.create_train_state(_model(2), tx)
        state, metrics = step_lib.rl_step(state, jax.tree.map(place, batch), place(adv), graphdef=graphdef, tx=tx)
        results.append((jax.device_get(state.params), float(metrics["loss"])))
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6), results[0][0], results[1][0])


def test_bad_configs_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="rollouts_per_step=1000 is infeasible"):
        c = _config()
        c.rl.rollouts_per_step = 1000
        RLTrainer(BanditTask(), _model(), c, tmp_path)
    with pytest.raises(ValueError, match="p_estimate='guess'"):
        RLTrainer(BanditTask(), _model(), _config(p_estimate="guess"), tmp_path)
    with pytest.raises(ValueError, match="unknown estimator"):
        RLTrainer(BanditTask(), _model(), _config(estimator="ppo"), tmp_path)


def _exact_target_p(trainer):
    model = nnx.merge(trainer.graphdef, trainer.state.params)
    keys = np.arange(NUM_PROMPTS)
    tokens = jnp.asarray(np.stack([np.full(NUM_PROMPTS, BOS), 3 + keys % 13], 1))
    return np.asarray(jax.nn.softmax(model(tokens)[:, -1])[keys, TARGETS])


@pytest.mark.parametrize("method", ["uniform", "sera"])
def test_training_raises_the_likelihood_of_the_targets(tmp_path, method):
    """Sanity: 40 steps of MaxRL (uniform or SERA with pilot estimates) raise mean_i log p_i clearly."""
    c = _config(method=method)
    c.rl.update(steps=40, learning_rate=3e-3)
    c.eval.every = 0
    model = decoder.Decoder(decoder.tiny(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                         head_dim=16, ffn_dim=64, max_seq_len=8, tie_embeddings=False),
                            rngs=nnx.Rngs(3))
    trainer = RLTrainer(BanditTask(), model, c, tmp_path)
    before = np.mean(np.log(_exact_target_p(trainer)))
    trainer.train(show_progress=False)
    after = np.mean(np.log(_exact_target_p(trainer)))
    assert after > before + 0.1, (before, after)


def test_microbatched_update_equals_one_batch_sharded_or_not():
    """Accumulating over M slices (rows m, m + M, ...) gives the one-batch update, on one device and on 8."""
    sharding = batch_sharding(make_mesh(default_mesh_config()))
    tx = step_lib.make_optimizer(1e-2)
    rng = np.random.default_rng(3)
    b = 32
    prompts = np.stack([np.full(b, BOS), rng.integers(3, 16, b)], 1)
    response = np.stack([rng.integers(3, 16, b), np.full(b, STOP)], 1)
    mask = np.ones((b, 2), bool)
    mask[::3, 1] = False  # some responses are one token shorter
    ids = jnp.asarray(np.repeat(np.arange(8), 4))
    weights = core.loss_weights(ids, 8, token_mask_BxT=jnp.asarray(mask, jnp.float32))
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.full(b, 2), jnp.asarray(response),
                                    jnp.asarray(mask), weights)
    adv = jnp.asarray(rng.normal(size=b), jnp.float32)
    results = {}
    for name, place, m in (("one", lambda x: x, 1), ("micro4", lambda x: x, 4),
                           ("sharded_micro2", lambda x: jax.device_put(x, sharding), 2)):
        graphdef, state = step_lib.create_train_state(_model(4), tx)
        state, metrics = step_lib.rl_step(state, jax.tree.map(place, batch), place(adv), graphdef=graphdef, tx=tx,
                                          microbatches=m)
        results[name] = (jax.device_get(state.params), {k: float(v) for k, v in metrics.items()})
    ref_params, ref_metrics = results.pop("one")
    for params, metrics in results.values():
        for key in ref_metrics:
            np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5)
        jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6), ref_params, params)
    with pytest.raises(ValueError, match="do not split into microbatches=5"):
        graphdef, state = step_lib.create_train_state(_model(4), tx)
        step_lib.rl_step(state, batch, adv, graphdef=graphdef, tx=tx, microbatches=5)


def test_chunked_sampling_and_microbatches_run_and_spend_the_budget(tmp_path):
    config = _config(p_estimate="pilot")
    config.rl.update(sample_chunk=6, update_microbatches=4)  # pilot 8 rows: 6 + 2 (padded); main 8: 6 + 2
    out = RLTrainer(BanditTask(), _model(), config, tmp_path).train(show_progress=False)
    assert out["rollouts_spent"] == 4 * 16 and all(np.isfinite(m["loss"]) for m in out["history"])
    bad = _config()
    bad.rl.update_microbatches = 3
    with pytest.raises(ValueError, match=r"rl\.update_microbatches=3.*divides rl\.rollouts_per_step=16"):
        RLTrainer(BanditTask(), _model(), bad, tmp_path / "bad")


def test_chunked_sampling_keeps_each_rollout_with_its_prompt(tmp_path):
    """Every rollout's sampled-token log-prob is the model's for *its* prompt (a misaligned chunk would not be)."""
    config = _config(method="uniform")
    config.rl.sample_chunk = 5  # 14 rollouts: 5 + 5 + 4 (padded to 5)
    trainer = RLTrainer(BanditTask(), _model(5), config, tmp_path)
    prompts = BanditTask().train_prompts(0, 4)
    ids = np.array([3, 0, 2, 2, 1, 3, 0, 0, 1, 2, 3, 3, 1, 0])
    rollouts = trainer._sample(prompts, ids, jax.random.key(7), 1.0, trainer.sample_fn)
    assert rollouts.sample.tokens_BxN.shape == (14, 2) and np.array_equal(rollouts.prompt_ids_B, ids)
    logits = nnx.merge(trainer.graphdef, trainer.state.params)(jnp.asarray(prompts.tokens_PxT))
    logp_PxV = np.asarray(jax.nn.log_softmax(logits[:, -1], -1))
    first = rollouts.sample.tokens_BxN[:, 0]
    np.testing.assert_allclose(rollouts.sample.logp_policy_BxN[:, 0], logp_PxV[ids, first], rtol=1e-4, atol=1e-5)
    assert len(set(logp_PxV[:, 5].round(4))) == 4  # the prompts' distributions differ: the check can fail


def test_trainer_on_a_mesh_places_its_state_and_resumes_exactly(tmp_path):
    from sera_jax.train.sharding import make_placement

    placement = make_placement(default_mesh_config())
    assert placement.mesh is not None and placement.num_batch_shards == jax.device_count()
    config = _config(p_estimate="history")
    straight = RLTrainer(BanditTask(), _model(), config, tmp_path / "a", placement=placement)
    leaves = jax.tree.leaves((straight.state, straight.tracker))
    assert all(leaf.sharding.mesh == placement.mesh for leaf in leaves)
    out = straight.train(show_progress=False)
    first = RLTrainer(BanditTask(), _model(), config, tmp_path / "b", placement=placement)
    first.train(max_steps=2, show_progress=False)
    resumed = RLTrainer(BanditTask(), _model(), config, tmp_path / "b", placement=placement)
    assert resumed.restore() == 2
    again = resumed.train(show_progress=False)
    assert [h["reward_mean"] for h in again["history"]] == [h["reward_mean"] for h in out["history"]]
    np.testing.assert_allclose([h["loss"] for h in again["history"]], [h["loss"] for h in out["history"]], rtol=1e-5)
    assert again["evaluations"] == out["evaluations"]


def test_rows_that_do_not_split_over_the_data_shards_are_named(tmp_path):
    from sera_jax.train.sharding import Placement, make_placement

    mesh = make_placement(default_mesh_config()).mesh
    config = _config(p_estimate="pilot")
    config.rl.update(prompts_per_step=3, rollouts_per_step=24)  # pilot: 3 * 2 = 6 rows over 8 shards
    with pytest.raises(ValueError, match=r"pilot_rollouts \* prompts_per_step=6 must be a multiple of the 8 data shards"):
        RLTrainer(BanditTask(), _model(), config, tmp_path, placement=Placement(mesh, (), ("data",)))
