"""Procedural arithmetic word problems: the offline default task of the math experiment.

A problem tells a short story about one person's stock of items that changes over a few steps
(buy, give away, multiply, share out); the question asks for the final count. The solution is one
equation per step and ends with the answer in ``\\boxed{}`` (the SFT target), so the same grader serves
this task and GSM8K.

Difficulty is set by a ``Difficulty`` spec (number of steps, operand digits, operation mix); the default
``LEVELS`` 1..5 are tuned so that a tiny from-scratch decoder solves level 1 almost always and level 5
rarely, which spreads per-prompt success rates, the regime where SERA's allocation matters.

Train/test disjointness does not depend on seeds: a problem belongs to the test split iff a stable hash of
its question text falls below ``test_fraction``, so any train set and any test set built with the same
``test_fraction`` never share a question.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import numpy as np

Op = Literal["add", "sub", "mul", "div"]
Split = Literal["train", "test"]

_ALL_OPS: tuple[str, ...] = ("add", "sub", "mul", "div")
_SPLIT_CODES: dict[str, int] = {"train": 0, "test": 1}

NAMES: tuple[str, ...] = (
    "Ann",
    "Ben",
    "Cal",
    "Dan",
    "Eve",
    "Fay",
    "Gus",
    "Hal",
    "Ivy",
    "Jo",
    "Kim",
    "Leo",
    "Max",
    "Ned",
    "Ola",
    "Pam",
    "Sam",
    "Tom",
    "Uma",
    "Zoe",
)
ITEMS: tuple[str, ...] = (
    "apples",
    "books",
    "coins",
    "cards",
    "eggs",
    "pens",
    "shells",
    "stamps",
    "marbles",
    "cookies",
)
# One short sentence per operation; {n} is the name, {k} the operand. No pronouns, so no gender logic.
_EVENT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "add": ("{n} buys {k} more.", "{n} finds {k} more.", "{n} gets {k} more."),
    "sub": ("{n} gives away {k}.", "{n} sells {k}.", "{n} loses {k}."),
    "mul": ("Then {n} has {k} times as many.", "{n} ends up with {k} times as many."),
    "div": ("{n} splits them into {k} equal piles and keeps one.", "{n} keeps one of {k} equal shares."),
}
_SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# Multipliers and divisors stay single-digit whatever the level: the level's digits bound addends.
_MIN_FACTOR, _MAX_FACTOR = 2, 9


@dataclasses.dataclass(frozen=True)
class Difficulty:
    """How hard a problem is.

    Attributes:
      level: label stored in each problem's metadata.
      num_steps: operations applied to the starting count (one equation each in the solution).
      max_digits: the starting count and every addend/subtrahend have at most this many digits.
      ops: operations to draw from; an operation invalid at the current value (a division without
        an exact single-digit divisor, a product past the cap) is replaced by a valid one.
      max_value: cap on every intermediate and final count; defaults to ``10 ** (max_digits + 1) - 1``.
    """

    level: int
    num_steps: int
    max_digits: int
    ops: tuple[str, ...]
    max_value: int | None = None

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.max_digits < 1:
            raise ValueError(f"max_digits must be >= 1, got {self.max_digits}")
        if not self.ops or any(op not in _ALL_OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of {_ALL_OPS}, got {self.ops}")
        if self.max_value is not None and self.max_value < 10**self.max_digits:
            raise ValueError(f"max_value must be >= 10**max_digits, got {self.max_value}")

    @property
    def cap(self) -> int:
        """Largest count allowed at any step."""
        return self.max_value if self.max_value is not None else 10 ** (self.max_digits + 1) - 1


LEVELS: dict[int, Difficulty] = {
    1: Difficulty(level=1, num_steps=1, max_digits=1, ops=("add", "sub")),
    2: Difficulty(level=2, num_steps=2, max_digits=2, ops=("add", "sub")),
    3: Difficulty(level=3, num_steps=2, max_digits=2, ops=("add", "sub", "mul")),
    4: Difficulty(level=4, num_steps=3, max_digits=2, ops=_ALL_OPS),
    5: Difficulty(level=5, num_steps=4, max_digits=2, ops=_ALL_OPS),
}


@dataclasses.dataclass(frozen=True)
class ArithmeticProblem:
    """One word problem: question, SFT solution ending in ``\\boxed{answer}``, answer and metadata."""

    id: str
    question: str
    solution: str
    answer: int
    level: int
    ops: tuple[str, ...]

    def to_record(self) -> dict[str, object]:
        """The data pipeline's uniform record plus ``solution`` and ``level``."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": str(self.answer),
            "source": "arithmetic",
            "solution": self.solution,
            "level": self.level,
        }


