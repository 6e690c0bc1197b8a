"""The math-reasoning experiment: rewards against the grader, prompt layout, the tiny config end to end, resume."""

import csv
import json
import shutil

import numpy as np
import pytest

from experiments.math_reasoning import config as config_lib
from experiments.math_reasoning import experiment as math_experiment
from experiments.math_reasoning.task import MathTask, build_tokenizer, make_task
from sera_jax.envs import math_grading
from sera_jax.rl import step as step_lib
from sera_jax.rl.task import SampleOutput
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
        # verl's token-mean: over the batch (token_mean), or per micro-batch as the SERA authors' runs
        authors = variant == "cpu_epochs" or variant.startswith("paper_")
        assert c.sera.aggregation == ("token_mean_microbatch" if authors else "token_mean")
        paper_scale = variant in ("gpu", "full", "paper_gsm8k", "paper_math", "paper_polaris")
        assert c.grading.backend == ("math_verify" if paper_scale else "builtin")
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
    # The released SERA samples only prompts with a mixed-group chance >= 0.99 at n_max (the authors' 0.05 keeps
    # every tiny prompt): its epoch-1 step must give some prompts no rollouts (test_released_sera_skips_prompts).
    config.sera.activation_threshold = 0.99
    return workdir, config, math_experiment.run(config, workdir)


def test_released_sera_skips_prompts_end_to_end(tiny_run):
    """8 training problems, 4 a step: steps 0-1 are epoch 0, uniform for lack of estimates (cold_start); step 2
    reads the frozen estimates, and at threshold 0.99 only ceil(16 / 8) = 2 prompts are active: the other two get
    no rollouts, the budget is still sampled exactly and the loss, advantages and metrics stay finite."""
    _, config, results = tiny_run
    for run in results["methods"]["sera"]["history"]:
        steps = run["steps"]
        assert [s["cold_start"] for s in steps] == [1.0, 1.0, 0.0]
        assert steps[2]["active_frac"] == 0.5 and steps[2]["counts_min"] == 0
        assert all(s["rollouts_sampled"] == config.rl.rollouts_per_step for s in steps)
        assert all(np.isfinite(v) for s in steps for v in s.values() if isinstance(v, float))


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
            graded = [r for r in rows if r["reward_mean"]]  # the grader's per-step counts reach the metrics
            assert all(0 <= float(r["grading_calls"]) <= config.rl.rollouts_per_step for r in graded)
            assert all(float(r["grading_errors"]) == float(r["grading_timeouts"]) == 0 for r in graded)
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

    again = math_experiment.run(config, workdir)  # finished: nothing is redone
    assert rl_steps == [] and sft_steps == []
    for method in config.methods:
        assert again["methods"][method]["pass_at_k"] == first["methods"][method]["pass_at_k"]
        assert again["methods"][method]["history"] == first["methods"][method]["history"]

    longer = config.copy_and_resolve_references()
    longer.rl.steps = config.rl.steps + 1
    more = math_experiment.run(longer, workdir)  # one more step per run, from the saved state
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
        math_experiment.run(other, workdir)
    assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()} == before


def test_a_history_method_that_would_never_revisit_a_prompt_is_refused_before_training(tmp_path, monkeypatch):
    """The training set's size is known once the task is built: the comparison checks it then, before any SFT."""
    config = config_lib.get_config("tiny")
    config.rl.steps = 2  # 2 steps x 4 prompts: the 8 training prompts once
    monkeypatch.setattr(step_lib, "make_sft_step", lambda *a: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=r"p_estimate='epoch_history'.* 8 prompts .* set of 8, so it never revisits"):
        math_experiment.run(config, tmp_path)


def test_pretrained_configs_name_missing_files(tmp_path, tiny_task):
    for variant in ("gpu", "full"):
        config = config_lib.get_config(variant)
        config.model.dir = str(tmp_path / "no_model")
        with pytest.raises(FileNotFoundError, match="config.model.dir") as e:
            math_experiment.run(config, tmp_path / variant)
        assert f"huggingface-cli download {config.model.hf_repo} --repo-type model" in str(e.value)
    # With a tokenizer in place, the missing dataset is named next.
    tiny_task.tokenizer.save(tmp_path / "model")
    config = config_lib.get_config("gpu")
    config.model.dir = str(tmp_path / "model")
    config.data.dir = str(tmp_path / "no_data")
    with pytest.raises(FileNotFoundError, match="config.data.dir") as e:
        math_experiment.run(config, tmp_path / "gpu")
    assert "huggingface-cli download openai/gsm8k --repo-type dataset" in str(e.value)


