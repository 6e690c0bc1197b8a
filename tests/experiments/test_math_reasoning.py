"""The math-reasoning experiment: rewards against the grader, prompt layout, the tiny config end to end, resume."""

import csv
import json
import shutil

import numpy as np
import pytest

from experiments.math_reasoning import config as config_lib
from experiments.math_reasoning import main as main_lib
from experiments.math_reasoning.task import MathTask, build_tokenizer, make_task
from sera_jax.envs import math_grading
from sera_jax.rl import step as step_lib
from sera_jax.rl.sampler import SampleOutput
from sera_jax.rl import trainer as trainer_lib


@pytest.fixture(scope="module")
def tiny_task() -> MathTask:
    config = config_lib.get_config("tiny")
    return make_task(config, build_tokenizer(config))


def _samples(task: MathTask, token_rows: list[list[int]], n: int) -> SampleOutput:
    """A SampleOutput holding hand-made responses, laid out as the sampler does (PAD after the end)."""
    tokens = np.full((len(token_rows), n), task.pad_id, np.int32)
    for b, row in enumerate(token_rows):
        tokens[b, :len(row)] = row
    lengths = np.array([len(r) for r in token_rows], np.int32)
    finished = np.array([bool(r) and r[-1] in task.stop_tokens for r in token_rows])
    mask = np.arange(n)[None, :] < lengths[:, None]
    zeros = np.zeros((len(token_rows), n), np.float32)
    return SampleOutput(tokens, mask, lengths, finished, zeros, zeros)


def test_rewards_agree_with_the_grader(tiny_task):
    task, tok = tiny_task, tiny_task.tokenizer
    prompts = task.train_prompts(0, 4)
    answer = int(prompts.payload[0])
    n = task.max_new_tokens
    texts = [f"{answer - 1} + 1 = {answer}. The answer is \\boxed{{{answer}}}.",  # right
             f"The answer is \\boxed{{{answer + 1}}}.",  # wrong
             f"The answer is {answer}.",  # no box: MaxRL's rule reads the whole response
             f"So \\boxed{{{answer}}}",  # right, terse
             f"\\boxed{{{answer}}}" + " 1" * n]  # right box but cut before the stop token: truncated
    rows = [tok.encode(t) + [tok.eos_id] for t in texts[:4]] + [tok.encode(texts[4])[:n]]
    assert len(rows[4]) == n and tok.eos_id not in rows[4]
    sample = _samples(task, rows, n)
    rewards = task.rewards(prompts, np.zeros(len(rows), np.int64), sample)
    np.testing.assert_array_equal(rewards, [1, 0, 1, 1, 0])
    truncated = [False, False, False, False, True]
    expected = [math_grading.grade(t, str(answer), cut) for t, cut in zip(texts, truncated)]
    np.testing.assert_array_equal(rewards, expected)
    # Each rollout is graded against its own prompt's answer.
    other = next(j for j in range(1, 4) if prompts.payload[j] not in (str(answer), str(answer + 1)))
    np.testing.assert_array_equal(task.rewards(prompts, np.full(len(rows), other), sample), [0, 0, 0, 0, 0])


def test_truncation_comes_from_the_sampler(tiny_task):
    """A row the sampler did not finish (``finished_B`` False: cut at the length limit) scores 0, whatever it says."""
    task, tok = tiny_task, tiny_task.tokenizer
    prompts = task.train_prompts(0, 4)
    answer = int(prompts.payload[0])
    rows = [tok.encode(f"\\boxed{{{answer}}}") + [tok.eos_id]] * 2
    sample = _samples(task, rows, task.max_new_tokens)
    sample = sample._replace(finished_B=np.array([True, False]))
    np.testing.assert_array_equal(task.rewards(prompts, np.zeros(2, np.int64), sample), [1, 0])


def test_configs_grade_as_maxrl_does():
    for variant in config_lib.VARIANTS:
        c = config_lib.get_config(variant)
        assert c.grading.rule == "maxrl" and c.grading.timeout_s > 0
        assert c.sera.aggregation == "token_mean"
        assert c.grading.backend == ("math_verify" if variant in ("gpu", "full") else "builtin")
    assert config_lib.get_config("gpu").rl.weight_decay == 0.01
    assert config_lib.METHODS["uniform"]["correction"] is False and config_lib.METHODS["sera"]["correction"] is True
    config = config_lib.get_config("tiny")
    config.grading.rule = "lenient"
    with pytest.raises(ValueError, match="config.grading"):
        make_task(config, build_tokenizer(config))
    config = config_lib.get_config("tiny")
    config.grading.timeout_s = 0
    with pytest.raises(ValueError, match="config.grading.timeout_s"):
        make_task(config, build_tokenizer(config))


