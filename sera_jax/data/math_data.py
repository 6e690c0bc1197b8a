"""Math datasets from local files in the Hugging Face dataset layout (JSONL or parquet), and the prompt.

Every loader returns records ``{"id", "question", "answer", "source"}`` (strings; ``answer`` is the final
answer only, e.g. GSM8K's text after ``####`` without thousands commas). Nothing is downloaded: copy the
dataset repository (``huggingface-cli download REPO --repo-type dataset --local-dir DIR`` on a machine
with network access) and point the loader at DIR (or at the file itself).

Prompt (docs/method.md §8C, as in MaxRL): the question, a space, then
"Let's think step by step and output the final answer within \\boxed{}."; both suffix and separator are
arguments.

The SERA authors' rows (ChenZihao0121/SERA @ 3252ed5) come in two more layouts, read by the same loaders:

- **prepared**: their training parquet (verl: ``prompt`` a chat list, ``reward_model.ground_truth``,
  ``data_source``, ``extra_info.index``; ``qwen/prepare_polaris.py``, their ``data/math35/train.parquet`` of
  SimpleRL-Zoo rows) and the evaluation files of ``evaluation/prepare_data.py`` (``<name>.jsonl`` with
  ``messages`` and ``ground_truth``, ``<name>.parquet`` in the verl layout). The chat list already holds their
  instruction, so such a record carries ``messages`` and the task renders them as they are (no suffix added).
  Dataset ``verl`` is this layout alone (the training sets); every evaluation set reads it too.
- **pinned sources** of their benchmarks (``evaluation/paper_assets.json``): BeyondAIME, AIME 2025, MATH-500,
  Minerva Math, OlympiadBench (the Qwen2.5-Math copy) and GSM8K-Platinum, each with its own question and answer
  fields; the answer is normalised as their ``convert_rows`` does it (OlympiadBench: its one ``final_answer``
  without ``$``; rows with images, context or several answers are refused, as theirs).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sera_jax.data.parquet import read_parquet

Record = dict[str, Any]  # id, question, answer, source (str); "messages" (a chat list) for prepared rows

PROMPT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
# The SERA authors' Qwen instruction (evaluation/prepare_data.py:16, qwen/prepare_polaris.py:10), appended to the
# problem with no separator. A plain literal that is never formatted, so its "{{}}" reaches the prompt doubled.
QWEN_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def format_prompt(question: str, suffix: str = PROMPT_SUFFIX, separator: str = " ", *, strip: bool = True) -> str:
    """The paper's prompt: ``question + separator + suffix`` (no suffix when ``suffix`` is empty); ``strip``:
    the question without its surrounding whitespace (the SERA authors append to the problem as it is)."""
    question = question.strip() if strip else question
    return f"{question}{separator}{suffix}" if suffix else question


def to_messages(
    question: str, suffix: str = PROMPT_SUFFIX, *, separator: str = " ", system: str | None = None, strip: bool = True
) -> list[dict[str, str]]:
    """Chat messages (one user turn, optional system turn) for a tokenizer's chat template."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    return [*messages, {"role": "user", "content": format_prompt(question, suffix, separator, strip=strip)}]


# ----------------------------------------------------------------------------------------------- readers


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a JSON Lines file (blank lines skipped); a .json file holding one list is accepted too."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    rows = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_number} is not JSON ({e.msg})") from e
    return rows


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json or .parquet file (``sera_jax.data.parquet``), by extension."""
    if os.fspath(path).endswith(".parquet"):
        return read_parquet(path)
    return read_jsonl(path)


# --------------------------------------------------------------------------------------- dataset specs


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's files live under its directory and how its rows become records.

    ``patterns`` are globs relative to the data directory, ``{split}`` substituted, tried in order; the
    first that matches any file wins and its matches are read in sorted order (shards). ``hf_repo``: where
    the files come from (empty: no public repository); ``layout``: the fields a row must have (for errors).
    """

    name: str
    hf_repo: str
    patterns: tuple[str, ...]
    to_record: Callable[[Mapping[str, Any], str], Record]
    default_split: str
    layout: str = ""


