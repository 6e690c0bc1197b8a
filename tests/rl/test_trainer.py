"""The RL step, its stages and the RL run on a one-token bandit task whose success probabilities are known."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import sera_jax.core as core
from sera_jax.models import decoder
from sera_jax.rl import comparison
from sera_jax.rl import step as step_lib
from sera_jax.rl import trainer as T
from sera_jax.rl.config import default_rl_config, validate_rl_config
from sera_jax.rl.task import PromptBatch, SampleOutput
from sera_jax.train.loop import StepAllowance, StopRequested
from sera_jax.train.sharding import Placement, batch_sharding, default_mesh_config, make_mesh, make_placement

VOCAB, BOS, STOP, NUM_PROMPTS = 16, 1, 2, 12
TARGETS = 4 + np.arange(NUM_PROMPTS) % 8  # the rewarded answer token of each prompt


class BanditTask:
    """Prompt k = [BOS, 3 + k % 13]; the answer is one token then STOP; reward 1 iff it is TARGETS[k].

    Counts the rollout rows it scores for each training batch (``train_rows``): what was really sampled."""

    stop_tokens = (STOP,)
    pad_id = 0
    max_new_tokens = 2
    num_train_prompts = NUM_PROMPTS
    knows_success_rates = True

    def __init__(self, nan_rewards_from_step=None, knows_success_rates=True):
        self.nan_from = nan_rewards_from_step
        self.knows_success_rates = knows_success_rates
        self.step = 0
        self.train_rows: dict[int, int] = {}  # step -> rows scored

    def _batch(self, keys, step=-1):
        tokens = np.stack([np.full(len(keys), BOS), 3 + keys % 13], 1).astype(np.int32)
        # Each prompt carries its answer and the training step that fetched it (-1: held out), through any
        # selection or chunking of the batch.
        payload = np.rec.fromarrays([TARGETS[keys], np.full(len(keys), step)], names="target,step")
        return PromptBatch(keys, tokens, np.full(len(keys), 2, np.int32), payload)

    def train_prompts(self, step, num):
        self.step = step
        return self._batch(np.random.default_rng(step).permutation(NUM_PROMPTS)[:num], step)

    def eval_prompts(self):
        return self._batch(np.arange(NUM_PROMPTS))

    def rewards(self, prompts, prompt_ids_B, sample: SampleOutput):
        step = int(prompts.payload["step"][0])
        if step >= 0:
            self.train_rows[step] = self.train_rows.get(step, 0) + len(prompt_ids_B)
        r = (np.asarray(sample.tokens_BxR)[:, 0] == prompts.payload["target"][prompt_ids_B]).astype(np.float32)
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


def _train(task, model, config, workdir, compiled=None, **kwargs):
    """``T.train_rl``, with ``compiled``'s shared update and samplers when given (else the run builds its own)."""
    if compiled is not None:
        kwargs.update(compiled.for_run(task, nnx.graphdef(model), config))
    return T.train_rl(task, model, config, workdir, show_progress=False, **kwargs)


class Compiled:
    """The jitted update and samplers shared by this file's tests, as ``run_comparison`` shares them between runs:
    one ``T.make_update`` per model structure and the ``config.rl`` fields it reads, one ``T.make_sample_fns`` per
    ``T.sample_fn_settings`` (a rebuilt jitted function traces, lowers and compiles again)."""

    UPDATE_FIELDS = ("learning_rate", "b1", "b2", "weight_decay", "grad_clip", "update_microbatches", "logprob_chunk")

    def __init__(self):
        self.updates, self.samplers = {}, {}

    def update(self, graphdef, config):
        key = (graphdef, *(config.rl[name] for name in self.UPDATE_FIELDS))
        if key not in self.updates:
            self.updates[key] = T.make_update(graphdef, config)
        return self.updates[key]

    def for_run(self, task, graphdef, config) -> dict:
        """``train_rl``'s ``update`` and ``sample_fns``."""
        return dict(update=self.update(graphdef, config),
                    sample_fns=comparison.shared_sample_fns(self.samplers, graphdef, task, config))

    def context(self, task, graphdef, config, **kwargs):
        """(optimizer, ``T.make_context`` with the shared update and samplers)."""
        shared = self.for_run(task, graphdef, config)
        tx, update = shared["update"]
        return tx, T.make_context(task, graphdef, config, update_fn=update, sample_fns=shared["sample_fns"], **kwargs)


@pytest.fixture(scope="module")
def compiled():
    return Compiled()


def _assert_ran_four_steps_of_the_budget(task, run):
    """A run of ``_config()`` sampled exactly B = 16 rollouts a step, each prompt within [n_min, n_max], and
    evaluated at steps 0, 2 and 4."""
    assert run.step == 4
    # Rows the task actually scored for each step's prompts (pilot included), not a counter of the trainer's.
    assert task.train_rows == {s: 16 for s in range(4)}
    assert [e["step"] for e in run.evaluations] == [0, 2, 4] and run.evaluations[-1]["k"] == [1, 2, 4]
    assert [e["rollouts_spent"] for e in run.evaluations] == [0, 32, 64]
    for m in run.history:
        _assert_counts_in_bounds(m)
        assert m["rollouts_sampled"] == 16


def _assert_counts_in_bounds(m):
    """Each prompt within [n_min, n_max] = [2, 8], or 0 for a rule that skips prompts (the released SERA)."""
    assert m["counts_min"] == 0 or 2 <= m["counts_min"]
    assert m["counts_min"] <= m["counts_max"] <= 8
    assert m["counts_min"] > 0 or m["active_frac"] < 1


@pytest.mark.parametrize("sera", [dict(method="uniform"),
                                  dict(method="sera_all_active", p_estimate="history", use_posterior=True),
                                  dict(p_estimate="epoch_history"), dict(p_estimate="oracle")])
def test_every_estimate_runs_and_samples_exactly_the_budget(tmp_path, compiled, sera):
    """(Pilot estimates: the uninterrupted run of test_resume_after_a_kill_reproduces_the_uninterrupted_run.)"""
    task = BanditTask()
    _assert_ran_four_steps_of_the_budget(task, _train(task, _model(), _config(**sera), tmp_path, compiled))