def test_prompts_are_left_padded_with_lengths(tiny_task):
    task, tok = tiny_task, tiny_task.tokenizer
    steps_per_epoch = task.num_train_prompts // 4
    seen = []
    for step in range(steps_per_epoch):
        batch = task.train_prompts(step, 4)
        t = batch.tokens_PxT.shape[1]
        assert batch.tokens_PxT.shape == (4, task.prompt_len) and batch.tokens_PxT.dtype == np.int32
        assert len(set(batch.keys_P.tolist())) == 4  # the history tracker needs distinct keys per step
        for i, key in enumerate(batch.keys_P):
            record = task.train.records[key]
            ids = tok.encode(task.render(record["question"]))
            n = batch.lengths_P[i]
            assert n == len(ids)
            np.testing.assert_array_equal(batch.tokens_PxT[i, t - n:], ids)
            assert np.all(batch.tokens_PxT[i, :t - n] == task.pad_id)
            assert ids[0] == tok.bos_id and tok.decode([ids[-1]], skip_special_tokens=False) == "<|assistant|>"
            assert batch.payload[i] == str(record["answer"])
        seen += batch.keys_P.tolist()
    assert sorted(seen) == list(range(task.num_train_prompts))  # one epoch visits every prompt once
    assert not np.array_equal(task.epoch_order(0), task.epoch_order(1))


def test_data_orders_are_permutations_of_the_same_epochs(tiny_task):
    task = tiny_task
    steps_per_epoch = task.num_train_prompts // 4
    for order in (0, 3):
        keys = [task.train_prompts(step, 4, order=order).keys_P for step in range(steps_per_epoch)]
        assert sorted(np.concatenate(keys).tolist()) == list(range(task.num_train_prompts))
    np.testing.assert_array_equal(task.train_prompts(1, 4, order=0).keys_P, task.train_prompts(1, 4).keys_P)
    assert not np.array_equal(task.epoch_order(0, 3), task.epoch_order(0, 0))
    assert not np.array_equal(task.epoch_order(0, 3), task.epoch_order(0, 4))
    with pytest.raises(ValueError, match="order=-1"):
        task.train_prompts(0, 4, order=-1)
    eval_batch = task.eval_prompts()
    assert eval_batch.tokens_PxT.shape[1] == task.prompt_len
    assert not {r["question"] for r in task.train.records} & {r["question"] for r in task.eval.records}
    assert not {r["question"] for r in task.train.records} & {r["question"] for r in task.sft.records}


def test_sft_batches_end_with_the_stop_token(tiny_task):
    task, tok = tiny_task, tiny_task.tokenizer
    batch = task.sft_batch(0, 8)
    for i in range(8):
        n = batch.answer_lengths_B[i]
        answer = batch.answer_tokens_BxR[i, :n]
        assert answer[-1] == tok.eos_id and np.all(batch.answer_tokens_BxR[i, n:] == task.pad_id)
        assert "\\boxed{" in tok.decode(answer)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("math_tiny")
    config = config_lib.get_config("tiny")
    return workdir, config, main_lib.run(config, workdir)


def test_tiny_config_runs_end_to_end(tiny_run):
    workdir, config, _ = tiny_run
    payload = json.loads((workdir / "results.json").read_text())
    methods = payload["results"]["methods"]
    assert set(methods) == {"uniform", "sera"}
    budget = config.rl.steps * config.rl.rollouts_per_step
    for entry in methods.values():
        assert entry["train_rollouts"] == [budget] * len(config.seeds)  # matched training rollouts
        for run in entry["history"]:  # ... as sampled: the rows of every step (the step's own count)
            assert [h["rollouts_sampled"] for h in run["steps"]] == [config.rl.rollouts_per_step] * config.rl.steps
        pk = entry["pass_at_k"]
        assert pk["k"] == list(config.eval.ks)
        assert len(pk["mean"]) == len(pk["ci95"]) == len(pk["k"])
        assert all(0.0 <= v <= 1.0 for v in pk["mean"])
        assert pk["mean"] == sorted(pk["mean"])  # pass@k grows with k
    assert payload["config"]["variant"] == "tiny"
    assert payload["results"]["task"]["grading"] == {**config.grading.to_dict(), "timeouts": 0}
    profile = payload["results"]["start_profile"]["0"]
    assert sum(profile["histogram"]) == 8 and profile["samples_per_prompt"] == 4
    for name in ("pass_at_k.png", "neg_log_pass_at_k.png", "start_success_rates.png"):
        assert (workdir / name).stat().st_size > 0
    for seed in config.seeds:
        for method in config.methods:
            with open(workdir / f"seed_{seed}" / method / "metrics.csv") as f:
                rows = list(csv.DictReader(f))
            assert [int(r["step"]) for r in rows if r["reward_mean"]] == list(range(config.rl.steps))
            assert any(r["eval/pass@1"] for r in rows)