def gsm8k_final_answer(solution: str) -> str:
    """Final answer of a GSM8K solution: the text after its last ``####``, without thousands commas."""
    marker = solution.rfind("####")
    if marker < 0:
        raise ValueError(f"answer: GSM8K solution has no '####' marker: {solution[-80:]!r}")
    return solution[marker + 4 :].strip().replace(",", "")


def _field(row: Mapping[str, Any], name: str, source: str) -> Any:
    if name not in row or row[name] is None:
        raise ValueError(f"{source}: row lacks field {name!r} (has {sorted(row)})")
    return row[name]


def _gsm8k_record(row: Mapping[str, Any], source: str) -> Record:
    return {
        "question": str(_field(row, "question", source)),
        "answer": gsm8k_final_answer(str(_field(row, "answer", source))),
    }


def _problem_answer_record(row: Mapping[str, Any], source: str) -> Record:
    record = {
        "question": str(_field(row, "problem", source)),
        "answer": str(_field(row, "answer", source)).strip(),
    }
    if "unique_id" in row:  # MATH-500's stable id ("test/precalculus/807.json")
        record["id"] = str(row["unique_id"])
    return record


def _question_answer_record(row: Mapping[str, Any], source: str) -> Record:
    """Minerva Math (math-ai/minervamath): question / answer."""
    return {"question": str(_field(row, "question", source)), "answer": str(_field(row, "answer", source)).strip()}


def olympiad_final_answer(final_answer: Any, source: str = "final_answer") -> str:
    """OlympiadBench's reference answer as the SERA authors grade it (evaluation/prepare_data.py:54-56): its
    ``final_answer`` list must hold exactly one answer, taken without its surrounding ``$``."""
    if not isinstance(final_answer, (list, tuple)) or len(final_answer) != 1:
        raise ValueError(f"{source}: OlympiadBench 'final_answer' must be a list of exactly one answer (the "
                         f"authors' text-only, single-answer set), got {final_answer!r}")
    return str(final_answer[0]).strip("$")


def _olympiad_record(row: Mapping[str, Any], source: str) -> Record:
    question = str(_field(row, "question", source))
    if "<img" in question or row.get("context"):
        raise ValueError(f"{source}: OlympiadBench row has an image or a context; the authors' set (Qwen2.5-Math's "
                         "evaluation/data/olympiadbench/test.jsonl) is English text-only")
    return {"question": question, "answer": olympiad_final_answer(_field(row, "final_answer", source), source)}


def _chat_list(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value))


PREPARED_LAYOUT = ("the SERA authors' prepared rows: a chat list [{'role', 'content'}, ...] under 'prompt' (verl "
                   "parquet) or 'messages' (evaluation/prepare_data.py's JSONL), and the reference answer under "
                   "'reward_model.ground_truth' or 'ground_truth'")


def prepared_record(row: Mapping[str, Any], source: str) -> Record:
    """A row the SERA authors prepared (verl parquet or their evaluation JSONL) as a record whose ``messages``
    are the chat turns as they stored them (their instruction included); ``answer`` is the ground truth as their
    reward function receives it; ``id`` their estimator's prompt key ``data_source::index`` when the row has
    ``extra_info.index`` (``ray_trainer.py``'s ``_SERA_stable_prompt_keys``), else their ``prompt_id``."""
    chat = row.get("messages", row.get("prompt"))
    if not _chat_list(chat):
        raise ValueError(f"{source}: no chat list under 'messages' or 'prompt' (expected {PREPARED_LAYOUT}); "
                         f"row has {sorted(row)}")
    gold = row.get("ground_truth")
    if gold is None:
        reward = row.get("reward_model")
        gold = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    if gold is None or not str(gold).strip():
        raise ValueError(f"{source}: no reference answer under 'reward_model.ground_truth' or 'ground_truth' "
                         f"(expected {PREPARED_LAYOUT}); row has {sorted(row)}")
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in chat]
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    users = [m["content"] for m in messages if m["role"] == "user"]
    record: Record = {"question": str(extra.get("question") or row.get("question") or (users or [""])[-1]),
                      "answer": str(gold), "messages": messages}
    if extra.get("index") is not None:
        record["id"] = f"{row.get('data_source', 'unknown')}::{extra['index']}"
    elif row.get("prompt_id"):
        record["id"] = str(row["prompt_id"])
    return record