def test_the_update_moves_the_parameters_by_the_weighted_score_sum():
    """One policy-gradient update with SGD at lr 1 moves the parameters by -grad L, where
    L = -sum_bt w_bt A_b log pi(y_bt | prefix) is computed here from the raw logits."""
    model = _model(1)
    graphdef, params = nnx.split(model)
    tx = optax.sgd(1.0)
    update = step_lib.make_policy_gradient_update(graphdef, tx)
    rng = np.random.default_rng(0)
    prompts = np.stack([np.full(6, BOS), rng.integers(3, 16, 6)], 1)
    response = np.stack([rng.integers(3, 16, 6), np.full(6, STOP)], 1)
    weights = rng.uniform(size=(6, 2)).astype(np.float32)
    adv = rng.normal(size=6).astype(np.float32)
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.full(6, 2), jnp.asarray(response),
                                    jnp.ones((6, 2), bool), jnp.asarray(weights))

    def reference_loss(p):
        logits = nnx.merge(graphdef, p)(jnp.asarray(np.concatenate([prompts, response], 1)))
        logp = jax.nn.log_softmax(logits, -1)  # position t predicts token t + 1
        picked = jnp.take_along_axis(logp[:, 1:3], jnp.asarray(response)[..., None], -1)[..., 0]
        return -jnp.sum(weights * adv[:, None] * picked)

    before = jax.tree.map(np.array, params)
    expected = jax.jit(jax.grad(reference_loss))(params)
    state = step_lib.TrainState(jax.tree.map(jnp.copy, params), tx.init(params), jnp.zeros((), jnp.int32))
    state, metrics = update(state, batch, jnp.asarray(adv))
    np.testing.assert_allclose(float(metrics["loss"]), float(jax.jit(reference_loss)(params)), rtol=1e-5)
    moved = jax.tree.map(lambda a, b: np.asarray(a) - b, state.params, before)
    jax.tree.map(lambda m, g: np.testing.assert_allclose(m, -np.asarray(g), rtol=2e-4, atol=1e-6), moved, expected)
    assert int(state.step) == 1


def test_resume_after_a_kill_reproduces_the_uninterrupted_run(tmp_path, compiled):
    config, task = _config(p_estimate="pilot"), BanditTask()
    straight = _train(task, _model(), config, tmp_path / "a", compiled)
    _assert_ran_four_steps_of_the_budget(task, straight)  # test_every_estimate_runs_and_samples_exactly_the_budget's
    with pytest.raises(StopRequested):
        _train(BanditTask(), _model(), config, tmp_path / "b", compiled, allowance=StepAllowance(2))
    resumed = _train(BanditTask(), _model(), config, tmp_path / "b", compiled)
    assert [h["step"] for h in resumed.history] == [0, 1, 2, 3]
    for a, b in zip(straight.history, resumed.history):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        assert a["reward_mean"] == b["reward_mean"]
    assert straight.evaluations == resumed.evaluations


def test_the_step_is_a_pure_function_of_state_prompts_and_key(compiled):
    task, config = BanditTask(), _config(p_estimate="history")
    graphdef, params = nnx.split(_model())
    tx, ctx = compiled.context(task, graphdef, config)
    state = T.init_state(ctx, params, tx)
    prompts = task.train_prompts(0, 4)
    outs = [T.rl_step(ctx, jax.tree.map(jnp.copy, state), prompts, jax.random.key(3)) for _ in range(2)]
    jax.tree.map(np.testing.assert_array_equal, outs[0][0], outs[1][0])
    assert int(outs[0][0].step) == 1 and int(state.step) == 0  # the input state is left as it was
    for key in ("loss", "reward_mean", "counts_max"):
        assert float(outs[0][1][key]) == float(outs[1][1][key])


def test_stages_one_by_one_spend_the_budget_with_the_pilot(compiled):
    task, config = BanditTask(), _config(p_estimate="pilot", pilot_rollouts=2)
    graphdef, params = nnx.split(_model())
    tx, ctx = compiled.context(task, graphdef, config)
    state = T.init_state(ctx, params, tx)
    prompts = task.train_prompts(0, 4)
    estimate = T.estimate_success_rates(ctx, state, prompts, jax.random.key(0))
    assert estimate.pilot.prompt_ids_B.shape == (8,) and estimate.pilot.rewards_B.shape == (8,)
    successes = np.bincount(np.asarray(estimate.pilot.prompt_ids_B), np.asarray(estimate.pilot.rewards_B), 4)
    np.testing.assert_allclose(estimate.p_hat_P, (successes + 0.5) / (2 + 1), rtol=1e-6)  # Jeffreys posterior mean
    assert ctx.allocator is core.get_allocator(config.sera.method)  # resolved once, by make_context
    counts = T.allocate_rollouts(config, ctx.allocator, estimate)
    assert int(counts.sum()) == 16 and int(counts.min()) >= 2
    ids = T.main_rollout_ids(config, counts, estimate)
    np.testing.assert_array_equal(np.bincount(np.asarray(ids), minlength=4) + 2, counts)  # pilot's 2 each
    main = T.sample_rollouts(ctx, state.params, prompts, ids, jax.random.key(1), 1.0)
    main = main._replace(rewards_B=T.score_rollouts(task, prompts, main))
    rollouts = T.join_rollouts(estimate.pilot, main)
    np.testing.assert_array_equal(np.bincount(np.asarray(rollouts.prompt_ids_B), minlength=4), counts)
    new_state, metrics = T.update_policy(ctx, state, prompts, rollouts)
    assert int(new_state.step) == 1 and np.isfinite(float(metrics["loss"]))


def test_oracle_estimates_are_refused_for_tasks_that_cannot_give_p(tmp_path):
    with pytest.raises(ValueError, match=r"config\.sera\.p_estimate='oracle'.*cannot give the true success rates"):
        _train(BanditTask(knows_success_rates=False), _model(), _config(p_estimate="oracle"), tmp_path)


def test_nan_rewards_are_a_clear_error(tmp_path, compiled):
    with pytest.raises(ValueError, match="binary \\(0/1\\) rewards.*nan"):
        _train(BanditTask(nan_rewards_from_step=1), _model(), _config(method="uniform"), tmp_path, compiled)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, compiled):
    config = _config(method="uniform")
    config.rl.update(learning_rate=1e38, grad_clip=None)  # the first update overflows the logits
    with pytest.raises(FloatingPointError, match=r"non-finite (loss at step|state after) (\d+).*last good checkpoint "
                                                 r"\(step (\d+)\)") as e:
        _train(BanditTask(), _model(), config, tmp_path, compiled)
    last = int(re.search(r"last good checkpoint \(step (\d+)\)", str(e.value)).group(1))
    from sera_jax.train.checkpoint import Checkpointer

    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        assert ckpt.latest_step() == last  # the checkpoint before the failing step, intact and named


def test_bad_configs_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="rollouts_per_step=1000 is infeasible"):
        c = _config()
        c.rl.rollouts_per_step = 1000
        _train(BanditTask(), _model(), c, tmp_path)
    with pytest.raises(ValueError, match="p_estimate='guess'"):
        _train(BanditTask(), _model(), _config(p_estimate="guess"), tmp_path)
    with pytest.raises(ValueError, match="unknown estimator"):
        _train(BanditTask(), _model(), _config(estimator="ppo"), tmp_path)
    with pytest.raises(ValueError, match=r"config\.sera\.method='ppo'.*unknown allocation method 'ppo'"):
        _train(BanditTask(), _model(), _config(method="ppo"), tmp_path)
    with pytest.raises(ValueError, match=r"config\.sera\.method='sera_sum' \(config\.sera\.estimator='grpo'\)"):
        _train(BanditTask(), _model(), _config(method="sera_sum", estimator="grpo"), tmp_path)