def apply_op(op: str, value: int, operand: int) -> int:
    """The count after one step; division must be exact."""
    if op == "add":
        return value + operand
    if op == "sub":
        return value - operand
    if op == "mul":
        return value * operand
    if op == "div":
        if value % operand:
            raise ValueError(f"operand {operand} does not divide value {value}")
        return value // operand
    raise ValueError(f"op must be one of {_ALL_OPS}, got {op!r}")


def _operand_range(op: str, value: int, spec: Difficulty) -> list[int] | tuple[int, int] | None:
    """Operands keeping the count a positive integer <= cap: inclusive (lo, hi), a list, or None."""
    max_operand = 10**spec.max_digits - 1
    if op == "add":
        hi = min(max_operand, spec.cap - value)
        return (1, hi) if hi >= 1 else None
    if op == "sub":
        hi = min(max_operand, value - 1)  # keep at least one item so the story stays sensible
        return (1, hi) if hi >= 1 else None
    if op == "mul":
        hi = min(_MAX_FACTOR, spec.cap // value)
        return (_MIN_FACTOR, hi) if hi >= _MIN_FACTOR else None
    divisors = [k for k in range(_MIN_FACTOR, _MAX_FACTOR + 1) if value % k == 0]
    return divisors or None


def _draw(rng: np.random.Generator, choices: list[int] | tuple[int, int]) -> int:
    if isinstance(choices, tuple):
        return int(rng.integers(choices[0], choices[1] + 1))
    return int(choices[int(rng.integers(len(choices)))])


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def sample_problem(rng: np.random.Generator, spec: Difficulty, problem_id: str = "") -> ArithmeticProblem:
    """Draws one problem of difficulty ``spec`` from ``rng`` (advances ``rng``)."""
    name, items = _pick(rng, NAMES), _pick(rng, ITEMS)
    value = int(rng.integers(2, 10**spec.max_digits))
    sentences = [f"{name} has {value} {items}."]
    equations = []
    ops = []
    for _ in range(spec.num_steps):
        ranges = {op: _operand_range(op, value, spec) for op in spec.ops}
        valid = [op for op in spec.ops if ranges[op] is not None]
        if not valid:  # e.g. only "add" allowed and the count sits at the cap: fall back to subtraction
            ranges["sub"] = _operand_range("sub", value, spec)
            valid = ["sub"]
        op = _pick(rng, valid)
        operand = _draw(rng, ranges[op])
        result = apply_op(op, value, operand)
        sentences.append(_pick(rng, _EVENT_TEMPLATES[op]).format(n=name, k=operand))
        equations.append(f"{value} {_SYMBOLS[op]} {operand} = {result}.")
        ops.append(op)
        value = result
    sentences.append(f"How many {items} does {name} have now?")
    solution = " ".join(equations) + f" The answer is \\boxed{{{value}}}."
    return ArithmeticProblem(
        id=problem_id,
        question=" ".join(sentences),
        solution=solution,
        answer=value,
        level=spec.level,
        ops=tuple(ops),
    )


def in_test_split(question: str, test_fraction: float) -> bool:
    """Whether ``question`` belongs to the test split: a seed-independent hash of the text."""
    digest = hashlib.blake2b(question.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < test_fraction


def level_counts(num: int, weights: Sequence[float]) -> list[int]:
    """Splits ``num`` into integer counts proportional to ``weights`` (largest remainder, ties to earlier)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"level_weights must be non-negative with a positive sum, got {list(weights)}")
    exact = num * w / w.sum()
    counts = np.floor(exact).astype(int)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: num - counts.sum()]] += 1
    return counts.tolist()


def generate_problems(
    num: int,
    *,
    seed: int,
    split: Split = "train",
    levels: Sequence[int] | Mapping[int, Difficulty] = (1, 2, 3, 4, 5),
    level_weights: Sequence[float] | None = None,
    test_fraction: float = 0.1,
    unique: bool = True,
    max_attempts_per_problem: int = 1000,
) -> list[ArithmeticProblem]:
    """``num`` problems of ``split`` with an exact difficulty mix, deterministic in ``seed``.

    Args:
      num: number of problems.
      seed: the same (seed, split, levels, weights) gives the same list.
      split: "train" keeps problems outside the test hash bucket, "test" those inside it.
      levels: level numbers from ``LEVELS``, or a mapping level -> custom ``Difficulty``.
      level_weights: relative share of each level (default equal); counts are exact, order shuffled.
      test_fraction: share of the problem space reserved for the test split, in (0, 1).
      unique: no question text repeats within the returned list.
      max_attempts_per_problem: rejection-sampling budget; exceeded when a level's space is exhausted.

    Returns:
      Problems with ids ``arith-{split}-{seed}-{index}``, shuffled across levels.
    """
    if split not in _SPLIT_CODES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    specs = _resolve_levels(levels)
    weights = [1.0] * len(specs) if level_weights is None else list(level_weights)
    if len(weights) != len(specs):
        raise ValueError(f"level_weights has {len(weights)} entries for {len(specs)} levels")
    counts = level_counts(num, weights)
    split_code = _SPLIT_CODES[split]
    want_test = split == "test"
    seen: set[str] = set()
    problems: list[ArithmeticProblem] = []
    for spec, count in zip(specs, counts, strict=True):
        # One stream per level: a level's problems do not depend on how many other levels were asked for.
        rng = np.random.default_rng([seed, split_code, spec.level])
        attempts, kept = 0, 0
        while kept < count:
            if attempts >= max_attempts_per_problem * count:
                raise ValueError(
                    f"levels: level {spec.level} ran out of distinct {split} problems after {attempts} "
                    f"draws ({kept}/{count} kept); lower num, raise difficulty or set unique=False"
                )
            attempts += 1
            problem = sample_problem(rng, spec)
            if in_test_split(problem.question, test_fraction) != want_test:
                continue
            if unique and problem.question in seen:
                continue
            seen.add(problem.question)
            problems.append(problem)
            kept += 1
    order = np.random.default_rng([seed, split_code, 2**32 - 1]).permutation(len(problems))
    return [dataclasses.replace(problems[j], id=f"arith-{split}-{seed}-{i}") for i, j in enumerate(order)]


def _resolve_levels(levels: Sequence[int] | Mapping[int, Difficulty]) -> list[Difficulty]:
    if isinstance(levels, Mapping):
        specs = list(levels.values())
    else:
        unknown = [lv for lv in levels if lv not in LEVELS]
        if unknown:
            raise ValueError(f"levels: unknown level(s) {unknown}; known {sorted(LEVELS)}")
        specs = [LEVELS[lv] for lv in levels]
    if not specs:
        raise ValueError("levels must name at least one level")
    level_ids = [spec.level for spec in specs]
    if len(set(level_ids)) != len(level_ids):  # equal levels would share a random stream
        raise ValueError(f"levels: each level must appear once, got {level_ids}")
    return specs


def corpus(num: int = 2000, *, seed: int = 0, extra_texts: Sequence[str] = ()) -> Iterator[str]:
    """Texts to train the task's tokenizer on: questions and solutions of train problems, then extras.

    ``extra_texts`` carries strings the model will also see (prompt suffixes), so they tokenise compactly.
    """
    for problem in generate_problems(num, seed=seed, split="train", unique=False):
        yield problem.question
        yield problem.solution
    yield from extra_texts