def _or_prepared(to_record: Callable[[Mapping[str, Any], str], Record]) -> Callable[[Mapping[str, Any], str], Record]:
    """``to_record`` for a dataset's own layout, ``prepared_record`` for a row the SERA authors prepared (one
    with a chat list under ``prompt`` or ``messages``: no source layout has one)."""

    def read(row: Mapping[str, Any], source: str) -> Record:
        if _chat_list(row.get("messages")) or _chat_list(row.get("prompt")):
            return prepared_record(row, source)
        return to_record(row, source)

    return read


_HF_PARQUET = (
    "main/{split}-*.parquet",
    "data/{split}-*.parquet",
    "{split}-*.parquet",
    "default/{split}/*.parquet",
)


def _prepared(name: str) -> tuple[str, str]:
    """The file names ``evaluation/prepare_data.py`` writes for dataset ``name``."""
    return f"{name}.jsonl", f"{name}.parquet"


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        name="gsm8k",
        hf_repo="openai/gsm8k",
        patterns=(
            "{split}.jsonl",
            *_HF_PARQUET,
            "main/{split}.jsonl",
            "grade_school_math/data/{split}.jsonl",
            "{split}.parquet",
        ),
        to_record=_or_prepared(_gsm8k_record),
        default_split="train",
        layout="question, answer (a solution ending in '#### final answer'); or a train.parquet of " + PREPARED_LAYOUT,
    ),
    "gsm8k_platinum": DatasetSpec(
        name="gsm8k_platinum",
        hf_repo="madrylab/gsm8k-platinum",
        patterns=("{split}.jsonl", *_HF_PARQUET, "main/{split}.jsonl", *_prepared("gsm8k_platinum")),
        to_record=_or_prepared(_gsm8k_record),
        default_split="test",
        layout="question, answer (a solution ending in '#### final answer'), cleaning_status; or " + PREPARED_LAYOUT,
    ),
    "math500": DatasetSpec(
        name="math500",
        hf_repo="HuggingFaceH4/MATH-500",
        patterns=("{split}.jsonl", *_HF_PARQUET, *_prepared("math500")),
        to_record=_or_prepared(_problem_answer_record),
        default_split="test",
        layout="problem, answer, unique_id; or " + PREPARED_LAYOUT,
    ),
    "polaris": DatasetSpec(
        name="polaris",
        hf_repo="POLARIS-Project/Polaris-Dataset-53K",
        patterns=("polaris-data-53K.jsonl", "{split}.jsonl", *_HF_PARQUET, "{split}.parquet"),
        to_record=_or_prepared(_problem_answer_record),
        default_split="train",
        layout="problem, answer; or qwen/prepare_polaris.py's train.parquet (" + PREPARED_LAYOUT + ")",
    ),
    # The SERA authors' evaluation sets (evaluation/paper_assets.json): the pinned source file of each, or the
    # files their evaluation/prepare_data.py writes (<name>.jsonl / <name>.parquet).
    "beyondaime": DatasetSpec(
        name="beyondaime",
        hf_repo="ByteDance-Seed/BeyondAIME",
        patterns=("data/{split}.parquet", "{split}.parquet", "{split}.jsonl", *_HF_PARQUET, *_prepared("beyondaime")),
        to_record=_or_prepared(_problem_answer_record),
        default_split="test",
        layout="problem, answer (data/test.parquet, 100 rows); or " + PREPARED_LAYOUT,
    ),
    "aime25": DatasetSpec(
        name="aime25",
        hf_repo="math-ai/aime25",
        patterns=("{split}.jsonl", *_HF_PARQUET, *_prepared("aime25")),
        to_record=_or_prepared(_problem_answer_record),
        default_split="test",
        layout="problem, answer (test.jsonl, 30 rows); or " + PREPARED_LAYOUT,
    ),
    "minerva": DatasetSpec(
        name="minerva",
        hf_repo="math-ai/minervamath",
        patterns=("{split}.jsonl", *_HF_PARQUET, *_prepared("minerva")),
        to_record=_or_prepared(_question_answer_record),
        default_split="test",
        layout="question, answer (test.jsonl, 272 rows); or " + PREPARED_LAYOUT,
    ),
    "olympiadbench": DatasetSpec(
        name="olympiadbench",
        hf_repo="",  # QwenLM/Qwen2.5-Math on GitHub, evaluation/data/olympiadbench/test.jsonl at a45202b
        patterns=("{split}.jsonl", "evaluation/data/olympiadbench/{split}.jsonl", *_prepared("olympiadbench")),
        to_record=_or_prepared(_olympiad_record),
        default_split="test",
        layout=("question, final_answer (a list of one answer; QwenLM/Qwen2.5-Math@a45202b "
                "evaluation/data/olympiadbench/test.jsonl, 675 rows); or " + PREPARED_LAYOUT),
    ),
    # Training rows the SERA authors prepared (verl parquet): their data/math35/train.parquet (8,192 MATH level 3-5
    # rows of hkust-nlp/SimpleRL-Zoo-Data, whose simplelr_qwen_level3to5/train.parquet has the same layout),
    # qwen/prepare_polaris.py's data/polaris/train.parquet, a GSM8K train.parquet.
    "verl": DatasetSpec(
        name="verl",
        hf_repo="",
        patterns=("{split}.parquet", "simplelr_qwen_level3to5/{split}.parquet", *_HF_PARQUET),
        to_record=prepared_record,
        default_split="train",
        layout=PREPARED_LAYOUT,
    ),
}
EVAL_SETS = ("gsm8k_platinum", "math500", "beyondaime", "aime25", "olympiadbench", "minerva")  # data.eval_sets


