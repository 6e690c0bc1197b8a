"""Tests for the trained task tokenizer, local Hugging Face tokenizers, chat templates and batch layout."""

import json
import re

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from sera_jax.data import math_data
from sera_jax.data import tokenizer as tk
from sera_jax.envs import arithmetic, math_grading

# ChatML, laid out the way Hugging Face configs write it (indentation and newlines between tags vanish only
# through trim_blocks and the '-' whitespace control), plus a guard that exercises raise_exception.
CHATML_TEMPLATE = r"""{% if messages[0]['role'] == 'assistant' %}
{{ raise_exception('the first turn must not be the assistant') }}
{% endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

WORDS = [
    "hello",
    "world",
    "what",
    "is",
    "two",
    "plus",
    "three",
    "five",
    "answer",
    "system",
    "user",
    "assistant",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_hf_dir(directory, *, chat_template_in_config=True, named_templates=False):
    vocab = {token: i for i, token in enumerate([*SPECIALS, "[UNK]", *WORDS])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "rstrip": False, "special": True},
        "pad_token": "<|endoftext|>",
    }
    if named_templates:
        config["chat_template"] = [
            {"name": "tool_use", "template": "x"},
            {"name": "default", "template": CHATML_TEMPLATE},
        ]
    elif chat_template_in_config:
        config["chat_template"] = CHATML_TEMPLATE
    else:
        (directory / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return directory


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    return tk.load_tokenizer(write_hf_dir(tmp_path_factory.mktemp("hf")))


@pytest.fixture(scope="module")
def task_tok():
    return tk.train_tokenizer(arithmetic.corpus(2000, seed=0, extra_texts=[math_data.PROMPT_SUFFIX]))


# ------------------------------------------------------------------------------------ HF directories


def test_hf_special_tokens_and_stop_ids(hf_tok):
    assert (hf_tok.eos_id, hf_tok.pad_id, hf_tok.bos_id) == (2, 0, None)
    assert hf_tok.stop_ids == (2, 0)  # eos, then generation_config's extra eos id
    assert hf_tok.vocab_size == len(SPECIALS) + 1 + len(WORDS)


def test_chat_template_renders_chatml(hf_tok):
    messages = [{"role": "system", "content": "hello"}, {"role": "user", "content": "what is two plus three"}]
    expected = "<|im_start|>system\nhello<|im_end|>\n<|im_start|>user\nwhat is two plus three<|im_end|>\n"
    assert hf_tok.apply_chat_template(messages) == expected
    assert (
        hf_tok.apply_chat_template(messages, add_generation_prompt=True)
        == expected + "<|im_start|>assistant\n"
    )
    with pytest.raises(Exception, match="first turn"):
        hf_tok.apply_chat_template([{"role": "assistant", "content": "five"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        hf_tok.apply_chat_template([{"content": "five"}])


@pytest.mark.parametrize("kind", ["jinja_file", "named"])
def test_chat_template_other_locations(tmp_path, kind):
    directory = write_hf_dir(tmp_path / kind, chat_template_in_config=False, named_templates=kind == "named")
    tok = tk.load_tokenizer(directory)
    assert (
        tok.apply_chat_template([{"role": "user", "content": "hello"}])
        == "<|im_start|>user\nhello<|im_end|>\n"
    )


def test_missing_files_and_template(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path)) + ".*tokenizer_config.json"):
        tk.load_tokenizer(tmp_path)
    directory = write_hf_dir(tmp_path / "t")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="chat_template"):
        tk.load_tokenizer(directory).apply_chat_template([{"role": "user", "content": "hello"}])


def test_encode_chat_prompts_right_and_left_padding(hf_tok):
    texts = ["hello", "what is two plus three"]
    singles = [
        hf_tok.encode(
            hf_tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        )
        for t in texts
    ]
    assert singles[0] == [1, 14, 4, 2, 1, 15]  # <|im_start|> user hello <|im_end|> <|im_start|> assistant
    right_PxT, lengths_P = tk.encode_chat_prompts(hf_tok, texts)
    left_PxT, left_lengths_P = tk.encode_chat_prompts(hf_tok, texts, padding_side="left", length=12)
    assert right_PxT.dtype == np.int32 and lengths_P.dtype == np.int32
    np.testing.assert_array_equal(lengths_P, [len(s) for s in singles])
    np.testing.assert_array_equal(left_lengths_P, lengths_P)
    assert right_PxT.shape == (2, max(map(len, singles))) and left_PxT.shape == (2, 12)
    for i, s in enumerate(singles):
        assert right_PxT[i, : len(s)].tolist() == s and set(right_PxT[i, len(s) :].tolist()) <= {
            hf_tok.pad_id
        }
        assert left_PxT[i, 12 - len(s) :].tolist() == s and set(left_PxT[i, : 12 - len(s)].tolist()) <= {0}


def test_pad_sequences_validation():
    tokens_PxT, lengths_P = tk.pad_sequences([[5, 6, 7], [8]], pad_id=0, length=4)
    np.testing.assert_array_equal(tokens_PxT, [[5, 6, 7, 0], [8, 0, 0, 0]])
    np.testing.assert_array_equal(lengths_P, [3, 1])
    with pytest.raises(ValueError, match="length"):
        tk.pad_sequences([[1, 2, 3]], pad_id=0, length=2)
    with pytest.raises(ValueError, match="padding_side"):
        tk.pad_sequences([[1]], pad_id=0, padding_side="middle")


def test_decode_responses_stops_and_flags_truncation(hf_tok):
    hello, world, five, eos, pad = 4, 5, 11, 2, 0
    rows_BxR = np.array(
        [
            [hello, world, eos, five, five],  # stops at eos; tokens after it are ignored
            [five, five, five, five, five],  # never stops: truncated
            [eos, hello, pad, pad, pad],  # empty answer, finished
            [hello, pad, five, five, five],  # the generation-config stop id (pad here) also stops
            [hello, world, eos, pad, pad],  # the sampler says only 2 tokens are valid: truncated
        ],
        dtype=np.int32,
    )
    texts, truncated_B = tk.decode_responses(hf_tok, rows_BxR, lengths_B=np.array([5, 5, 5, 5, 2]))
    assert texts == ["hello world", "five five five five five", "", "hello", "hello world"]
    np.testing.assert_array_equal(truncated_B, [False, True, False, False, True])
    cut_B, finished_B = tk.find_stop(rows_BxR, [eos])
    np.testing.assert_array_equal(cut_B, [2, 5, 0, 5, 2])
    np.testing.assert_array_equal(finished_B, [True, False, True, False, True])


# ------------------------------------------------------------------------------- trained task tokenizer


def test_trained_tokenizer_never_merges_digits(task_tok):
    vocab = task_tok.tokenizer.get_vocab()
    assert all(sum(c.isdigit() for c in token) <= 1 for token in vocab)
    assert task_tok.vocab_size <= 512
    for special in tk.SPECIAL_TOKENS:
        assert task_tok.encode(special) == [task_tok.tokenizer.token_to_id(special)]


def test_trained_tokenizer_round_trips_exactly(task_tok):
    for p in arithmetic.generate_problems(50, seed=9, split="test"):
        for text in (p.question, p.solution, math_data.format_prompt(p.question)):
            assert task_tok.decode(task_tok.encode(text)) == text
    unseen = "Naïve café: 1,234.50 € — \\frac{3}{4}\n\ttabs"  # bytes never seen in training
    assert task_tok.decode(task_tok.encode(unseen)) == unseen


def test_task_texts_fit_the_token_budgets(task_tok):
    problems = arithmetic.generate_problems(1000, seed=11, split="test")
    question_lengths = [len(task_tok.encode(p.question)) for p in problems]
    solution_lengths = [len(task_tok.encode(p.solution)) + 1 for p in problems]  # + eos
    assert max(question_lengths) < 80
    assert max(solution_lengths) <= 60
    # Harder levels are longer on average: length tracks the number of steps.
    means = [
        np.mean([n for n, p in zip(solution_lengths, problems, strict=True) if p.level == lv])
        for lv in range(1, 6)
    ]
    assert means == sorted(means)


def test_saved_task_tokenizer_loads_back_with_its_template(task_tok, tmp_path):
    task_tok.save(tmp_path)
    loaded = tk.load_tokenizer(tmp_path)
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (
        task_tok.bos_id,
        task_tok.eos_id,
        task_tok.pad_id,
    )
    assert loaded.stop_ids == (task_tok.eos_id,)
    (p,) = arithmetic.generate_problems(1, seed=2, levels=(4,))
    prompt = [{"role": "user", "content": p.question}]
    rendered = loaded.apply_chat_template(prompt, add_generation_prompt=True)
    assert rendered == f"<bos><|user|>{p.question}<|assistant|>"
    full = loaded.apply_chat_template([*prompt, {"role": "assistant", "content": p.solution}])
    assert full == f"<bos><|user|>{p.question}<|assistant|>{p.solution}<eos>"
    # SFT masks the loss by prompt length, which needs the prompt's ids to be a prefix of the full ids.
    prompt_ids, full_ids = loaded.encode(rendered), loaded.encode(full)
    assert full_ids[: len(prompt_ids)] == prompt_ids and full_ids[-1] == loaded.eos_id
    assert prompt_ids[0] == loaded.bos_id
    assert loaded.encode(p.solution) == task_tok.encode(p.solution)


def test_sampled_rows_decode_and_grade(task_tok):
    problems = arithmetic.generate_problems(3, seed=4, levels=(5,))
    eos, pad = task_tok.eos_id, task_tok.pad_id
    rows = [
        [*task_tok.encode(problems[0].solution), eos, *task_tok.encode(" 99")],
        task_tok.encode(problems[1].solution),  # no eos: cut by the length limit
        [*task_tok.encode(problems[2].solution.replace(f"{{{problems[2].answer}}}", "{0}")), eos],
    ]
    tokens_BxR, _ = tk.pad_sequences(rows, pad_id=pad)
    texts, truncated_B = tk.decode_responses(task_tok, tokens_BxR, lengths_B=np.array([len(r) for r in rows]))
    assert texts[0] == problems[0].solution
    rewards = math_grading.grade_batch(texts, [p.answer for p in problems], truncated_B)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0])