@pytest.mark.parametrize("method", sorted(core.ALLOCATORS))
def test_every_registered_allocator_runs_a_step_within_the_budget(tmp_path, compiled, method, monkeypatch):
    """Every allocator in the registry runs through the trainer by name and samples exactly the budget (pilot
    included), each prompt within [n_min, n_max]; the rules themselves are tested in tests/core. The run looks
    its allocator up in the registry once (``make_context``, into ``RLContext.allocator``), whatever its kind."""
    task = BanditTask()
    config = _config(method=method, candidate_ratio=2)  # selection peers: 8 candidates of the 12 prompts
    config.rl.steps = 2  # the second step revisits prompts, as a history-reading allocator needs
    lookups, get_allocator = [], core.get_allocator
    monkeypatch.setattr(core, "get_allocator", lambda name: lookups.append(name) or get_allocator(name))
    run = _train(task, _model(), config, tmp_path, compiled)
    assert lookups == [method]
    assert task.train_rows == {0: 16, 1: 16}
    for step in run.history:
        assert step["rollouts_sampled"] == 16
        _assert_counts_in_bounds(step)


def _exact_target_p(graphdef, params):
    model = nnx.merge(graphdef, params)
    keys = np.arange(NUM_PROMPTS)
    tokens = jnp.asarray(np.stack([np.full(NUM_PROMPTS, BOS), 3 + keys % 13], 1))
    return np.asarray(jax.nn.softmax(model(tokens)[:, -1])[keys, TARGETS])


@pytest.mark.parametrize("method", ["uniform", "sera"])
def test_training_raises_the_likelihood_of_the_targets(tmp_path, compiled, method):
    """Sanity: 40 steps of MaxRL (uniform or SERA with pilot estimates) raise mean_i log p_i clearly."""
    c = _config(method=method)
    c.rl.update(steps=40, learning_rate=3e-3)
    c.eval.every = 0
    c.ckpt.every = 40
    model = decoder.Decoder(decoder.tiny(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                         head_dim=16, ffn_dim=64, max_seq_len=8, tie_embeddings=False),
                            rngs=nnx.Rngs(3))
    graphdef, params = nnx.split(model)
    before = np.mean(np.log(_exact_target_p(graphdef, params)))
    run = _train(BanditTask(), model, c, tmp_path, compiled)
    after = np.mean(np.log(_exact_target_p(graphdef, run.state.params)))
    assert after > before + 0.1, (before, after)


def test_microbatched_update_equals_one_batch_sharded_or_not():
    """Accumulating over M slices (rows m, m + M, ...) gives the one-batch update, on one device and on 8; and the
    one-batch update sharded over 8 devices equals it on one."""
    sharding = batch_sharding(make_mesh(default_mesh_config()))
    tx = step_lib.make_optimizer(1e-2)
    rng = np.random.default_rng(3)
    b = 32
    prompts = np.stack([np.full(b, BOS), rng.integers(3, 16, b)], 1)
    response = np.stack([rng.integers(3, 16, b), np.full(b, STOP)], 1)
    mask = np.ones((b, 2), bool)
    mask[::3, 1] = False  # some responses are one token shorter
    ids = jnp.asarray(np.repeat(np.arange(8), 4))
    weights = core.loss_weights(ids, 8, token_mask_BxR=jnp.asarray(mask, jnp.float32))
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.full(b, 2), jnp.asarray(response),
                                    jnp.asarray(mask), weights)
    adv = jnp.asarray(rng.normal(size=b), jnp.float32)
    results = {}
    for name, place, m in (("one", lambda x: x, 1), ("micro4", lambda x: x, 4),
                           ("sharded", lambda x: jax.device_put(x, sharding), 1),
                           ("sharded_micro2", lambda x: jax.device_put(x, sharding), 2)):
        graphdef, state = step_lib.create_train_state(_model(4), tx)
        update = step_lib.make_policy_gradient_update(graphdef, tx, m)
        state, metrics = update(state, jax.tree.map(place, batch), place(adv))
        results[name] = (jax.device_get(state.params), {k: float(v) for k, v in metrics.items()})
    ref_params, ref_metrics = results.pop("one")
    for params, metrics in results.values():
        for key in ref_metrics:
            np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5)
        jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6), ref_params, params)
    with pytest.raises(ValueError, match="do not split into microbatches=5"):
        graphdef, state = step_lib.create_train_state(_model(4), tx)
        step_lib.make_policy_gradient_update(graphdef, tx, 5)(state, batch, adv)


def test_chunked_sampling_and_microbatches_sample_exactly_the_budget(tmp_path, compiled):
    config = _config(p_estimate="pilot")
    config.rl.update(sample_chunk=6, update_microbatches=4)  # pilot 8 rows: 6 + 2 (padded); main 8: 6 + 2
    task = BanditTask()
    run = _train(task, _model(), config, tmp_path, compiled)
    assert task.train_rows == {s: 16 for s in range(4)} and all(np.isfinite(m["loss"]) for m in run.history)
    bad = _config()
    bad.rl.update_microbatches = 3
    with pytest.raises(ValueError, match=r"rl\.update_microbatches=3.*divides rl\.rollouts_per_step=16"):
        _train(BanditTask(), _model(), bad, tmp_path / "bad")


def test_chunked_sampling_keeps_each_rollout_with_its_prompt(compiled):
    """Every rollout's sampled-token log-prob is the model's for *its* prompt (a misaligned chunk would not be)."""
    config = _config(method="uniform")
    config.rl.sample_chunk = 5  # 14 rollouts: 5 + 5 + 4 (padded to 5)
    task = BanditTask()
    graphdef, params = nnx.split(_model(5))
    _, ctx = compiled.context(task, graphdef, config)
    prompts = task.train_prompts(0, 4)
    ids = np.array([3, 0, 2, 2, 1, 3, 0, 0, 1, 2, 3, 3, 1, 0])
    rollouts = T.sample_rollouts(ctx, params, prompts, jnp.asarray(ids), jax.random.key(7), 1.0)
    assert rollouts.sample.tokens_BxR.shape == (14, 2) and np.array_equal(rollouts.prompt_ids_B, ids)
    logits = nnx.merge(graphdef, params)(jnp.asarray(prompts.tokens_PxT))
    logp_PxV = np.asarray(jax.nn.log_softmax(logits[:, -1], -1))
    first = np.asarray(rollouts.sample.tokens_BxR[:, 0])
    np.testing.assert_allclose(rollouts.sample.logp_policy_BxR[:, 0], logp_PxV[ids, first], rtol=1e-4, atol=1e-5)
    assert len(set(logp_PxV[:, 5].round(4))) == 4  # the prompts' distributions differ: the check can fail