def find_files(data_dir: str | os.PathLike[str], spec: DatasetSpec, split: str) -> list[str]:
    """Files holding ``split`` of ``spec`` in ``data_dir`` (``data_dir`` itself when it is a file);
    FileNotFoundError says what belongs there."""
    data_dir = os.fspath(data_dir)
    patterns = [p.format(split=split) for p in spec.patterns]
    if os.path.isfile(data_dir):
        return [data_dir]
    if os.path.isdir(data_dir):
        for pattern in patterns:
            matches = sorted(glob.glob(os.path.join(glob.escape(data_dir), pattern)))
            if matches:
                return matches
    state = "has none of the expected files" if os.path.isdir(data_dir) else "does not exist"
    layout = f", rows with {spec.layout}" if spec.layout else ""
    where = (f"(Hugging Face dataset {spec.hf_repo}{layout}). Download it on a machine with network access with "
             f"`huggingface-cli download {spec.hf_repo} --repo-type dataset --local-dir <dir>` and copy the "
             "folder here" if spec.hf_repo else f"(rows with {spec.layout}). Copy the files here")
    raise FileNotFoundError(
        f"{spec.name} ({split} split): directory {data_dir!r} {state}. Expected a file or one of {patterns} "
        f"{where}; nothing is fetched at run time."
    )


