"""Tests for the procedural arithmetic word problems."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.envs import arithmetic, math_grading

# Independent reading of the question text: the start count, then one sentence per step. Written from
# the English, not from the generator's templates, so a template/operation mix-up shows as a mismatch.
_START_RE = re.compile(r"^\w+ has (\d+) \w+\.")
_STEP_PATTERNS = (
    (re.compile(r"(?:buys|finds|gets) (\d+) more\."), lambda v, k: v + k),
    (re.compile(r"(?:gives away|sells|loses) (\d+)\."), lambda v, k: v - k),
    (re.compile(r"has (\d+) times as many\.|ends up with (\d+) times as many\."), lambda v, k: v * k),
    (re.compile(r"into (\d+) equal piles and keeps one\.|keeps one of (\d+) equal shares\."), None),
)


def solve_question(question: str) -> tuple[int, int]:
    """(answer, number of steps) read off the question text."""
    sentences = re.findall(r"[^.?]+[.?]", question)
    value = int(_START_RE.match(sentences[0].strip()).group(1))
    steps = 0
    for sentence in sentences[1:-1]:
        for pattern, fn in _STEP_PATTERNS:
            m = pattern.search(sentence)
            if m:
                k = int(next(g for g in m.groups() if g is not None))
                if fn is None:
                    assert value % k == 0, question
                    value //= k
                else:
                    value = fn(value, k)
                steps += 1
                break
        else:
            raise AssertionError(f"unparsed sentence {sentence!r}")
    assert sentences[-1].strip().startswith("How many"), question
    return value, steps


@pytest.fixture(scope="module")
def train_problems():
    return arithmetic.generate_problems(1500, seed=0, split="train")


def test_answers_match_an_independent_reading_of_the_question(train_problems):
    for p in train_problems:
        answer, steps = solve_question(p.question)
        assert answer == p.answer, p
        assert steps == arithmetic.LEVELS[p.level].num_steps


def test_solution_equations_are_correct_and_chain_to_the_boxed_answer(train_problems):
    for p in train_problems:
        equations = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)\.", p.solution)
        assert len(equations) == len(p.ops) == arithmetic.LEVELS[p.level].num_steps
        previous = int(_START_RE.match(p.question).group(1))
        for a, op, b, c in equations:
            a, b, c = int(a), int(b), int(c)
            assert a == previous
            expected = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            assert op != "/" or a % b == 0
            assert c == expected
            previous = c
        assert previous == p.answer
        assert p.solution.endswith(f"\\boxed{{{p.answer}}}.")


def test_difficulty_limits_are_respected(train_problems):
    for p in train_problems:
        spec = arithmetic.LEVELS[p.level]
        assert set(p.ops) <= set(spec.ops)
        numbers = [int(x) for x in re.findall(r"\d+", p.solution)]
        assert max(numbers) <= spec.cap and min(numbers) >= 1
        operands = [int(b) for _, op, b in re.findall(r"(\d+) ([-+*/]) (\d+)", p.solution) if op in "+-"]
        assert all(len(str(b)) <= spec.max_digits for b in operands)
        assert len(str(int(_START_RE.match(p.question).group(1)))) <= spec.max_digits


def test_every_operation_of_a_level_occurs(train_problems):
    for level, spec in arithmetic.LEVELS.items():
        seen = {op for p in train_problems if p.level == level for op in p.ops}
        assert seen == set(spec.ops), level


def test_deterministic_per_seed_and_different_across_seeds():
    a = arithmetic.generate_problems(50, seed=3)
    b = arithmetic.generate_problems(50, seed=3)
    c = arithmetic.generate_problems(50, seed=4)
    assert a == b
    assert [p.question for p in a] != [p.question for p in c]


def test_train_and_test_are_disjoint_across_seeds():
    train = {p.question for s in (0, 1) for p in arithmetic.generate_problems(800, seed=s, split="train")}
    test = {p.question for s in (0, 1) for p in arithmetic.generate_problems(300, seed=s, split="test")}
    assert not train & test
    assert all(arithmetic.in_test_split(q, 0.1) for q in test)
    assert not any(arithmetic.in_test_split(q, 0.1) for q in train)


def test_questions_are_unique_and_ids_follow_the_order():
    problems = arithmetic.generate_problems(400, seed=5, split="test")
    assert len({p.question for p in problems}) == 400
    assert [p.id for p in problems] == [f"arith-test-5-{i}" for i in range(400)]


def test_level_mix_counts_are_exact():
    problems = arithmetic.generate_problems(100, seed=0, levels=(1, 3, 5), level_weights=(1, 2, 1))
    counts = {lv: sum(p.level == lv for p in problems) for lv in (1, 3, 5)}
    assert counts == {1: 25, 3: 50, 5: 25}
    assert arithmetic.level_counts(10, (1, 1, 1)) == [4, 3, 3]
    assert sum(arithmetic.level_counts(7, (0.2, 0.5, 0.3))) == 7


def test_custom_difficulty_spec():
    spec = arithmetic.Difficulty(level=7, num_steps=6, max_digits=1, ops=("mul",), max_value=10**6)
    for p in arithmetic.generate_problems(30, seed=1, levels={7: spec}):
        assert p.level == 7 and len(p.ops) == 6
        assert solve_question(p.question)[0] == p.answer


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), level=st.sampled_from(sorted(arithmetic.LEVELS)))
def test_reference_solution_grades_as_correct(seed, level):
    (p,) = arithmetic.generate_problems(1, seed=seed, levels=(level,))
    assert solve_question(p.question)[0] == p.answer
    assert math_grading.grade(p.solution, p.answer, truncated=False) == 1.0
    assert math_grading.grade(p.solution, p.answer + 1, truncated=False) == 0.0


def test_record_has_uniform_fields():
    (p,) = arithmetic.generate_problems(1, seed=0)
    record = p.to_record()
    assert {"id", "question", "answer", "source"} <= set(record)
    assert record["answer"] == str(p.answer) and record["source"] == "arithmetic"


def test_bad_arguments_raise_value_errors_naming_them():
    with pytest.raises(ValueError, match="levels"):
        arithmetic.generate_problems(5, seed=0, levels=(9,))
    with pytest.raises(ValueError, match="appear once"):
        arithmetic.generate_problems(5, seed=0, levels=(1, 1))
    with pytest.raises(ValueError, match="split"):
        arithmetic.generate_problems(5, seed=0, split="valid")
    with pytest.raises(ValueError, match="level_weights"):
        arithmetic.generate_problems(5, seed=0, levels=(1, 2), level_weights=(1.0,))
    with pytest.raises(ValueError, match="test_fraction"):
        arithmetic.generate_problems(5, seed=0, test_fraction=1.0)
    with pytest.raises(ValueError, match="ops"):
        arithmetic.Difficulty(level=1, num_steps=1, max_digits=1, ops=("pow",))
    # A budget of one draw per problem cannot fill the test split (9 in 10 draws belong to train).
    with pytest.raises(ValueError, match="levels: level 1 ran out"):
        arithmetic.generate_problems(50, seed=0, split="test", levels=(1,), max_attempts_per_problem=1)


def test_a_levels_problems_do_not_depend_on_the_other_levels():
    alone = arithmetic.generate_problems(20, seed=8, levels=(2,))
    mixed = arithmetic.generate_problems(60, seed=8, levels=(1, 2, 3))
    assert {p.question for p in alone} == {p.question for p in mixed if p.level == 2}