def test_chunks_continue_the_ranks_so_chunking_changes_no_rollout(compiled):
    """Rollouts are keyed by (prompt, rank): chunks of 5 (the last padded) draw the rollouts of one call, with and
    without a rank offset, and the offset shifts each prompt's ranks (rows of rank r + 2 of the plain call)."""
    task = BanditTask()
    graphdef, params = nnx.split(_model(5))
    prompts = task.train_prompts(0, 4)
    ids = jnp.asarray([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3])  # 14 rollouts: 5 + 5 + 4 (padded to 5)
    samples = {}
    for chunk in (0, 5):
        config = _config(method="uniform")
        config.rl.sample_chunk = chunk
        _, ctx = compiled.context(task, graphdef, config)
        for offset in (None, jnp.full(4, 2, jnp.int32)):
            samples[chunk, offset is None] = T.sample_rollouts(ctx, params, prompts, ids, jax.random.key(8), 1.0,
                                                               rank_offset_P=offset).sample
    for plain in (True, False):
        for got, want in zip(samples[5, plain], samples[0, plain]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    tokens, shifted = np.asarray(samples[0, True].tokens_BxR), np.asarray(samples[0, False].tokens_BxR)
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):  # prompts 0 and 1: 4 rollouts, ranks 0..3 and (offset 2) 2..5
        np.testing.assert_array_equal(shifted[rows[:2]], tokens[rows[2:]])
    assert len({int(t) for t in tokens[:, 0]}) > 2  # the rollouts differ: the checks can fail


@pytest.mark.parametrize("sample_chunk", [0, 6])
def test_uniform_and_pilot_steps_draw_the_same_rollouts(compiled, sample_chunk):
    """Common random numbers: from the same state, prompts and step key, a uniform step and a SERA step with a
    pilot (2 rollouts a prompt, then the rest of its allocation) draw the same tokens for every (prompt, rank)
    both hold: the pilot is ranks 0..1, the main call continues at rank 2."""
    sampled = {}
    for name, sera in (("uniform", dict(method="uniform")), ("sera", dict(p_estimate="pilot", pilot_rollouts=2))):
        task = RecordingTask()
        config = _config(**sera)
        config.rl.sample_chunk = sample_chunk
        graphdef, params = nnx.split(_model(7))
        tx, ctx = compiled.context(task, graphdef, config)
        _, metrics = T.rl_step(ctx, T.init_state(ctx, params, tx), task.train_prompts(0, 4), jax.random.key(4))
        ids = np.concatenate([i for i, _ in task.calls])
        tokens = np.concatenate([t for _, t in task.calls])
        sampled[name] = [tokens[ids == i] for i in range(4)]  # calls in order, rows in order: by rank
    counts = {name: [len(rows) for rows in by_prompt] for name, by_prompt in sampled.items()}
    assert counts["uniform"] == [4] * 4 and sum(counts["sera"]) == 16
    assert counts["sera"] != counts["uniform"]  # SERA's allocation differs: other layouts, other calls
    for i in range(4):
        common = min(counts["uniform"][i], counts["sera"][i])
        np.testing.assert_array_equal(sampled["sera"][i][:common], sampled["uniform"][i][:common], err_msg=f"{i}")
    assert len({int(t) for rows in sampled["uniform"] for t in rows[:, 0]}) > 2  # the check can fail


class RecordingTask(BanditTask):
    """The bandit, recording each scored call's (prompt_ids_B, tokens_BxR) and lengths: every rollout the step
    sampled; ``last_keys``: the dataset keys of the last call's prompts (after any selection)."""

    def __init__(self):
        super().__init__()
        self.calls, self.lengths, self.last_keys = [], [], None

    def rewards(self, prompts, prompt_ids_B, sample):
        self.calls.append((np.asarray(prompt_ids_B), np.asarray(sample.tokens_BxR)))
        self.lengths.append(np.asarray(sample.lengths_B))
        self.last_keys = np.asarray(prompts.keys_P)
        return super().rewards(prompts, prompt_ids_B, sample)


def test_fewer_decoding_slots_sample_the_same_rollouts(compiled):
    """rl.sample_slots only changes which slot runs a rollout (slot refill), never its tokens or log-probs."""
    task = BanditTask()
    graphdef, params = nnx.split(_model(5))
    prompts = task.train_prompts(0, 4)
    ids = jnp.asarray([3, 0, 2, 2, 1, 3, 0, 0, 1, 2, 3, 3, 1, 0])
    samples = []
    for slots in (0, 3):
        config = _config(method="uniform")
        config.rl.sample_slots = slots
        _, ctx = compiled.context(task, graphdef, config)
        samples.append(T.sample_rollouts(ctx, params, prompts, ids, jax.random.key(7), 1.0).sample)
    for got, want in zip(samples[1], samples[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    config.rl.sample_slots = -1
    with pytest.raises(ValueError, match="config.rl.sample_slots=-1"):
        T.make_context(task, graphdef, config)


def test_training_on_a_mesh_places_its_state_and_resumes_exactly(tmp_path, compiled):
    placement = make_placement(default_mesh_config())
    assert placement.mesh is not None and placement.num_batch_shards == jax.device_count()
    config = _config(p_estimate="history")
    straight = _train(BanditTask(), _model(), config, tmp_path / "a", compiled, placement=placement)
    assert all(leaf.sharding.mesh == placement.mesh for leaf in jax.tree.leaves(straight.state))
    with pytest.raises(StopRequested):
        _train(BanditTask(), _model(), config, tmp_path / "b", compiled, placement=placement,
               allowance=StepAllowance(2))
    again = _train(BanditTask(), _model(), config, tmp_path / "b", compiled, placement=placement)
    assert [h["reward_mean"] for h in again.history] == [h["reward_mean"] for h in straight.history]
    np.testing.assert_allclose([h["loss"] for h in again.history], [h["loss"] for h in straight.history], rtol=1e-5)
    assert again.evaluations == straight.evaluations


def test_rows_that_do_not_split_over_the_data_shards_are_named(tmp_path):
    mesh = make_placement(default_mesh_config()).mesh
    config = _config(p_estimate="pilot")
    config.rl.update(prompts_per_step=3, rollouts_per_step=24)  # pilot: 3 * 2 = 6 rows over 8 shards
    with pytest.raises(ValueError, match=r"pilot_rollouts \* prompts_per_step=6 must be a multiple of the 8 data shards"):
        _train(BanditTask(), _model(), config, tmp_path, placement=Placement(mesh, (), ("data",)))


def test_response_logprobs_chunked_equal_the_full_sequence_log_probs():
    """Only the response positions are projected (in chunks under remat, or at once): the same values and
    gradients as slicing the full sequence's token log-probs, with left-padded prompts and short responses."""
    graphdef, params = nnx.split(_model(6))
    rng = np.random.default_rng(5)
    b, t, r = 5, 3, 7
    prompts = rng.integers(3, 16, (b, t))
    lengths = np.array([3, 2, 1, 3, 2])
    response = rng.integers(3, 16, (b, r))
    mask = np.arange(r)[None] < np.array([7, 1, 4, 0, 6])[:, None]
    batch = step_lib.sequence_batch(jnp.asarray(prompts), jnp.asarray(lengths), jnp.asarray(response),
                                    jnp.asarray(mask), jnp.ones((b, r)))
    model = nnx.merge(graphdef, params)
    reference = decoder.token_logprobs(model, batch.tokens_BxL, decoder.positions_from_valid(batch.valid_BxL),
                                       batch.valid_BxL)[:, t:]
    weights = jnp.asarray(rng.normal(size=(b, r)), jnp.float32)
    grads = {}
    for chunk in (0, 3, 7):
        got = jax.jit(lambda p: step_lib.response_logprobs(graphdef, p, batch, chunk))(params)
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
        assert np.all(np.asarray(got)[~mask] == 0.0)
        grads[chunk] = jax.jit(jax.grad(
            lambda p: jnp.sum(weights * step_lib.response_logprobs(graphdef, p, batch, chunk))))(params)
    for chunk in (3, 7):
        jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6), grads[0], grads[chunk])