def test_resume_continues_instead_of_restarting(tiny_run, tmp_path, monkeypatch):
    source, config, first = tiny_run
    workdir = tmp_path / "run"
    shutil.copytree(source, workdir)
    rl_steps, sft_steps = [], []
    rl_step, make_sft_step = trainer_lib.rl_step, step_lib.make_sft_step

    def counting_sft_step(*args):
        sft = make_sft_step(*args)
        return lambda *a: sft_steps.append(1) or sft(*a)

    monkeypatch.setattr(trainer_lib, "rl_step", lambda ctx, state, *a: rl_steps.append(int(state.step))
                        or rl_step(ctx, state, *a))
    monkeypatch.setattr(step_lib, "make_sft_step", counting_sft_step)

    again = main_lib.run(config, workdir)  # finished: nothing is redone
    assert rl_steps == [] and sft_steps == []
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert again["methods"][method]["history"] == first["methods"][method]["history"]

    longer = config_lib.get_config("tiny")
    longer.rl.steps = config.rl.steps + 1
    more = main_lib.run(longer, workdir)  # one more step per run, from the saved state
    assert rl_steps == [config.rl.steps] * len(config.seeds) * len(config.methods) and sft_steps == []
    for method in config.methods:
        for before, after in zip(first["methods"][method]["history"], more["methods"][method]["history"]):
            assert after["steps"][:config.rl.steps] == before["steps"]
            assert len(after["steps"]) == config.rl.steps + 1
        budget = (config.rl.steps + 1) * config.rl.rollouts_per_step
        assert more["methods"][method]["train_rollouts"] == [budget] * len(config.seeds)


def test_rerun_with_another_weight_decay_is_refused_and_changes_nothing(tiny_run):
    workdir, _, _ = tiny_run
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    other = config_lib.get_config("tiny")
    other.rl.weight_decay = 0.1
    with pytest.raises(ValueError, match=r"(?s)different config.*rl\.weight_decay: workdir=0\.0, now=0\.1"):
        main_lib.run(other, workdir)
    assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()} == before


def test_pretrained_configs_name_missing_files(tmp_path, tiny_task):
    for variant in ("gpu", "full"):
        config = config_lib.get_config(variant)
        config.model.dir = str(tmp_path / "no_model")
        with pytest.raises(FileNotFoundError, match="config.model.dir") as e:
            main_lib.run(config, tmp_path / variant)
        assert f"huggingface-cli download {config.model.hf_repo} --repo-type model" in str(e.value)
    # With a tokenizer in place, the missing dataset is named next.
    tiny_task.tokenizer.save(tmp_path / "model")
    config = config_lib.get_config("gpu")
    config.model.dir = str(tmp_path / "model")
    config.data.dir = str(tmp_path / "no_data")
    with pytest.raises(FileNotFoundError, match="config.data.dir") as e:
        main_lib.run(config, tmp_path / "gpu")
    assert "huggingface-cli download openai/gsm8k --repo-type dataset" in str(e.value)


def test_pretrained_model_loads_from_local_files_onto_the_mesh(tmp_path, tiny_task):
    import jax
    from flax import nnx

    from sera_jax.models import hf_loader
    from sera_jax.train import sharding as sharding_lib

    config = config_lib.get_config("gpu")
    config.model.dir = str(tmp_path / "model")
    source = main_lib.build_model(config_lib.get_config("tiny"), tiny_task, seed=3)
    hf_loader.save_hf_checkpoint(source, tmp_path / "model")
    mesh = sharding_lib.make_placement(config.mesh).mesh
    model = main_lib.build_model(config, tiny_task, seed=0, mesh=mesh)
    assert model.cfg.vocab_size == tiny_task.tokenizer.vocab_size and model.cfg.dtype == "bfloat16"
    want = dict(nnx.to_flat_state(nnx.state(source, nnx.Param)))
    for path, got in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        np.testing.assert_array_equal(np.asarray(got.get_value()), np.asarray(want[path].get_value()))
        if jax.device_count() > 1:
            assert got.get_value().sharding.mesh.shape == mesh.shape


def test_gsm8k_source_builds_prompts_from_local_files(tmp_path, tiny_task):
    rows = [{"question": f"Tom has {i} pens and buys 2 more. How many pens?",
             "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(5)]
    for name, split in (("gsm8k", "train"), ("platinum", "test")):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    tiny_task.tokenizer.save(tmp_path / "model")
    config = config_lib.get_config("gpu")
    config.model.dir, config.data.dir, config.data.eval_dir = (str(tmp_path / n)
                                                               for n in ("model", "gsm8k", "platinum"))
    task = make_task(config, build_tokenizer(config))
    assert task.num_train_prompts == 5 and task.max_new_tokens == 2048 and not task.sft.records
    batch = task.train_prompts(0, 5)
    assert sorted(batch.payload) == [str(i + 2) for i in range(5)]
    text = task.tokenizer.decode(batch.tokens_PxT[0, -batch.lengths_P[0]:])
    assert text.endswith("within \\boxed{}.") and "How many pens?" in text


def test_bad_configs_name_the_field(tmp_path):
    config = config_lib.get_config("tiny")
    config.data.source = "mnist"
    with pytest.raises(ValueError, match="config.data.source"):
        main_lib.run(config, tmp_path)
    config = config_lib.get_config("tiny")
    config.methods = ("uniform", "magic")
    with pytest.raises(ValueError, match="magic"):
        main_lib.method_config(config, "magic")
    with pytest.raises(ValueError, match="variant"):
        config_lib.get_config("huge")
    for variant in config_lib.VARIANTS:
        assert config_lib.get_config(variant).variant == variant