def test_pretrained_model_loads_from_local_files_onto_the_mesh(tmp_path, tiny_task):
    import jax
    from flax import nnx

    from sera_jax.models import hf_loader
    from sera_jax.train import sharding as sharding_lib

    config = config_lib.get_config("gpu")
    config.model.dir = str(tmp_path / "model")
    source = math_experiment.build_model(config_lib.get_config("tiny"), tiny_task, seed=3)
    hf_loader.save_hf_checkpoint(source, tmp_path / "model")
    mesh = sharding_lib.make_placement(config.mesh).mesh
    model = math_experiment.build_model(config, tiny_task, seed=0, mesh=mesh)
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
        math_experiment.run(config, tmp_path)
    config = config_lib.get_config("tiny")
    config.methods = ("uniform", "magic")
    with pytest.raises(ValueError, match="magic"):
        math_experiment.method_config(config, "magic")
    with pytest.raises(ValueError, match="variant"):
        config_lib.get_config("huge")
    for variant in config_lib.VARIANTS:
        assert config_lib.get_config(variant).variant == variant


def _rows_of_length(tok, text: str, n: int, *, eos: bool) -> list[int]:
    """``text`` padded with " 1" to exactly ``n`` tokens, the last one EOS if ``eos``."""
    body = n - 1 if eos else n
    ids = tok.encode(text)
    while len(ids) < body:
        ids = ids + tok.encode(" 1")
    return ids[:body] + ([tok.eos_id] if eos else [])


def test_length_rules_follow_maxrls_scripts(tiny_task, monkeypatch):
    """GSM8K (``at_cap``): a response that fills the cap scores 0 even when its last token is EOS; POLARIS
    (``graded``): a cut response is graded; ``no_stop``: only a response without a stop token scores 0."""
    task, tok = tiny_task, tiny_task.tokenizer
    prompts = task.train_prompts(0, 4)
    answer, n = int(prompts.payload[0]), task.max_new_tokens
    rows = [_rows_of_length(tok, f"\\boxed{{{answer}}}", n, eos=True),  # fills the cap, ends with EOS
            _rows_of_length(tok, f"\\boxed{{{answer}}}", n - 1, eos=True),  # one token short of the cap
            _rows_of_length(tok, f"\\boxed{{{answer}}}", n, eos=False)]  # cut at the cap
    assert [len(r) for r in rows] == [n, n - 1, n] and [r[-1] == tok.eos_id for r in rows] == [True, True, False]
    sample = _samples(task, rows, n)
    expected = {"no_stop": [1, 1, 0], "at_cap": [0, 1, 0], "graded": [1, 1, 1]}
    for rule, want in expected.items():
        monkeypatch.setattr(task, "truncation", rule)
        np.testing.assert_array_equal(task.rewards(prompts, np.zeros(3, np.int64), sample), want, err_msg=rule)
    gpu, full = config_lib.get_config("gpu"), config_lib.get_config("full")
    assert (gpu.grading.truncation, full.grading.truncation) == ("at_cap", "graded")
    assert config_lib.get_config("cpu").grading.truncation == "no_stop"
    assert (gpu.rl.grad_clip, full.rl.grad_clip) == (1.0, 0.3)  # MaxRL: verl's default 1.0; Qwen3 GRAD_CLIP=0.3
    config = config_lib.get_config("tiny")
    config.grading.truncation = "lenient"
    with pytest.raises(ValueError, match="config.grading.truncation"):
        make_task(config, build_tokenizer(config))


def test_polaris_prompt_is_maxrls_literal(tiny_task, monkeypatch):
    # examples/maxrl_data_preprocess/polaris.py: question + "\nPlease reason ... within \\boxed{{}}." (no f-string).
    literal = "\nPlease reason step by step, and put your final answer within " + "\\" + "boxed{{}}."
    full = config_lib.get_config("full")
    assert full.data.prompt_suffix == literal and full.data.prompt_separator == ""
    assert config_lib.get_config("gpu").data.prompt_separator == " "
    for name, value in (("prompt_suffix", literal), ("prompt_separator", ""), ("use_chat_template", False)):
        monkeypatch.setattr(tiny_task, name, value)
    assert tiny_task.render("What is 2 + 2?") == "What is 2 + 2?" + literal


