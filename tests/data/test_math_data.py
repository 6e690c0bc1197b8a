"""Tests for the local-file math dataset loaders and the prompt format."""

import json
import os

import pytest

from sera_jax.data import math_data

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs 1,500 dollars twice. Total?", "answer": "2 * 1500 = 3000\n#### 3,000"},
]


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def write_parquet(path, rows):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_prompt_format_matches_the_paper_and_is_configurable():
    assert math_data.PROMPT_SUFFIX == "Let's think step by step and output the final answer within \\boxed{}."
    assert math_data.format_prompt(" What is 2+2? ") == (
        "What is 2+2? Let's think step by step and output the final answer within \\boxed{}."
    )
    assert (
        math_data.format_prompt("Q?", suffix="Answer in \\boxed{}.", separator="\n")
        == "Q?\nAnswer in \\boxed{}."
    )
    assert math_data.format_prompt("Q?", suffix="") == "Q?"
    messages = math_data.to_messages("Q?", system="Be brief.")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["role"] == "user" and messages[1]["content"].startswith("Q? Let's think")


def test_gsm8k_final_answer():
    assert math_data.gsm8k_final_answer("work\n#### 1,234") == "1234"
    assert math_data.gsm8k_final_answer("#### 1\n#### -5 ") == "-5"
    with pytest.raises(ValueError, match="answer"):
        math_data.gsm8k_final_answer("no marker")


def test_gsm8k_jsonl_layout(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    records = math_data.load_gsm8k(tmp_path, "train")
    assert records == [
        {"id": "gsm8k/train/0", "question": GSM8K_ROWS[0]["question"], "answer": "7", "source": "gsm8k"},
        {"id": "gsm8k/train/1", "question": GSM8K_ROWS[1]["question"], "answer": "3000", "source": "gsm8k"},
    ]
    assert math_data.load_gsm8k(tmp_path, "train", limit=1) == records[:1]


def test_gsm8k_hf_parquet_layout_reads_shards_in_order(tmp_path):
    write_parquet(str(tmp_path / "main" / "test-00001-of-00002.parquet"), GSM8K_ROWS[1:])
    write_parquet(str(tmp_path / "main" / "test-00000-of-00002.parquet"), GSM8K_ROWS[:1])
    write_parquet(str(tmp_path / "main" / "train-00000-of-00001.parquet"), GSM8K_ROWS[:1])
    records = math_data.load_gsm8k(tmp_path, "test")
    assert [r["answer"] for r in records] == ["7", "3000"]
    assert [r["id"] for r in records] == ["gsm8k/test/0", "gsm8k/test/1"]


def test_gsm8k_platinum_drops_rejected_rows(tmp_path):
    rows = [dict(GSM8K_ROWS[0], cleaning_status="consensus"), dict(GSM8K_ROWS[1], cleaning_status="rejected")]
    rows.append({"question": "Q3", "answer": "#### 9", "cleaning_status": "revised"})
    write_parquet(str(tmp_path / "main" / "test-00000-of-00001.parquet"), rows)
    records = math_data.load_gsm8k_platinum(tmp_path)
    assert [(r["id"], r["answer"], r["source"]) for r in records] == [
        ("gsm8k_platinum/test/0", "7", "gsm8k_platinum"),
        ("gsm8k_platinum/test/2", "9", "gsm8k_platinum"),
    ]


def test_math500_keeps_unique_ids_and_latex_answers(tmp_path):
    rows = [
        {
            "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
            "solution": "... $\\boxed{\\frac34}$",
            "answer": "\\frac34",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        },
    ]
    write_jsonl(str(tmp_path / "test.jsonl"), rows)
    assert math_data.load_math500(tmp_path) == [
        {
            "id": "test/algebra/1.json",
            "question": rows[0]["problem"],
            "answer": "\\frac34",
            "source": "math500",
        }
    ]


def test_polaris_jsonl_and_parquet_layouts(tmp_path):
    rows = [
        {"problem": "Find x.", "answer": 3, "difficulty": "7/8"},
        {"problem": "Find y.", "answer": " 1/2 "},
    ]
    write_jsonl(str(tmp_path / "a" / "polaris-data-53K.jsonl"), rows)
    write_parquet(
        str(tmp_path / "b" / "data" / "train-00000-of-00001.parquet"),
        [dict(r, answer=str(r["answer"])) for r in rows],
    )
    for sub in ("a", "b"):
        records = math_data.load_polaris(tmp_path / sub)
        assert [(r["id"], r["question"], r["answer"]) for r in records] == [
            ("polaris/train/0", "Find x.", "3"),
            ("polaris/train/1", "Find y.", "1/2"),
        ]


def test_missing_data_names_directory_files_and_source(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        math_data.load_gsm8k(missing)
    message = str(info.value)
    assert str(missing) in message and "does not exist" in message
    assert "train.jsonl" in message and "main/train-*.parquet" in message
    assert "openai/gsm8k" in message and "huggingface-cli download" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has none of the expected files.*MATH-500"):
        math_data.load_math500(tmp_path / "empty")


def test_bad_rows_and_names_raise_value_errors(tmp_path):
    write_jsonl(str(tmp_path / "test.jsonl"), [{"problem": "Q", "solution": "S"}])
    with pytest.raises(ValueError, match="'answer'"):
        math_data.load_math500(tmp_path)
    with pytest.raises(ValueError, match="name"):
        math_data.load_math_dataset("aime", tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train.jsonl").write_text('{"question": "Q", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        math_data.load_gsm8k(tmp_path / "bad")


def test_prompts_and_answers(tmp_path):
    write_jsonl(str(tmp_path / "train.jsonl"), GSM8K_ROWS)
    prompts, answers = math_data.prompts_and_answers(math_data.load_gsm8k(tmp_path))
    assert answers == ["7", "3000"]
    assert prompts[0] == GSM8K_ROWS[0]["question"] + " " + math_data.PROMPT_SUFFIX
