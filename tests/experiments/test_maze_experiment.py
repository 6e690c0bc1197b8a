"""The maze experiment end to end on the tiny config: results layout, figures, resume, config errors, MaxRL's
settings, and the start from a Hugging Face checkpoint in MaxRL's ``maze/ckpt-1500`` layout."""

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.maze import config as config_lib
from experiments.maze import experiment as maze_main
from sera_jax.envs import maze
from sera_jax.models import decoder
from sera_jax.models import hf_loader
from sera_jax.rl.trainer import data_order


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("maze")
    config = config_lib.get_config("tiny")
    return workdir, config, maze_main.run(config, workdir)


def test_results_layout(tiny_run):
    workdir, config, _ = tiny_run
    saved = json.loads((workdir / "results.json").read_text())
    methods = saved["results"]["methods"]
    assert set(methods) == set(config.methods)
    for entry in methods.values():
        assert entry["train_rollouts"] == [config.rl.steps * config.rl.rollouts_per_step]
        # The rows really sampled at each step (pilot included), as the step's metrics count them.
        assert [h["rollouts_sampled"] for h in entry["history"][0]["steps"]] == [config.rl.rollouts_per_step] * 2
        pk = entry["pass_at_k"]
        assert pk["k"] == list(config.eval.ks) and len(pk["mean"]) == len(pk["k"])
        assert all(0.0 <= v <= 1.0 for v in pk["mean"])
        assert "ci95" in pk  # None with a single seed
        assert len(entry["history"][0]["steps"]) == config.rl.steps
    assert saved["config"]["maze"]["size"] == config.maze.size
    assert (workdir / "pass_at_k.png").exists() and (workdir / "neg_log_pass_at_k.png").exists()


def test_rerun_resumes_instead_of_retraining(tiny_run):
    workdir, config, first = tiny_run
    again = maze_main.run(config, workdir)  # everything is checkpointed: nothing left to train
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert again["methods"][method]["history"] == first["methods"][method]["history"]


def test_a_killed_run_resumes_to_the_uninterrupted_result(tiny_run, tmp_path):
    _, config, first = tiny_run
    workdir = tmp_path / "killed"
    assert maze_main.run(config, workdir, stop_after=config.sft.steps + 1) is None  # mid-way through RL
    assert not (workdir / "results.json").exists()
    again = maze_main.run(config, workdir)
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert [h["loss"] for h in again["methods"][method]["history"][0]["steps"]] == \
            [h["loss"] for h in first["methods"][method]["history"][0]["steps"]]


def test_a_rerun_with_fewer_methods_or_steps_keeps_every_result(tiny_run, tmp_path):
    """Fewer methods: the others' results stay in results.json; fewer rl.steps than the checkpoints: refused."""
    import shutil

    workdir, config, first = tiny_run
    workdir = shutil.copytree(workdir, tmp_path / "w")
    config = copy.deepcopy(config)
    with config.unlocked():
        config.methods = ("sera",)
    again = maze_main.run(config, workdir)  # finished runs: restored, nothing retrained
    saved = json.loads((workdir / "results.json").read_text())["results"]
    assert saved["kept_from_earlier_invocations"] == ["uniform/0"]
    assert saved["methods"] == json.loads(json.dumps(first["methods"]))
    assert again["paired_vs_uniform"] == first["paired_vs_uniform"]
    with config.unlocked():
        config.rl.steps -= 1
    with pytest.raises(ValueError, match=rf"config\.rl\.steps={config.rl.steps}, but .* after {config.rl.steps + 1} "):
        maze_main.run(config, workdir)
    assert json.loads((workdir / "results.json").read_text())["results"]["methods"] == saved["methods"]


def test_unknown_method_is_named(tmp_path):
    config = config_lib.get_config("tiny")
    with config.unlocked():
        config.methods = ("uniform", "ppo")
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        maze_main.run(config, tmp_path)


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="unknown variant 'huge'"):
        config_lib.get_config("huge")


def _snapshot(root):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_rerun_with_another_config_is_refused_and_changes_nothing(tiny_run):
    workdir, config, _ = tiny_run
    before = _snapshot(workdir)
    other = config_lib.get_config("tiny")
    other.model.ffn_dim = 64
    other.rl.learning_rate = 1e-3
    with pytest.raises(ValueError, match=r"(?s)different config.*model\.ffn_dim: workdir=32, now=64.*"
                                         r"rl\.learning_rate: workdir=0\.0003, now=0\.001"):
        maze_main.run(other, workdir)
    assert _snapshot(workdir) == before