def load_math_dataset(
    name: str,
    data_dir: str | os.PathLike[str],
    split: str | None = None,
    *,
    limit: int | None = None,
) -> list[Record]:
    """Records of dataset ``name`` (a key of ``DATASETS``) read from ``data_dir``.

    Ids are the dataset's own when it has them (MATH-500; the SERA authors' prompt key of a prepared row), else
    ``{name}/{split}/{row index}``. A prepared row's record also carries its ``messages`` (``prepared_record``).
    GSM8K-Platinum rows whose ``cleaning_status`` is "rejected" are dropped (the benchmark removes them).
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {sorted(DATASETS)}, got {name!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    spec = DATASETS[name]
    split = spec.default_split if split is None else split
    records: list[Record] = []
    index = 0
    for path in find_files(data_dir, spec, split):
        for row in read_rows(path):
            if name == "gsm8k_platinum" and row.get("cleaning_status") == "rejected":
                index += 1
                continue
            record = spec.to_record(row, f"{path} row {index}")
            records.append(
                {
                    "id": record.get("id", f"{name}/{split}/{index}"),
                    "question": record["question"],
                    "answer": record["answer"],
                    "source": name,
                    **({"messages": record["messages"]} if "messages" in record else {}),
                }
            )
            index += 1
            if limit is not None and len(records) >= limit:
                return records
    return records


def load_gsm8k(
    data_dir: str | os.PathLike[str], split: str = "train", *, limit: int | None = None
) -> list[Record]:
    """GSM8K (openai/gsm8k, config "main"): question + solution ending in ``#### answer``; 7,473 train."""
    return load_math_dataset("gsm8k", data_dir, split, limit=limit)


def load_gsm8k_platinum(
    data_dir: str | os.PathLike[str], split: str = "test", *, limit: int | None = None
) -> list[Record]:
    """GSM8K-Platinum (madrylab/gsm8k-platinum): the relabelled GSM8K test split, same fields."""
    return load_math_dataset("gsm8k_platinum", data_dir, split, limit=limit)


def load_math500(
    data_dir: str | os.PathLike[str], split: str = "test", *, limit: int | None = None
) -> list[Record]:
    """MATH-500 (HuggingFaceH4/MATH-500): problem / solution / answer, test.jsonl."""
    return load_math_dataset("math500", data_dir, split, limit=limit)


def load_polaris(
    data_dir: str | os.PathLike[str], split: str = "train", *, limit: int | None = None
) -> list[Record]:
    """POLARIS-53K (POLARIS-Project/Polaris-Dataset-53K): problem / answer, polaris-data-53K.jsonl."""
    return load_math_dataset("polaris", data_dir, split, limit=limit)


def load_verl(
    data_dir: str | os.PathLike[str], split: str = "train", *, limit: int | None = None
) -> list[Record]:
    """Training rows the SERA authors prepared in verl's layout (``prepared_record``): their
    ``data/math35/train.parquet`` (SimpleRL-Zoo MATH levels 3-5), ``data/polaris/train.parquet``, ...;
    ``data_dir`` is the file or a folder holding ``{split}.parquet``."""
    return load_math_dataset("verl", data_dir, split, limit=limit)


def load_eval_set(name: str, data_dir: str | os.PathLike[str], *, limit: int | None = None) -> list[Record]:
    """Test split of evaluation set ``name`` (one of ``EVAL_SETS``): its pinned source file or the SERA authors'
    prepared file, from ``data_dir`` (a folder or the file)."""
    if name not in EVAL_SETS:
        raise ValueError(f"evaluation set {name!r}: must be one of {list(EVAL_SETS)}")
    return load_math_dataset(name, data_dir, "test", limit=limit)


def prompts_and_answers(
    records: Sequence[Mapping[str, str]], suffix: str = PROMPT_SUFFIX, separator: str = " "
) -> tuple[list[str], list[str]]:
    """Formatted prompts and reference answers, aligned with ``records``."""
    return [format_prompt(r["question"], suffix, separator) for r in records], [r["answer"] for r in records]
