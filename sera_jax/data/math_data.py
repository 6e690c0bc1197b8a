"""Math datasets from local files in the Hugging Face dataset layout (JSONL or parquet), and the prompt.

Every loader returns records ``{"id", "question", "answer", "source"}`` (strings; ``answer`` is the final
answer only, e.g. GSM8K's text after ``####`` without thousands commas). Nothing is downloaded: copy the
dataset repository (``huggingface-cli download REPO --repo-type dataset --local-dir DIR`` on a machine
with network access) and point the loader at DIR.

Prompt (SERA.md §8C, as in MaxRL): the question, a space, then
"Let's think step by step and output the final answer within \\boxed{}."; both suffix and separator are
arguments.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Record = dict[str, str]

PROMPT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."


def format_prompt(question: str, suffix: str = PROMPT_SUFFIX, separator: str = " ") -> str:
    """The paper's prompt: ``question + separator + suffix`` (no suffix when ``suffix`` is empty)."""
    question = question.strip()
    return f"{question}{separator}{suffix}" if suffix else question


def to_messages(
    question: str, suffix: str = PROMPT_SUFFIX, *, separator: str = " ", system: str | None = None
) -> list[dict[str, str]]:
    """Chat messages (one user turn, optional system turn) for a tokenizer's chat template."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    return [*messages, {"role": "user", "content": format_prompt(question, suffix, separator)}]


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


def read_parquet(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a parquet file, through pyarrow (the `math` extra)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(f"reading {path} needs pyarrow: pip install 'sera_jax[math]'") from e
    return pq.read_table(path).to_pylist()


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json or .parquet file, by extension."""
    if os.fspath(path).endswith(".parquet"):
        return read_parquet(path)
    return read_jsonl(path)


# --------------------------------------------------------------------------------------- dataset specs


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's files live under its directory and how its rows become records.

    ``patterns`` are globs relative to the data directory, ``{split}`` substituted, tried in order; the
    first that matches any file wins and its matches are read in sorted order (shards).
    """

    name: str
    hf_repo: str
    patterns: tuple[str, ...]
    to_record: Callable[[Mapping[str, Any], str], Record]
    default_split: str


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


_HF_PARQUET = (
    "main/{split}-*.parquet",
    "data/{split}-*.parquet",
    "{split}-*.parquet",
    "default/{split}/*.parquet",
)

DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        name="gsm8k",
        hf_repo="openai/gsm8k",
        patterns=(
            "{split}.jsonl",
            *_HF_PARQUET,
            "main/{split}.jsonl",
            "grade_school_math/data/{split}.jsonl",
        ),
        to_record=_gsm8k_record,
        default_split="train",
    ),
    "gsm8k_platinum": DatasetSpec(
        name="gsm8k_platinum",
        hf_repo="madrylab/gsm8k-platinum",
        patterns=("{split}.jsonl", *_HF_PARQUET, "main/{split}.jsonl"),
        to_record=_gsm8k_record,
        default_split="test",
    ),
    "math500": DatasetSpec(
        name="math500",
        hf_repo="HuggingFaceH4/MATH-500",
        patterns=("{split}.jsonl", *_HF_PARQUET),
        to_record=_problem_answer_record,
        default_split="test",
    ),
    "polaris": DatasetSpec(
        name="polaris",
        hf_repo="POLARIS-Project/Polaris-Dataset-53K",
        patterns=("polaris-data-53K.jsonl", "{split}.jsonl", *_HF_PARQUET),
        to_record=_problem_answer_record,
        default_split="train",
    ),
}


def find_files(data_dir: str | os.PathLike[str], spec: DatasetSpec, split: str) -> list[str]:
    """Files holding ``split`` of ``spec`` in ``data_dir``; FileNotFoundError says what belongs there."""
    data_dir = os.fspath(data_dir)
    patterns = [p.format(split=split) for p in spec.patterns]
    if os.path.isdir(data_dir):
        for pattern in patterns:
            matches = sorted(glob.glob(os.path.join(glob.escape(data_dir), pattern)))
            if matches:
                return matches
    state = "has none of the expected files" if os.path.isdir(data_dir) else "does not exist"
    raise FileNotFoundError(
        f"{spec.name} ({split} split): directory {data_dir!r} {state}. Expected one of {patterns} "
        f"(Hugging Face dataset {spec.hf_repo}). Download it on a machine with network access with "
        f"`huggingface-cli download {spec.hf_repo} --repo-type dataset --local-dir <dir>` and copy the "
        "folder here; nothing is fetched at run time."
    )


def load_math_dataset(
    name: str,
    data_dir: str | os.PathLike[str],
    split: str | None = None,
    *,
    limit: int | None = None,
) -> list[Record]:
    """Records of dataset ``name`` (a key of ``DATASETS``) read from ``data_dir``.

    Ids are the dataset's own when it has them (MATH-500), else ``{name}/{split}/{row index}``.
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


def prompts_and_answers(
    records: Sequence[Mapping[str, str]], suffix: str = PROMPT_SUFFIX, separator: str = " "
) -> tuple[list[str], list[str]]:
    """Formatted prompts and reference answers, aligned with ``records``."""
    return [format_prompt(r["question"], suffix, separator) for r in records], [r["answer"] for r in records]