def test_rerun_with_another_weight_decay_is_refused(tiny_run):
    workdir, _, _ = tiny_run
    other = config_lib.get_config("tiny")
    other.rl.weight_decay = 0.1
    with pytest.raises(ValueError, match=r"(?s)different config.*rl\.weight_decay: workdir=0\.01, now=0\.1"):
        maze_main.run(other, workdir)


def test_rows_that_do_not_split_over_the_devices_fail_before_any_work(tmp_path):
    import jax

    config = config_lib.get_config("tiny")
    config.eval.max_rollouts_per_call = 12  # 3 mazes x 4 samples per call
    if jax.device_count() % 4 == 0:  # the suite runs on 8 CPU devices (tests/conftest.py)
        with pytest.raises(ValueError, match=r"eval\.samples_per_prompt \(rows per call\)=12 must be a multiple"):
            maze_main.run(config, tmp_path / "w")
        assert not (tmp_path / "w").exists()


def test_configs_carry_maxrls_settings():
    for variant in ("tiny", "cpu", "gpu"):
        c = config_lib.get_config(variant)
        assert c.model.rope_theta == 1e6 and c.rl.weight_decay == 0.01 and c.sft.weight_decay == 0.01
        assert (c.rl.b1, c.rl.b2, c.sft.b1, c.sft.b2) == (0.9, 0.999, 0.9, 0.95)
        assert c.sera.aggregation == "token_mean"
    gpu = config_lib.get_config("gpu")
    assert (gpu.sft.schedule, gpu.sft.warmup_steps, gpu.sft.learning_rate, gpu.rl.learning_rate) == \
        ("constant", 0, 5e-4, 1e-4)
    assert maze_main.MazeTask.response_cap(gpu) == 180 and maze_main.sequence_length(gpu) == 310 + 180
    # MaxRL runs verl's batch token-mean; SERA its multiplicity-corrected counterpart.
    assert config_lib.METHODS["uniform"]["correction"] is False and config_lib.METHODS["grpo"]["correction"] is False
    assert config_lib.METHODS["sera"]["correction"] is True
    assert config_lib.METHODS["sera_no_correction"]["correction"] is False


def test_seeds_differ_in_data_order_and_methods_share_it():
    task = maze_main.MazeTask(7, 8, seed=3)
    config = config_lib.get_config("tiny")
    assert config.rl.data_order == "seed"
    by_seed = {seed: data_order(task, config, seed)(2, 4).payload for seed in (0, 1, 2)}
    np.testing.assert_array_equal(by_seed[0], task.train_prompts(2, 4).payload)  # order 0: the task's own
    np.testing.assert_array_equal(by_seed[1], data_order(task, config, 1)(2, 4).payload)  # a pure function
    assert not np.array_equal(by_seed[0], by_seed[1]) and not np.array_equal(by_seed[1], by_seed[2])
    heldout = set(maze.fingerprints(task.heldout))
    for grids in by_seed.values():
        assert not heldout & set(maze.fingerprints(grids))
    with config.unlocked():
        config.rl.data_order = "fixed"
    np.testing.assert_array_equal(data_order(task, config, 2)(2, 4).payload, by_seed[0])


def test_data_order_seed_needs_a_task_that_reorders():
    class FixedOrderTask:
        def train_prompts(self, step, num):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="data_order='seed'.*FixedOrderTask"):
        data_order(FixedOrderTask(), config_lib.get_config("tiny"), 1)


def test_tiny_model_gets_maxrls_rope_theta():
    model = maze_main.build_model(config_lib.get_config("tiny"), 0)
    assert model.cfg.rope_theta == 1e6 and model.cfg.max_seq_len == maze.prompt_length(5) + maze.response_length(5)