# -- truthful scale-factor diagnostics ----------------------------------------------------------------------


def _log_beta(a, b):
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _rollouts(counts):
    ids = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    b = len(ids)
    sample = SampleOutput(jnp.zeros((b, 2), jnp.int32), jnp.ones((b, 2), bool), jnp.full(b, 2, jnp.int32),
                          jnp.ones(b, bool), jnp.zeros((b, 2)), jnp.zeros((b, 2)))
    return T.Rollouts(jnp.asarray(ids), sample, jnp.zeros(b, jnp.float32))


def test_step_metrics_log_the_posterior_expected_and_the_true_factors():
    """Pilot of n0 = 4 with 0, 2, 4 successes (Jeffreys: Beta(0.5 + k, 4.5 - k)) and N = (8, 3, 2): the
    estimate is E[1 - (1-p)^(N-1)] = 1 - B(a, b + N - 1)/B(a, b), not the factor at the posterior mean; the true
    factors are 1 - (1 - p)^(N-1) at the given p."""
    config = _config(p_estimate="pilot", pilot_rollouts=4)
    counts = np.array([8, 3, 2])
    k0 = np.array([0.0, 2.0, 4.0])
    posterior = core.pilot_posterior(jnp.asarray(k0), 4)
    estimate = T.Estimate(posterior.mean, posterior.mean, None, jnp.asarray(k0))
    true_p = np.array([0.01, 0.5, 0.9])
    m = T.step_metrics(config, _rollouts(counts), jnp.zeros(3), jnp.asarray(counts), estimate, posterior=posterior,
                       true_p_P=jnp.asarray(true_p))
    expected = np.array([1 - math.exp(_log_beta(0.5 + k, 4.5 - k + n - 1) - _log_beta(0.5 + k, 4.5 - k))
                         for k, n in zip(k0, counts)])
    true = 1 - (1 - true_p) ** (counts - 1)
    for name, values in (("scale_est", expected), ("scale_true", true)):
        np.testing.assert_allclose(float(m[f"{name}_min"]), values.min(), rtol=1e-5)
        np.testing.assert_allclose(float(m[f"{name}_max"]), values.max(), rtol=1e-5)
        np.testing.assert_allclose(float(m[f"{name}_mean"]), values.mean(), rtol=1e-5)
        np.testing.assert_allclose(float(m[f"{name}_cv"]), values.std() / values.mean(), rtol=1e-4)
    plug_in = 1 - (1 - np.asarray(posterior.mean)) ** (counts - 1)  # what was logged before: min 0.52, not 0.38
    assert float(m["scale_est_min"]) < plug_in.min() - 0.1
    assert not any(k.startswith("scale_") and not k.startswith(("scale_est_", "scale_true_")) for k in m)


@pytest.mark.parametrize("correction", [True, False])
def test_step_metrics_log_each_prompts_weight_relative_to_the_exact_objective(correction):
    """Oracle p = (0.05, 0.2, 0.5, 0.8) with N = (10, 3, 2, 1), N_bar 4: the factors are s_i = 1 - (1-p_i)^(N_i-1);
    corrected, each prompt's weight is s_i; uncorrected N_i s_i / 4 (the 10-rollout hard prompt weighs 2.5 times
    its s_i). Hard: the two lowest p; easy: the other two. The prompts are listed out of order of p."""
    order = np.array([2, 0, 3, 1])
    p, counts = np.array([0.05, 0.2, 0.5, 0.8])[order], np.array([10, 3, 2, 1])[order]
    config = _config(p_estimate="oracle", correction=correction)
    estimate = T.Estimate(jnp.asarray(p, jnp.float32), jnp.asarray(p, jnp.float32))
    m = T.step_metrics(config, _rollouts(counts), jnp.zeros(4), jnp.asarray(counts), estimate,
                       true_p_P=jnp.asarray(p, jnp.float32))
    s = 1 - (1 - p) ** (counts - 1)
    w = s if correction else counts * s / counts.mean()
    hard = np.isin(order, (0, 1))
    for prefix in ("weight_est", "weight_true"):
        np.testing.assert_allclose([float(m[f"{prefix}_{k}"]) for k in ("min", "max", "mean", "cv", "hard", "easy")],
                                   [w.min(), w.max(), w.mean(), w.std() / w.mean(), w[hard].mean(), w[~hard].mean()],
                                   rtol=1e-5)
    if not correction:  # the uncorrected tilt: the hard prompts' extra rollouts weigh them 1.6 times their s_i
        assert float(m["weight_true_hard"]) > 1.5 * s[hard].mean()
    assert "weight_est_min" not in T.step_metrics(_config(p_estimate="oracle", aggregation="token_mean"),
                                                  _rollouts(counts), jnp.zeros(4), jnp.asarray(counts), estimate)


@pytest.mark.parametrize("sera, has_estimate", [(dict(method="uniform"), False), (dict(p_estimate="pilot"), True),
                                                (dict(p_estimate="history"), True), (dict(p_estimate="oracle"), True)])
def test_rl_step_logs_estimated_and_true_factors(compiled, sera, has_estimate):
    """In the step: the bandit task knows p (0.3 for every prompt), so the true factors are 1 - 0.7^(N - 1);
    the history estimate of a fresh tracker is the default prior Beta(1, 1), so E[s] = 1 - 1/N; oracle: est = true."""
    task, config = BanditTask(), _config(**sera)
    graphdef, params = nnx.split(_model())
    tx, ctx = compiled.context(task, graphdef, config)
    _, m = T.rl_step(ctx, T.init_state(ctx, params, tx), task.train_prompts(0, 4), jax.random.key(0))
    lo, hi = int(m["counts_min"]), int(m["counts_max"])
    np.testing.assert_allclose([float(m["scale_true_min"]), float(m["scale_true_max"])],
                               [1 - 0.7 ** (lo - 1), 1 - 0.7 ** (hi - 1)], rtol=1e-5)
    assert ("scale_est_min" in m) == has_estimate
    if sera.get("p_estimate") == "history":
        np.testing.assert_allclose([float(m["scale_est_min"]), float(m["scale_est_max"])], [1 - 1 / lo, 1 - 1 / hi],
                                   rtol=1e-5)
    if sera.get("p_estimate") == "oracle":
        for k in ("min", "max", "mean", "cv"):
            np.testing.assert_allclose(float(m[f"scale_est_{k}"]), float(m[f"scale_true_{k}"]), rtol=1e-6)