def test_grading_errors_are_counted_per_step_and_stop_the_run(tiny_task, monkeypatch):
    task, tok = tiny_task, tiny_task.tokenizer
    real = math_grading._WORKER_FUNCTIONS["builtin_score"]

    def broken(response, *args):  # a grader that raises on some responses
        if "9" in response:
            raise TypeError("an API change")
        return real(response, *args)

    monkeypatch.setitem(math_grading._WORKER_FUNCTIONS, "builtin_score", broken)
    monkeypatch.setattr(task, "grader", math_grading.Grader(timeout_s=None))  # in-process, where the patch applies
    prompts = task.train_prompts(0, 4)
    n = task.max_new_tokens
    rows = [tok.encode(t) + [tok.eos_id] for t in ("it is 1", "it is 2", "it is 3", "it is 4", "it is 9")]
    sample = _samples(task, rows, n)
    task.reward_metrics()
    monkeypatch.setattr(task, "max_grading_error_frac", 0.5)
    task.rewards(prompts, np.zeros(5, np.int64), sample)  # 1 of 5 calls failed: under 0.5
    assert task.reward_metrics() == {"grading_calls": 5, "grading_timeouts": 0, "grading_errors": 1}
    assert task.reward_metrics() == {"grading_calls": 0, "grading_timeouts": 0, "grading_errors": 0}  # read once
    monkeypatch.setattr(task, "max_grading_error_frac", 0.1)
    with pytest.raises(math_grading.GradingError, match=r"1 of 5 grading calls failed.*config\.grading\."
                                                        r"max_error_frac=0\.1"):
        task.rewards(prompts, np.zeros(5, np.int64), sample)
    config = config_lib.get_config("tiny")
    config.grading.max_error_frac = 1.5
    with pytest.raises(ValueError, match="config.grading.max_error_frac"):
        make_task(config, build_tokenizer(config))


def test_the_declared_comparison_is_the_calibrated_setting():
    """``cpu_n64`` is ``cpu`` with exactly the settings its calibration runs used (read from the committed
    calibration record), 16 seeds and issue 22's methods, each of which the trainer accepts."""
    import pathlib

    from sera_jax.rl import comparison

    record = pathlib.Path(__file__).resolve().parents[2] / "results/cpu/math_reasoning/calibration.json"
    runs = [r for r in json.loads(record.read_text())["results"]["runs"] if r["settings"]["rollouts_per_prompt"] == 64]
    c, base = config_lib.get_config("cpu_n64"), config_lib.get_config("cpu")
    assert len(runs) >= 2
    for run in runs:
        for key, value in run["settings"].items():
            declared = (c.rl.rollouts_per_step / c.rl.prompts_per_step if key == "rollouts_per_prompt"
                        else c[key.split(".")[0]][key.split(".")[1]])
            assert declared == value, (run["name"], key)

    def flat(config):
        return {f"{g}.{k}": v for g, fields in config.to_dict().items() if isinstance(fields, dict)
                for k, v in fields.items()}

    changed = {k for k, v in flat(c).items() if flat(base)[k] != v}
    assert changed == {"data.num_train", "rl.learning_rate", "rl.prompts_per_step", "rl.rollouts_per_step",
                       "rl.steps", "sera.n_max", "sera.p_estimate"}
    assert c.seeds == tuple(range(16)) and c.methods[:2] == ("uniform", "sera") and c.sera.p_estimate == "pilot"
    # The pool never recurs: every declared method runs on it; a history-estimate one would be refused.
    comparison.check_methods(math_experiment.EXPERIMENT, c, num_shards=1, num_train_prompts=c.data.num_train)
    with_history = c.copy_and_resolve_references()
    with_history.sera.p_estimate = "epoch_history"
    with pytest.raises(ValueError, match=r"p_estimate='epoch_history'.* 1024 prompts .* never revisits a prompt"):
        comparison.check_methods(math_experiment.EXPERIMENT, with_history, num_shards=1,
                                 num_train_prompts=c.data.num_train)