# MaxRL's maze/ckpt-1500/config.json fields that save_hf_checkpoint does not write itself.
MAXRL_CONFIG_EXTRAS = dict(architectures=["Qwen2ForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
                           pad_token_id=0, dtype="bfloat16", torch_dtype="bfloat16", hidden_act="silu",
                           max_window_layers=4, rope_scaling=None, sliding_window=None, use_sliding_window=False,
                           use_cache=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=512)


def write_maxrl_style_checkpoint(directory, seed=3):
    """A tiny random qwen2 policy over the 32-id vocabulary in the layout of MaxRL's ``maze/ckpt-1500``:
    config.json (with MaxRL's extra fields), bfloat16 model.safetensors, tokenizer.json, generation_config.json.
    Returns the model with its weights rounded to bfloat16 (what the checkpoint holds)."""
    cfg = decoder.tiny(vocab_size=maze.VOCAB_SIZE, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                       rope_theta=1e6, max_seq_len=512)
    model = decoder.random_decoder(cfg, seed)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), nnx.state(model, nnx.Param)))
    hf_loader.save_hf_checkpoint(model, directory, "qwen2", dtype="bfloat16")
    hf = json.loads((directory / "config.json").read_text())
    hf.update(MAXRL_CONFIG_EXTRAS, layer_types=["full_attention"] * cfg.n_layers)
    (directory / "config.json").write_text(json.dumps(hf))
    (directory / "tokenizer.json").write_text(json.dumps(maze.tokenizer_json()))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7],
                                                                  "pad_token_id": 0}))
    return model


def test_init_dir_loads_a_maxrl_layout_checkpoint(tmp_path):
    saved = write_maxrl_style_checkpoint(tmp_path)
    config = config_lib.get_config("tiny")
    config.model.init_dir = str(tmp_path)
    model = maze_main.build_model(config, seed=0)
    assert model.cfg.rope_theta == 1e6 and model.cfg.d_model == 16 and model.cfg.max_seq_len == 512
    for (path, want), (_, got) in zip(nnx.to_flat_state(nnx.state(saved, nnx.Param)),
                                      nnx.to_flat_state(nnx.state(model, nnx.Param))):
        assert got.get_value().dtype == jnp.float32
        np.testing.assert_array_equal(got.get_value(), want.get_value(), err_msg=str(path))
    # The same logits on a maze prompt as the model that was saved.
    prompt = maze.render_prompts(maze.make_heldout_set(5, 1))
    np.testing.assert_allclose(model(prompt), saved(prompt), atol=1e-5)


def test_init_dir_refuses_another_vocabulary_or_missing_files(tmp_path):
    write_maxrl_style_checkpoint(tmp_path)
    config = config_lib.get_config("tiny")
    config.model.init_dir = str(tmp_path)
    tok = maze.tokenizer_json()
    tok["model"]["vocab"]["UP"], tok["model"]["vocab"]["DOWN"] = 14, 13
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match=r"config\.model\.init_dir=.*'UP': 14 \(expected 13\)"):
        maze_main.build_model(config, 0)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        maze_main.build_model(config, 0)
    config.model.init_dir = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        maze_main.build_model(config, 0)


def test_init_dir_skips_sft(tmp_path):
    ckpt = tmp_path / "ckpt-1500"
    write_maxrl_style_checkpoint(ckpt)
    config = config_lib.get_config("tiny")
    config.model.init_dir = str(ckpt)
    assert config.sft.steps > 0
    assert maze_main.start_config(config).sft.steps == 0 and config.sft.steps > 0  # the caller's config is kept
    workdir = tmp_path / "run"
    # One optimizer step: with SFT skipped it is the first RL step of the first method.
    assert maze_main.run(config, workdir, stop_after=1) is None
    assert not (workdir / "seed_0" / "sft").exists() and not (workdir / "sft").exists()
    assert (workdir / "seed_0" / config.methods[0]).is_dir()