class EvalRewardTask(BanditTask):
    """The bandit with non-binary rewards (``value`` where the answer is right): a task bug evaluation must name."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def rewards(self, prompts, prompt_ids_B, sample):
        r = super().rewards(prompts, prompt_ids_B, sample)
        r[0] = self.value  # one offending reward, the rest 0/1
        return r


@pytest.mark.parametrize("value", [0.5, float("nan")])
def test_evaluation_rewards_must_be_binary(compiled, value):
    """Before, 0.5 was rounded into a success count and NaN surfaced as an unrelated pass@k error."""
    task = EvalRewardTask(value)
    graphdef, params = nnx.split(_model(5))
    _, ctx = compiled.context(task, graphdef, _config(method="uniform"))
    message = rf"EvalRewardTask\.rewards\) must return 16 binary \(0/1\) rewards.*\[{value}\]"
    with pytest.raises(ValueError, match=message):
        T.evaluate(ctx, params, 0, 0)


@pytest.mark.parametrize("field,value,message", [
    ("rl.temperature", 0.7, "must be 1.0: the update trains on the policy's temperature-1"),
    ("rl.temperature", 0.0, "must be 1.0"), ("rl.temperature", float("nan"), "must be 1.0"),
    ("rl.top_p", 0.95, "must be 1.0: the update trains on the policy's temperature-1, full-vocabulary"),
    ("eval.temperature", 0.0, "must be a finite number > 0 \\(0 does not mean greedy"),
    ("eval.temperature", -1.0, "must be a finite number > 0"), ("eval.temperature", float("nan"), "finite"),
    ("eval.top_p", 0.0, "must be in \\(0, 1\\]"), ("eval.top_p", 1.5, "must be in \\(0, 1\\]")])
def test_sampling_fields_are_validated(field, value, message):
    c = _config()
    section, name = field.split(".")
    c[section][name] = value
    with pytest.raises(ValueError, match=rf"config\.{re.escape(field)}=.*{message}"):
        validate_rl_config(c, endless=False, knows_success_rates=True)


def test_evaluation_keeps_maxrls_released_sampling_settings():
    c = _config()
    c.eval.update(temperature=0.6, top_p=0.95)  # MaxRL's math evaluation; training stays at 1 / 1
    validate_rl_config(c, endless=False, knows_success_rates=True)


# -- the peers that sample in rounds, keep a subset, or select prompts ---------------------------------------


def _one_step(compiled, task, config, key=4, state_fn=None):
    graphdef, params = nnx.split(_model(7))
    tx, ctx = compiled.context(task, graphdef, config)
    calls = []
    sample_fn = ctx.sample_fn

    def recording_sample_fn(params, tokens, lengths, ids, *rest):
        calls.append(ids.shape[0])
        return sample_fn(params, tokens, lengths, ids, *rest)

    ctx = ctx.__class__(**{**ctx.__dict__, "sample_fn": recording_sample_fn})
    state = T.init_state(ctx, params, tx)
    if state_fn is not None:
        state = state_fn(state)
    prompts = task.train_prompts(0, T.prompts_fetched_per_step(config))
    new_state, metrics = T.rl_step(ctx, state, prompts, jax.random.key(key))
    return state, new_state, metrics, calls, prompts


def test_reinforce_ada_samples_in_rounds_that_spend_the_budget_and_share_the_rollouts(compiled):
    """Each round's rollouts per prompt are core.keep.reinforce_ada_round's of the rewards the earlier rounds
    drew (re-derived here from the recorded calls); every call has P * round_size rows (one compiled shape); the
    rounds spend exactly B; prompt i's rollout j is uniform's rollout j (common random numbers)."""
    config = _config(method="reinforce_ada", round_size=2, keep_per_prompt=2)
    task = RecordingTask()
    _, _, metrics, calls, _ = _one_step(compiled, task, config)
    counts, successes = jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.float32)
    for ids, tokens in task.calls:
        want = core.keep.reinforce_ada_round(counts, successes, 16 - int(counts.sum()), round_size=2, keep=2)
        np.testing.assert_array_equal(np.bincount(ids, minlength=4), np.asarray(want))
        rewards = (tokens[:, 0] == TARGETS[task.last_keys[ids]]).astype(np.float32)
        counts = counts + jnp.asarray(np.bincount(ids, minlength=4), jnp.int32)
        successes = successes + jnp.asarray(np.bincount(ids, weights=rewards, minlength=4), jnp.float32)
    assert int(counts.sum()) == 16 and metrics["rollouts_sampled"] == 16
    assert len(task.calls) == metrics["sampling_rounds"] >= 2  # several rounds: the check can fail
    assert set(calls) == {4 * 2}
    assert metrics["rollouts_trained"] == float(np.sum(np.minimum(np.asarray(counts), 2)))
    ada = np.concatenate([i for i, _ in task.calls]), np.concatenate([t for _, t in task.calls])
    uniform_task = RecordingTask()
    _one_step(compiled, uniform_task, _config(method="uniform"))
    uni = np.concatenate([i for i, _ in uniform_task.calls]), np.concatenate([t for _, t in uniform_task.calls])
    for i in range(4):
        a, u = ada[1][ada[0] == i], uni[1][uni[0] == i]
        common = min(len(a), len(u))
        np.testing.assert_array_equal(a[:common], u[:common])


@pytest.mark.parametrize("spend", [0, 17])
def test_a_round_rule_that_spends_nothing_or_past_the_budget_is_named(compiled, spend):
    """A round_fn (a user's allocator) that asks for no rollouts would loop forever, and one past the 16 left
    would overspend the budget: both are refused by the allocator's name before anything is sampled."""
    config = _config(method="reinforce_ada", round_size=2, keep_per_prompt=2)
    task = RecordingTask()
    graphdef, params = nnx.split(_model(7))
    _, ctx = compiled.context(task, graphdef, config)

    def bad_round(counts_P, successes_P, remaining, sera):
        return np.eye(4, dtype=np.int64)[0] * spend

    with pytest.raises(ValueError, match=rf"allocator 'reinforce_ada': a round must spend 1..16 rollouts, its "
                                         rf"round_fn gave {spend}"):
        T.sample_in_rounds(ctx, params, task.train_prompts(0, 4), jax.random.key(0), bad_round)
    assert task.calls == []


@pytest.mark.parametrize("method", ["mopps", "greso"])
def test_selection_peers_pick_their_prompts_from_the_candidates_by_their_rule(compiled, method):
    """The step trains on the P candidates core.selection picks (with the step key folded with the selection
    stream), from the history in the state; the history then changes at the selected prompts only."""
    config = _config(method=method, candidate_ratio=3, history_decay=1.0)
    task = RecordingTask()
    rng = np.random.default_rng(0)

    def with_history(state):  # a history that is not flat, so the selection has something to go on
        keys = jnp.arange(NUM_PROMPTS)
        tries = jnp.full(NUM_PROMPTS, 4.0)
        wins = jnp.asarray(rng.integers(0, 5, NUM_PROMPTS), jnp.float32)
        tracker = core.tracker_update(state.tracker, keys, wins, tries)
        skips = core.greso_update(state.skips, keys, wins, tries, epoch_started=False)
        return state._replace(tracker=tracker, skips=skips)

    state, new_state, _, _, candidates = _one_step(compiled, task, config, state_fn=with_history)
    key = jax.random.fold_in(jax.random.key(4), T.SELECTION_STREAM)
    keys_C = jnp.asarray(candidates.keys_P)
    if method == "mopps":
        want = core.selection.mopps_select(core.selection.mopps_posterior(state.tracker, keys_C), 4, key)
    else:
        want = core.selection.greso_select(state.skips, keys_C, 4, key)
    selected = np.asarray(candidates.keys_P)[np.asarray(want)]
    np.testing.assert_array_equal(task.last_keys, selected)
    changed = np.flatnonzero(np.asarray(new_state.tracker.successes + new_state.tracker.failures)
                             != np.asarray(state.tracker.successes + state.tracker.failures))
    np.testing.assert_array_equal(np.sort(changed), np.sort(selected))
    assert not set(selected) >= set(np.asarray(candidates.keys_P)[:4]) or method == "greso"  # not just the first


class AllFailTask(BanditTask):
    def rewards(self, prompts, prompt_ids_B, sample):
        return 0.0 * super().rewards(prompts, prompt_ids_B, sample)


def test_a_step_whose_train_mask_keeps_nothing_counts_but_does_not_update(compiled):
    """DAPO with every group all-0: nothing trains, so the parameters and AdamW's moments stay (its momentum would
    move them on a zero gradient), the step counts, and the metrics say so."""
    state, new_state, metrics, _, _ = _one_step(compiled, AllFailTask(), _config(method="dapo"))
    assert metrics["update_skipped"] == 1 and metrics["rollouts_trained"] == 0 and metrics["rollouts_sampled"] == 16
    assert int(new_state.step) == int(state.step) + 1
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((new_state.params,
                                                                                        new_state.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, moved, metrics, _, _ = _one_step(compiled, BanditTask(), _config(method="dapo"))
    assert metrics["update_skipped"] == 0 and metrics["rollouts_trained"] > 0
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(moved.params)))


def test_step_metrics_count_the_budget_in_rollouts_and_tokens(compiled):
    task = RecordingTask()
    _, _, metrics, _, _ = _one_step(compiled, task, _config(method="pods", keep_per_prompt=2))
    lengths = np.concatenate(task.lengths)
    assert lengths.sum() != lengths.size  # tokens, not rows
    assert metrics["rollouts_sampled"] == 16 and metrics["rollouts_trained"] == 8 and metrics["prompts_trained"] == 4
    assert float(metrics["tokens_sampled"]) == pytest.approx(float(lengths.sum()))
    assert float(metrics["tokens_trained"]) == pytest.approx(float(lengths.sum()) / 2)  # all of length 2 here


@pytest.mark.parametrize("sera, endless, message", [
    (dict(method="mopps"), True, "needs a finite training set"),
    (dict(method="greso", candidate_ratio=4), False, r"candidate_ratio=4: 16 candidates .* exceed the 12"),
    (dict(method="dars_et", p_estimate="history"), False, r"p_estimate='history'.*'dars_et'.*\['pilot'\]"),
    (dict(method="pods", keep_per_prompt=0), False, r"config\.sera\.keep_per_prompt"),
    (dict(method="reinforce_ada", round_size=0), False, r"config\.sera\.round_size"),
    (dict(method="mopps", candidate_ratio=2, target_rate=1.0), False, r"config\.sera\.target_rate"),
])
def test_peer_settings_are_validated(sera, endless, message):
    with pytest.raises(ValueError, match=message):
        validate_rl_config(_config(**sera), endless=endless, knows_success_rates=True,
                           num_train_prompts=None if endless else NUM_PROMPTS)


@pytest.mark.parametrize("sera, steps, refused", [
    (dict(method="sera", p_estimate="history"), 3, True),  # 3 x 4 prompts: the 12 once, none revisited
    (dict(method="sera", p_estimate="history"), 4, False),
    (dict(method="sera", p_estimate="history"), 0, False),  # no training: nothing to estimate
    (dict(method="sera", p_estimate="pilot"), 3, False),
    (dict(method="uniform", p_estimate="history"), 3, False),  # uniform reads no estimate
    (dict(method="mopps", candidate_ratio=3), 1, True),  # selection: 12 candidates a step
    (dict(method="mopps", candidate_ratio=3), 2, False),
])
def test_history_methods_need_a_run_that_revisits_prompts(sera, steps, refused):
    """A history estimate (or a selection peer's history) of a run that never visits a prompt twice would stay
    at its prior: refused, naming the fields, at the boundary where the first prompt recurs."""
    config = _config(**sera)
    config.rl.steps = steps
    check = lambda: validate_rl_config(config, endless=False, knows_success_rates=True, num_train_prompts=NUM_PROMPTS)
    if refused:
        with pytest.raises(ValueError, match=rf"rl\.steps={steps} .* from a training set of {NUM_PROMPTS}.*"
                                             "never revisits a prompt"):
            check()
    else:
        check()


def test_a_token_budget_step_spends_its_tokens_in_the_fixed_rows(compiled):
    """sera.budget='tokens': the counts are core.allocate_tokens' on the pilot's estimate and measured lengths
    (re-derived here from the recorded pilot call); the task scores just those rollouts (fewer than the rows); the
    update gets the fixed rows, padding weighing 0 and counting in no prompt's K_i or N_i, so its inputs equal
    those of the real rollouts alone; the rollouts are uniform's for every (prompt, rank) both hold."""
    config = _config(method="sera_all_active", budget="tokens", tokens_per_step=24, p_estimate="pilot",
                     pilot_rollouts=2)
    task = EvenTokenTask()
    graphdef, params = nnx.split(_model(7))
    tx, ctx = compiled.context(task, graphdef, config)
    update = ctx.update_fn
    seen = {}

    def recording_update(train, batch, adv):
        seen["batch"], seen["adv"] = batch, adv
        return update(train, batch, adv)

    ctx = ctx.__class__(**{**ctx.__dict__, "update_fn": recording_update})
    prompts = task.train_prompts(0, 4)
    _, metrics = T.rl_step(ctx, T.init_state(ctx, params, tx), prompts, jax.random.key(4))
    (pilot_ids, pilot_tokens), (main_ids, main_tokens) = task.calls
    pilot_lengths = task.lengths[0]
    wins = np.bincount(pilot_ids, weights=pilot_tokens[:, 0] % 2 == 0, minlength=4)
    costs = np.maximum(np.bincount(pilot_ids, weights=pilot_lengths, minlength=4) / 2, 1.0)
    want = core.allocate_tokens(core.pilot_posterior(jnp.asarray(wins), 2).mean, 24.0, jnp.asarray(costs), 16,
                                n_min=2, n_max=8)
    counts = np.bincount(np.concatenate([pilot_ids, main_ids]), minlength=4)
    np.testing.assert_array_equal(counts, np.asarray(want))
    assert counts.sum() < 16 and np.dot(counts, costs) <= 24  # rows to spare: padding in the update
    assert metrics["rollouts_sampled"] == counts.sum() and float(metrics["tokens_expected"]) <= 24
    ids = np.concatenate([pilot_ids, main_ids])
    rows = seen["batch"].rows
    assert rows.prompt_ids_B.shape == (16,)
    np.testing.assert_array_equal(np.asarray(rows.prompt_ids_B)[:ids.size], ids)
    assert np.all(np.asarray(rows.weights_BxR)[ids.size:] == 0)
    rewards = (np.concatenate([pilot_tokens, main_tokens])[:, 0] % 2 == 0).astype(np.float32)
    assert rewards[ids == 0].sum() > 0  # padding rows (of prompt 0) counted as failures would change its advantages
    np.testing.assert_allclose(np.asarray(seen["adv"])[:ids.size],
                               core.advantages(jnp.asarray(rewards), jnp.asarray(ids), 4, "maxrl"), rtol=1e-6)
    real_mask = np.asarray(rows.response_mask_BxR)[:ids.size]
    np.testing.assert_allclose(np.asarray(rows.weights_BxR)[:ids.size],
                               core.loss_weights(jnp.asarray(ids), 4, token_mask_BxR=jnp.asarray(real_mask),
                                                 aggregation=config.sera.aggregation, correction=True), rtol=1e-6)
    uniform_task = RecordingTask()
    _one_step(compiled, uniform_task, _config(method="uniform"))
    uni_ids = np.concatenate([i for i, _ in uniform_task.calls])
    uni_tokens = np.concatenate([t for _, t in uniform_task.calls])
    tokens = np.concatenate([pilot_tokens, main_tokens])
    for i in range(4):
        a, u = tokens[ids == i], uni_tokens[uni_ids == i]
        n = min(len(a), len(u))
        np.testing.assert_array_equal(a[:n], u[:n])


class EvenTokenTask(RecordingTask):
    """Reward 1 iff the answer token is even: about half the rollouts succeed, so every group has advantages."""

    def rewards(self, prompts, prompt_ids_B, sample):
        super().rewards(prompts, prompt_ids_B, sample)
        return (np.asarray(sample.tokens_BxR)[:, 0] % 2 == 0).astype(np.float32)


@pytest.mark.parametrize("sera, message", [
    (dict(method="uniform", budget="tokens", tokens_per_step=64), r"'uniform' has no token-budget form"),
    (dict(budget="tokens", tokens_per_step=64), r"'sera' has no token-budget form"),
    (dict(method="sera_all_active", budget="tokens", p_estimate="history", tokens_per_step=64),
     r"needs config\.sera\.p_estimate='pilot'"),
    (dict(method="sera_all_active", budget="tokens", tokens_per_step=8), r"config\.sera\.tokens_per_step.*>= 16"),
    (dict(use_posterior=True), r"'sera' allocates on point estimates"),
    (dict(activation_threshold=1.5), r"config\.sera\.activation_threshold"),
    (dict(epoch_discount=-0.1), r"config\.sera\.epoch_discount"),
    (dict(epoch_prior=(0.5, 0.0)), r"config\.sera\.epoch_prior"),
    (dict(budget="minutes"), r"config\.sera\.budget"),
])
def test_token_budget_settings_are_validated(sera, message):
    with pytest.raises(ValueError, match=message):
        validate_rl_config(_config(**sera), endless=False, knows_success_rates=True, num_train_prompts=NUM_PROMPTS,
                           max_new_tokens=2)


def test_greso_adapts_its_skip_probabilities_from_the_second_pass_over_the_training_set(compiled):
    """GRESO's code adapts p_easy / p_hard once epoch > 0: with 12 candidates a step over 12 prompts, step 0 is
    the first pass (both stay 0.5) and step 1 the second (each moves by 0.01)."""
    config = _config(method="greso", candidate_ratio=3)
    task = BanditTask()
    graphdef, params = nnx.split(_model(7))
    tx, ctx = compiled.context(task, graphdef, config)
    state = T.init_state(ctx, params, tx)
    probabilities = []
    for step in range(2):
        state, _ = T.rl_step(ctx, state, task.train_prompts(step, 12), jax.random.key(step))
        probabilities.append((float(state.skips.p_easy), float(state.skips.p_hard)))
    assert probabilities[0] == (0.5, 0.5)
    assert all(abs(abs(p - 0.5) - 0.01) < 1e-6 for p in probabilities[1])


@pytest.mark.parametrize("share_prompts", [True, False])
@pytest.mark.parametrize("estimator", ["maxrl", "grpo"])
def test_padding_rows_neither_weigh_nor_count_in_any_prompt(share_prompts, estimator):
    """A token budget's step scores fewer rows than the update's fixed shape and pads them with empty rows of
    prompt 0 (``pad_rollouts``): the real rows' advantages and weights equal those of the unpadded batch, and
    the padding weighs 0. Prompt 0 has successes and failures here, so counting the padding in its N_0 would
    change its advantages (the wiring test's coin flips rarely reward prompt 0)."""
    ids = jnp.array([0, 0, 0, 1, 1], jnp.int32)
    rewards = jnp.array([1.0, 0.0, 1.0, 0.0, 1.0])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    tokens = jnp.where(mask, 5, 0).astype(jnp.int32)
    zeros = jnp.zeros(mask.shape, jnp.float32)
    sample = SampleOutput(tokens, mask, mask.sum(1).astype(jnp.int32), jnp.ones(5, bool), zeros, zeros)
    real = T.Rollouts(ids, sample, rewards)
    padded = T.pad_rollouts(real, 8, pad_id=0)
    assert padded.prompt_ids_B.shape == (8,) and not bool(padded.sample.mask_BxR[5:].any())
    prompt_tokens, prompt_lengths = jnp.array([[1, 3], [1, 4]], jnp.int32), jnp.array([2, 2], jnp.int32)

    def inputs(r):
        batch, adv = T.policy_gradient_inputs(
            prompt_tokens, prompt_lengths, r.prompt_ids_B, r.sample.tokens_BxR, r.sample.mask_BxR, r.rewards_B,
            r.train_B, r.counted_B, estimator=estimator, aggregation="token_mean", correction=True,
            share_prompts=share_prompts)
        weights = batch.rows.weights_BxR if share_prompts else batch.weights_BxR
        return np.asarray(adv), np.asarray(weights)

    adv, weights = inputs(real)
    adv_padded, weights_padded = inputs(padded)
    assert np.abs(adv).max() > 0
    np.testing.assert_allclose(adv_padded[:5], adv, rtol=1e-6)
    np.testing.assert_allclose(weights_padded[:5], weights, rtol=1e-6)
    assert np.all(weights_padded[5:] == 0)
