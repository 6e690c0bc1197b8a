"""The SERA authors' math runs as configs (``paper_*``): their settings, their files' layouts, ``paper_tiny`` end to
end on files written in those layouts, and the refusal of broken values of the fields only these variants have."""

import numpy as np
import pytest

from experiments.math_reasoning import config as config_lib
from experiments.math_reasoning import experiment as math_experiment
from experiments.math_reasoning.task import EvalReference, build_tokenizer, make_task
from sera_jax.data import math_data
from sera_jax.rl import comparison
from sera_jax.rl.task import SampleOutput

# What each script says (ChenZihao0121/SERA @ 3252ed5; the config cites the line of each), and what their
# evaluation/sequence.py and evaluation/paper_assets.json say of its evaluation.
SCRIPTS = {
    "paper_gsm8k": dict(hf_repo="HuggingFaceTB/SmolLM2-360M-Instruct", source="gsm8k", lr=1e-5, steps=2000,
                        grad_clip=1.0, max_new_tokens=2048, max_prompt_tokens=512, micro=64, truncation="at_cap",
                        eval_sets=("gsm8k_platinum",), samples=256, test_freq=100, save_freq=100, gpus=8,
                        train_size=7473, suffix=math_data.PROMPT_SUFFIX, separator=" "),
    "paper_math": dict(hf_repo="Qwen/Qwen2.5-Math-1.5B", source="verl", lr=1e-6, steps=600, grad_clip=0.3,
                       max_new_tokens=3000, max_prompt_tokens=1024, micro=16, truncation="graded",
                       eval_sets=("beyondaime", "aime25", "math500", "olympiadbench"), samples=512, test_freq=50,
                       save_freq=100, gpus=8, train_size=8192, suffix=math_data.QWEN_INSTRUCTION, separator=""),
    "paper_polaris": dict(hf_repo="Qwen/Qwen3-4B-Base", source="polaris", lr=1e-6, steps=1000, grad_clip=0.3,
                          max_new_tokens=4096, max_prompt_tokens=1024, micro=4, truncation="graded",
                          eval_sets=("beyondaime", "aime25", "math500", "minerva"), samples=512, test_freq=50,
                          save_freq=20, gpus=32, train_size=53291, suffix=math_data.QWEN_INSTRUCTION, separator=""),
}


@pytest.mark.parametrize("variant", sorted(SCRIPTS))
def test_paper_variants_restate_the_authors_scripts(variant):
    want, c = SCRIPTS[variant], config_lib.get_config(variant)
    assert c.model.hf_repo == want["hf_repo"] and c.model.source == "pretrained" and c.sft.steps == 0
    # 256 prompts x N0 16; the released rule on frozen per-epoch estimates, n in [2, 64], threshold 0.05
    assert (c.rl.prompts_per_step, c.rl.rollouts_per_step) == (256, 256 * 16)
    assert {k: c.sera[k] for k in ("method", "estimator", "p_estimate", "correction", "n_min", "n_max",
                                   "activation_threshold", "epoch_prior", "epoch_discount")} == dict(
        method="sera", estimator="maxrl", p_estimate="epoch_history", correction=True, n_min=2, n_max=64,
        activation_threshold=0.05, epoch_prior=(0.5, 0.5), epoch_discount=0.75)
    assert "p_estimate" not in config_lib.METHODS["sera"] and c.methods == ("uniform", "sera")  # the variant's own
    # verl's token-mean on each micro-batch of ppo_micro_batch_size_per_gpu rows
    assert c.sera.aggregation == "token_mean_microbatch" and c.sera.loss_microbatch_rows == want["micro"]
    assert (c.rl.learning_rate, c.rl.steps, c.rl.grad_clip) == (want["lr"], want["steps"], want["grad_clip"])
    assert (c.rl.b1, c.rl.b2, c.rl.weight_decay, c.rl.temperature, c.rl.top_p) == (0.9, 0.999, 0.01, 1.0, 1.0)
    assert (c.data.max_new_tokens, c.data.max_prompt_tokens) == (want["max_new_tokens"], want["max_prompt_tokens"])
    assert (c.data.prompt_suffix, c.data.prompt_separator, c.data.strip_question) == (
        want["suffix"], want["separator"], False)
    assert c.data.source == want["source"] and c.data.eval_sets == want["eval_sets"]
    assert sorted(c.data.eval_dirs) == sorted(want["eval_sets"])
    # training's length rule, and their evaluation's: a response that reaches the cap is wrong
    assert (c.grading.truncation, c.grading.eval_truncation, c.grading.backend) == (
        want["truncation"], "at_cap", "math_verify")
    n = want["samples"]
    assert (c.eval.samples_per_prompt, c.eval.temperature, c.eval.top_p) == (n, 0.6, 0.95)
    assert c.eval.ks == tuple(2**i for i in range(n.bit_length()))  # passk.py's default_ks: 1, 2, 4, ..., n
    assert (c.eval.every, c.ckpt.every) == (want["test_freq"], want["save_freq"])
    assert c.mesh.shape == (1, want["gpus"], 1)  # FSDP over every GPU of the run
    # valid for the trainer on that many devices and a training set of the script's size
    comparison.check_methods(math_experiment.EXPERIMENT, c, want["gpus"], want["train_size"])
    assert c.rl.rollouts_per_step // (c.rl.update_microbatches * want["gpus"]) == want["micro"]
    config_lib.validate_config(c)