def test_the_declared_budgets_differ_in_rollouts_only():
    """cpu / cpu_n32 / cpu_n64 are one declared comparison at three budgets: only N_bar and what scales with it."""
    scaled = {"rl.rollouts_per_step", "sera.n_max", "sera.tokens_per_step"}

    def flat(variant):
        c = config_lib.get_config(variant).to_dict()
        return {f"{group}.{k}": v for group, fields in c.items() if isinstance(fields, dict) for k, v in fields.items()}

    base = flat("cpu")
    for variant, n_bar in (("cpu_n32", 32), ("cpu_n64", 64)):
        other = flat(variant)
        assert {k for k in base if base[k] != other[k]} == scaled, variant
        c = config_lib.get_config(variant)
        assert (c.rl.rollouts_per_step, c.sera.n_max, c.sera.tokens_per_step) == (8 * n_bar, 8 * n_bar, 2_200 * n_bar // 16)
        assert c.seeds == tuple(range(16)) and c.methods == config_lib.get_config("cpu").methods


# -- a fixed training set (config.maze.num_train > 0) ----------------------------------------------------------

NUM_TRAIN = 12


@pytest.fixture(scope="module")
def fixed_task():
    return maze_main.MazeTask(7, 8, seed=3, num_train=NUM_TRAIN)


def _keys_and_grids(task, steps, num, order):
    batches = [task.train_prompts(step, num, order=order) for step in steps]
    return np.concatenate([b.keys_P for b in batches]), np.concatenate([b.payload for b in batches])


def test_fixed_set_is_the_streams_first_mazes_for_every_order(fixed_task):
    exclude = set(maze.fingerprints(maze.make_heldout_set(7, 8, seed=3)))
    want, _ = maze.make_train_mazes(7, 0, NUM_TRAIN, exclude, seed=3)  # the endless stream's first 12 (order 0)
    np.testing.assert_array_equal(fixed_task.train_set, want)
    assert fixed_task.num_train_prompts == NUM_TRAIN
    assert not exclude & set(maze.fingerprints(fixed_task.train_set))  # held-out mazes never train
    epochs = {}
    for order in (0, 1, 5):
        keys, grids = _keys_and_grids(fixed_task, range(3 * 3), 4, order)  # 3 epochs of 3 steps
        assert keys.min() >= 0 and keys.max() < NUM_TRAIN
        np.testing.assert_array_equal(grids, want[keys])  # each maze is shown under its own key
        epochs[order] = keys.reshape(3, NUM_TRAIN)
        for epoch_keys in epochs[order]:  # each epoch visits every maze of the set exactly once
            assert sorted(epoch_keys.tolist()) == list(range(NUM_TRAIN))
        assert not np.array_equal(epochs[order][0], epochs[order][1])  # a new permutation each epoch
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[5])  # orders differ
    np.testing.assert_array_equal(_keys_and_grids(fixed_task, [4], 4, 1)[0], epochs[1][1, 4:8])  # a pure function
    # A task built again (another run, a resume) holds the same set and orders.
    again = maze_main.MazeTask(7, 8, seed=3, num_train=NUM_TRAIN)
    np.testing.assert_array_equal(again.train_prompts(7, 4, order=5).payload, want[epochs[5][2, 4:8]])


def test_fixed_set_skips_an_epochs_remainder_as_the_math_task(fixed_task):
    """M = 12, 5 a step: 2 steps an epoch, the last 12 % 5 = 2 mazes of each epoch's permutation skipped."""
    seen = set()
    for epoch in range(8):
        keys, _ = _keys_and_grids(fixed_task, (2 * epoch, 2 * epoch + 1), 5, 2)
        np.testing.assert_array_equal(keys, fixed_task.epoch_order(epoch, 2)[:10])
        assert len(set(keys.tolist())) == 10
        seen |= set(keys.tolist())
    assert seen == set(range(NUM_TRAIN))  # the skipped ones change with the epoch
    one_step = [fixed_task.train_prompts(s, NUM_TRAIN, order=0).keys_P for s in range(2)]  # num = M: one step an epoch
    assert [sorted(k.tolist()) for k in one_step] == [list(range(NUM_TRAIN))] * 2


def test_fixed_set_refuses_more_prompts_a_step_than_it_holds(fixed_task):
    for num in (0, NUM_TRAIN + 1):
        with pytest.raises(ValueError, match=r"config\.rl\.prompts_per_step=.*config\.maze\.num_train=12"):
            fixed_task.train_prompts(0, num)


def test_endless_default_draws_the_same_mazes_as_before():
    task = maze_main.MazeTask(7, 8, seed=3)  # num_train = 0
    assert task.num_train_prompts is None and task.train_set is None
    exclude = set(maze.fingerprints(maze.make_heldout_set(7, 8, seed=3)))
    for order in (0, 2):
        seed = 3 if order == 0 else task.stream_seed(order)
        want, _ = maze.make_train_mazes(7, 2 * 4, 4, exclude, seed=seed)  # step 2 of 4 a step: mazes 8..11
        got = task.train_prompts(2, 4, order=order)
        assert maze.fingerprints(got.payload) == maze.fingerprints(want)
        np.testing.assert_array_equal(got.keys_P, np.arange(8, 12))
    for variant in ("tiny", "demo", "cpu", "gpu"):
        assert config_lib.get_config(variant).maze.num_train == 0


@pytest.mark.parametrize("num_train", [-1, True])  # ConfigDict itself refuses a float or a str for the int field
def test_bad_num_train_is_named_before_any_work(tmp_path, num_train):
    config = config_lib.get_config("tiny")
    config.maze.num_train = num_train
    with pytest.raises(ValueError, match=rf"config\.maze\.num_train={num_train}: must be an int >= 0"):
        maze_main.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("num_train", [-1, 2.0, True, "8", None])
