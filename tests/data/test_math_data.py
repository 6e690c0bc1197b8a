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


# ---------------------------------------------------------------- the SERA authors' layouts (ChenZihao0121/SERA)


def test_qwen_instruction_keeps_its_doubled_braces_and_the_question_as_it_is():
    # evaluation/prepare_data.py:16 and qwen/prepare_polaris.py:10: a plain literal, never formatted.
    assert math_data.QWEN_INSTRUCTION == "\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    assert "{{}}" in math_data.QWEN_INSTRUCTION and math_data.QWEN_INSTRUCTION.count("\\") == 1
    question = "Find $x$.\n"  # their prompt is question + instruction, whitespace kept
    assert math_data.format_prompt(question, math_data.QWEN_INSTRUCTION, "", strip=False) == (
        "Find $x$.\n\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
    assert math_data.format_prompt(question, math_data.QWEN_INSTRUCTION, "").startswith("Find $x$.\nPlease")
    assert math_data.to_messages(question, math_data.QWEN_INSTRUCTION, separator="", strip=False) == [
        {"role": "user", "content": question + math_data.QWEN_INSTRUCTION}]


def _verl_row(i, question, gold, **extra):
    """qwen/prepare_polaris.py's row: the chat turn holds the instruction; the answer under reward_model."""
    return dict(data_source="polaris", id=i, ability="math",
                prompt=[dict(role="user", content=question + math_data.QWEN_INSTRUCTION)],
                reward_model=dict(style="rule", ground_truth=gold), extra_info=dict(split="train", index=i), **extra)


def test_verl_parquet_rows_keep_their_chat_turns_answers_and_prompt_keys(tmp_path):
    rows = [_verl_row(0, "Find x.", "3", problem="Find x.", answer="3"), _verl_row(1, "Find y.", "\\frac{1}{2}")]
    write_parquet(str(tmp_path / "math35" / "train.parquet"), rows)
    for where in (tmp_path / "math35", tmp_path / "math35" / "train.parquet"):  # the folder or the file
        records = math_data.load_verl(where)
        assert records == [
            {"id": "polaris::0", "question": "Find x." + math_data.QWEN_INSTRUCTION, "answer": "3", "source": "verl",
             "messages": [{"role": "user", "content": "Find x." + math_data.QWEN_INSTRUCTION}]},
            {"id": "polaris::1", "question": "Find y." + math_data.QWEN_INSTRUCTION, "answer": "\\frac{1}{2}",
             "source": "verl", "messages": [{"role": "user", "content": "Find y." + math_data.QWEN_INSTRUCTION}]},
        ]
    assert math_data.load_verl(tmp_path / "math35", limit=1) == records[:1]
    # SimpleRL-Zoo-Data's folder layout; a POLARIS folder of prepare_polaris.py's train.parquet reads as prepared.
    write_parquet(str(tmp_path / "zoo" / "simplelr_qwen_level3to5" / "train.parquet"), rows)
    assert math_data.load_verl(tmp_path / "zoo") == records
    write_parquet(str(tmp_path / "polaris" / "train.parquet"), rows)
    assert [r["messages"] for r in math_data.load_polaris(tmp_path / "polaris")] == [r["messages"] for r in records]


def test_verl_rows_without_a_chat_list_or_an_answer_name_the_layout(tmp_path):
    write_parquet(str(tmp_path / "a" / "train.parquet"), [{"problem": "Q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"row 0: no chat list under 'messages' or 'prompt'.*reward_model\.ground_truth"):
        math_data.load_verl(tmp_path / "a")
    bad = _verl_row(0, "Q", "1")
    bad["reward_model"] = {"style": "rule"}
    write_parquet(str(tmp_path / "b" / "train.parquet"), [bad])
    with pytest.raises(ValueError, match=r"no reference answer under 'reward_model\.ground_truth' or 'ground_truth'"):
        math_data.load_verl(tmp_path / "b")
    with pytest.raises(FileNotFoundError) as info:
        math_data.load_verl(tmp_path / "nowhere")
    message = str(info.value)
    assert "does not exist" in message and "train.parquet" in message and "'prompt' (verl parquet)" in message
    assert "huggingface-cli" not in message  # their prepared file has no public repository


def test_pinned_evaluation_sources_in_their_own_layouts(tmp_path):
    # evaluation/paper_assets.json: BeyondAIME data/test.parquet and AIME 2025 test.jsonl (problem / answer),
    # Minerva test.jsonl (question / answer), OlympiadBench test.jsonl (question / final_answer, one, in $).
    write_parquet(str(tmp_path / "beyond" / "data" / "test.parquet"), [{"problem": "P1", "answer": "12"}])
    write_jsonl(str(tmp_path / "aime" / "test.jsonl"), [{"id": 0, "problem": "P2", "answer": 70}])
    write_jsonl(str(tmp_path / "minerva" / "test.jsonl"), [{"question": "P3", "answer": "7.5e-5"}])
    write_jsonl(str(tmp_path / "oly" / "test.jsonl"),
                [{"id": 1606, "question": "P4", "final_answer": ["$\\frac{1}{2}$"], "unit": None}])
    got = {name: math_data.load_eval_set(name, tmp_path / folder)
           for name, folder in (("beyondaime", "beyond"), ("aime25", "aime"), ("minerva", "minerva"),
                                ("olympiadbench", "oly"))}
    assert {n: [(r["id"], r["question"], r["answer"], r["source"]) for r in rs] for n, rs in got.items()} == {
        "beyondaime": [("beyondaime/test/0", "P1", "12", "beyondaime")],
        "aime25": [("aime25/test/0", "P2", "70", "aime25")],
        "minerva": [("minerva/test/0", "P3", "7.5e-5", "minerva")],
        "olympiadbench": [("olympiadbench/test/0", "P4", "\\frac{1}{2}", "olympiadbench")],
    }
    assert not any("messages" in r for rs in got.values() for r in rs)  # the task adds the instruction
    with pytest.raises(ValueError, match="evaluation set 'gsm8k'"):
        math_data.load_eval_set("gsm8k", tmp_path)


def test_olympiadbench_rows_outside_the_authors_set_are_refused(tmp_path):
    assert math_data.olympiad_final_answer(["$3\\sqrt{2}$"]) == "3\\sqrt{2}"
    for row, words in (({"question": "Q", "final_answer": ["1", "2"]}, "exactly one answer"),
                       ({"question": "Q <img src='a.png'>", "final_answer": ["1"]}, "image or a context"),
                       ({"question": "Q", "context": "Given ...", "final_answer": ["1"]}, "image or a context")):
        write_jsonl(str(tmp_path / "test.jsonl"), [row])
        with pytest.raises(ValueError, match=words):
            math_data.load_eval_set("olympiadbench", tmp_path)


def test_prepared_evaluation_files_are_read_as_the_authors_wrote_them(tmp_path):
    # evaluation/prepare_data.py writes <name>.jsonl (messages, ground_truth, prompt_id) and <name>.parquet (verl).
    message = [{"role": "user", "content": "P2" + math_data.QWEN_INSTRUCTION}]
    write_jsonl(str(tmp_path / "prepared" / "aime25.jsonl"),
                [{"prompt_id": "aime25:0000", "dataset": "aime25", "index": 0, "ground_truth": "70",
                  "messages": message, "question": "P2", "source": {"problem": "P2", "answer": 70}}])
    write_parquet(str(tmp_path / "prepared" / "minerva.parquet"),
                  [{"data_source": "minerva", "ability": "math", "prompt": message,
                    "reward_model": {"style": "rule", "ground_truth": "7"},
                    "extra_info": {"split": "test", "index": 4, "question": "P3", "answer": "7"}}])
    (aime,) = math_data.load_eval_set("aime25", tmp_path / "prepared")
    assert aime == {"id": "aime25:0000", "question": "P2", "answer": "70", "source": "aime25", "messages": message}
    (minerva,) = math_data.load_eval_set("minerva", tmp_path / "prepared")
    assert minerva == {"id": "minerva::4", "question": "P3", "answer": "7", "source": "minerva", "messages": message}


def test_missing_evaluation_sets_name_the_files_the_layout_and_the_source(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        math_data.load_eval_set("beyondaime", tmp_path / "nowhere")
    message = str(info.value)
    assert "data/test.parquet" in message and "beyondaime.jsonl" in message and "problem, answer" in message
    assert "huggingface-cli download ByteDance-Seed/BeyondAIME --repo-type dataset" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has none of the expected files.*final_answer.*Qwen2\.5-Math"):
        math_data.load_eval_set("olympiadbench", tmp_path / "empty")