def test_the_qwen_instruction_is_the_one_the_polaris_config_already_used():
    assert config_lib.POLARIS_PROMPT_SUFFIX == math_data.QWEN_INSTRUCTION
    assert config_lib.get_config("paper_math").data.eval_max_prompt_tokens == 4095  # sequence.py qwen25
    assert config_lib.get_config("paper_polaris").data.eval_max_prompt_tokens == 27904  # sequence.py qwen3


BAD_FIELDS = {
    # field: (value, the message)
    "data.eval_sets": (("aime24",), r"config\.data\.eval_sets has \['aime24'\]: each must be one of"),
    "data.eval_sets ": (("aime25", "aime25"), r"config\.data\.eval_sets=\('aime25', 'aime25'\) repeats \['aime25'\]"),
    "data.eval_sets  ": ("aime25", r"config\.data\.eval_sets='aime25': must be a tuple of names"),
    "data.eval_sets   ": ((), r"config\.data\.eval_sets is empty: config\.data\.source='verl' evaluates on it"),
    "data.eval_dirs.minerva": (3, r"config\.data\.eval_dirs\.minerva=3: every set of config\.data\.eval_sets needs"),
    "data.eval_max_prompt_tokens": (-1, r"config\.data\.eval_max_prompt_tokens=-1: must be an int >= 0"),
    "data.eval_max_prompt_tokens ": (True, r"config\.data\.eval_max_prompt_tokens=True: must be an int >= 0"),
    "data.strip_question": ("no", r"config\.data\.strip_question='no': must be True or False"),
    "grading.eval_truncation": ("lenient", r"config\.grading\.eval_truncation='lenient': must be one of"),
    "grading.truncation": ("lenient", r"config\.grading\.truncation='lenient': must be one of"),
    "data.source": ("mnist", r"config\.data\.source='mnist': must be one of"),
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_bad_paper_fields_are_refused_before_any_work(tmp_path, field):
    config = config_lib.get_config("paper_tiny")
    value, message = BAD_FIELDS[field]
    *parents, leaf = field.strip().split(".")
    node = config
    for parent in parents:
        node = node[parent]
    with node.ignore_type():
        node[leaf] = value
    with pytest.raises(ValueError, match=message):
        math_experiment.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_an_evaluation_folder_without_its_set_is_refused(tmp_path):
    config = config_lib.get_config("paper_tiny")
    config.data.eval_sets = ("aime25", "minerva")  # olympiadbench's folder is left over
    with pytest.raises(ValueError, match=r"config\.data\.eval_dirs has \['olympiadbench'\], not in config\.data"):
        math_experiment.run(config, tmp_path / "w")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    pytest.importorskip("pyarrow")
    return math_experiment.write_paper_tiny_files(tmp_path_factory.mktemp("paper_files"))


def _paper_tiny(paths: dict[str, str]):
    config = config_lib.get_config("paper_tiny")
    for field, path in paths.items():
        *parents, leaf = field.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = path
    return config


def test_paper_tiny_prompts_come_from_the_authors_rows_and_evaluation_grades_the_cap(tiny_files):
    config = _paper_tiny(tiny_files)
    task = make_task(config, build_tokenizer(config))
    tok = task.tokenizer
    assert task.num_train_prompts == 8 and [r["source"] for r in task.eval.records] == [
        "aime25", "aime25", "olympiadbench", "olympiadbench", "minerva", "minerva"]
    # A training row is its stored chat turn (their instruction inside), through the chat template, nothing added.
    train, held_out = task.train.records[0], task.eval.records[2]
    assert train["messages"][0]["content"].endswith(math_data.QWEN_INSTRUCTION)
    assert task.render_record(train) == tok.apply_chat_template(train["messages"], add_generation_prompt=True)
    # A held-out problem: the question as it is, then the instruction, braces doubled as in their prompts.
    assert task.render_record(held_out) == tok.apply_chat_template(
        [{"role": "user", "content": held_out["question"] + math_data.QWEN_INSTRUCTION}], add_generation_prompt=True)
    assert held_out["answer"] == held_out["answer"].strip("$")  # OlympiadBench's answer without its $ signs
    # The same right answer cut at the cap: graded in training (qwen.sh passes no length rule), 0 in evaluation.
    train_prompts, eval_prompts = task.train_prompts(0, 4), task.eval_prompts()
    assert not isinstance(train_prompts.payload[0], EvalReference) and isinstance(eval_prompts.payload[0], EvalReference)
    n = task.max_new_tokens
    rows = []
    for answer in (train_prompts.payload[0], eval_prompts.payload[0]):
        ids = tok.encode(f"\\boxed{{{answer}}}")
        rows.append((ids + tok.encode(" 1") * n)[:n])  # fills the cap, no stop token
    tokens = np.asarray(rows, np.int32)
    zeros = np.zeros(tokens.shape, np.float32)
    sample = SampleOutput(tokens, np.ones(tokens.shape, bool), np.full(2, n, np.int32), np.zeros(2, bool), zeros, zeros)
    mixed = train_prompts._replace(payload=[train_prompts.payload[0], eval_prompts.payload[0]])
    np.testing.assert_array_equal(task.rewards(mixed, np.array([0, 1]), sample), [1, 0])


def test_missing_paper_files_are_named(tiny_files, tmp_path):
    config = _paper_tiny(tiny_files)
    config.data.dir = str(tmp_path / "no_math35")
    with pytest.raises(FileNotFoundError, match=r"config\.data\.dir=.*no_math35.*'prompt' \(verl parquet\)"):
        math_experiment.run(config, tmp_path / "a")
    config = _paper_tiny(tiny_files)
    config.data.eval_dirs.olympiadbench = str(tmp_path / "no_olympiad")
    with pytest.raises(FileNotFoundError, match=r"config\.data\.eval_dirs\.olympiadbench=.*final_answer"):
        math_experiment.run(config, tmp_path / "b")
    config = config_lib.get_config("paper_math")
    config.model.dir = str(tmp_path / "no_model")
    with pytest.raises(FileNotFoundError, match="huggingface-cli download Qwen/Qwen2.5-Math-1.5B --repo-type model"):
        math_experiment.run(config, tmp_path / "c")


def test_paper_tiny_runs_the_released_rule_on_the_authors_layouts(tiny_files, tmp_path):
    """``paper_tiny`` end to end: the pretrained checkpoint onto the FSDP mesh, the prepared training rows, three
    evaluation layouts pooled, SERA on frozen epoch estimates (epoch 0 uniform, step 2 allocated) with the
    micro-batched token-mean loss."""
    config = _paper_tiny(tiny_files)
    results = math_experiment.run(config, tmp_path / "run")
    assert results["task"]["eval_sets"] == {"aime25": 2, "olympiadbench": 2, "minerva": 2}
    assert results["task"]["grading"]["eval_truncation"] == "at_cap" and results["task"]["num_train"] == 8
    (run,) = results["methods"]["sera"]["history"]
    steps = run["steps"]
    assert [s["cold_start"] for s in steps] == [1.0, 1.0, 0.0]
    assert all(s["rollouts_sampled"] == config.rl.rollouts_per_step for s in steps)
    assert all(np.isfinite(v) for s in steps for v in s.values() if isinstance(v, float))
    pk = results["methods"]["sera"]["pass_at_k"]
    assert pk["k"] == [1, 2, 4] and all(0.0 <= v <= 1.0 for v in pk["mean"])