def test_task_refuses_a_bad_num_train(num_train):
    with pytest.raises(ValueError, match=r"config\.maze\.num_train=.*: must be an int >= 0"):
        maze_main.MazeTask(5, 2, num_train=num_train)


def test_num_train_below_prompts_per_step_is_named_before_any_work(tmp_path):
    config = config_lib.get_config("tiny")
    config.maze.num_train = config.rl.prompts_per_step - 1
    with pytest.raises(ValueError, match=r"config\.rl\.prompts_per_step=4 must be in \[1, 3\] "
                                         r"\(config\.maze\.num_train=3"):
        maze_main.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_history_estimates_need_a_fixed_set(tmp_path):
    config = config_lib.get_config("tiny")
    config.sera.p_estimate = "history"
    with pytest.raises(ValueError, match="p_estimate='history' needs a finite training set"):
        maze_main.run(config, tmp_path / "w")  # maze.num_train = 0: the endless stream
    config.maze.num_train = 8
    with pytest.raises(ValueError, match=r"fetches 8 prompts .* training set of 8, so it never revisits"):
        maze_main.run(config, tmp_path / "w")  # 2 steps x 4 prompts: one epoch, nothing recurs


def test_released_sera_on_a_fixed_set_skips_prompts_end_to_end(tmp_path):
    """The authors' regime at tiny scale: 8 training mazes, their frozen per-epoch estimates, the released rule.
    Steps 0-1 (epoch 0) are uniform for lack of estimates; at step 2, with the activation threshold at 0.99, only
    ceil(16 / 8) = 2 mazes are active and two get no rollouts, with the budget sampled exactly and finite
    metrics."""
    config = config_lib.get_config("tiny")
    config.maze.num_train = 8
    config.sera.update(p_estimate="epoch_history", activation_threshold=0.99)
    config.rl.steps = 3
    config.methods = ("sera",)
    config.sft.steps = 0
    steps = maze_main.run(config, tmp_path / "w")["methods"]["sera"]["history"][0]["steps"]
    assert [s["cold_start"] for s in steps] == [1.0, 1.0, 0.0]
    assert steps[2]["active_frac"] == 0.5 and steps[2]["counts_min"] == 0 and steps[2]["waterline_tau"] > 0
    assert all(s["rollouts_sampled"] == config.rl.rollouts_per_step for s in steps)
    assert all(np.isfinite(v) for s in steps for v in s.values() if isinstance(v, float))


def test_tiny_run_on_a_fixed_set_with_history_estimates(tmp_path, monkeypatch):
    """maze.num_train = 8, 4 prompts a step, 3 steps: step 2 starts the second epoch, so its mazes recur and
    SERA's history tracker holds the counts of every rollout of the first epoch under the set's keys."""
    from sera_jax.rl import trainer as T

    config = config_lib.get_config("tiny")
    config.maze.num_train = 8
    config.sera.p_estimate = "history"
    config.rl.steps = 3
    config.methods = ("sera",)
    config.sft.steps = 0  # RL from the untrained policy: the run is about the data, not the start
    fetched, states = [], []
    update_tracker = T.update_tracker
    monkeypatch.setattr(T, "update_tracker", lambda ctx, state, prompts, *a: fetched.append(prompts.keys_P) or
                        states.append(update_tracker(ctx, state, prompts, *a)) or states[-1])
    results = maze_main.run(config, tmp_path / "w")
    history = results["methods"]["sera"]["history"][0]["steps"]
    assert len(history) == 3 and all(np.isfinite(h["loss"]) for h in history)
    assert [sorted(np.concatenate(fetched[:2]).tolist())] == [list(range(8))]  # epoch 0 visits each maze once
    assert set(fetched[2].tolist()) <= set(range(8))  # step 2: mazes seen in epoch 0
    # After epoch 0 the tracker holds every rollout of its 2 steps under the mazes' keys, each maze's own.
    counts = np.asarray(states[1].tracker.successes) + np.asarray(states[1].tracker.failures)
    assert counts.shape == (8,) and (counts >= config.sera.n_min).all()
    np.testing.assert_allclose(counts.sum(), 2 * config.rl.rollouts_per_step)
    saved = json.loads((tmp_path / "w" / "results.json").read_text())
    assert saved["config"]["maze"]["num_train"] == 8
