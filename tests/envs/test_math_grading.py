"""Tests for answer extraction, normalisation, equivalence and grading: MaxRL's whole-response rule with both
backends (a table of where they agree and differ), truncation, the time bound on every grading call on adversarial
responses, and the counting of calls that fail."""

import os
import re
import signal
import threading
import time

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.envs import math_grading as mg


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"$\boxed{ \{1, 2\} }$", r" \{1, 2\} "),
        (r"\boxed{\text{(A) } \sqrt{\frac{3}{4}}}", r"\text{(A) } \sqrt{\frac{3}{4}}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5 apples", "5"),
        (r"\boxed {9}", "9"),
        (r"\boxed{}", ""),
        (r"\boxed{12", None),  # unclosed: truncated mid-answer
        (r"\boxed{3} and at the end \boxed{4", None),  # the last box is the final word even if broken
        (r"\boxedx{3}", None),
        ("no box here 12", None),
    ],
)
def test_last_boxed(text, expected):
    assert mg.last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected, fallback",
    [
        ("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", "18", False),
        ("#### 1 \n more text\n#### 2,125", "2,125", False),
        (r"#### 5 but \boxed{6}", "6", False),  # a box wins over ####
        ("The total is 3 + 4 = 7 apples.", None, False),
        ("The total is 3 + 4 = 7 apples.", "7", True),
        ("It costs $1,234.50 in all", "1,234.50", True),
        ("a ratio of 3/4", "3/4", True),
        ("down to -12.", "-12", True),
        ("nothing numeric", None, True),
    ],
)
def test_extract_answer(text, expected, fallback):
    assert mg.extract_answer(text, last_number_fallback=fallback) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        (r"\$1,234", "1234"),
        ("1,234,567", "1234567"),
        ("18.00", "18"),
        ("2.50", "2.5"),
        (r"50\%", "50"),
        ("18 dollars", "18"),
        (r"18 \text{ dollars}", "18"),
        (r"\text{18 cm}", "18"),
        ("12 apples.", "12"),
        ("5cm", "5"),
        (r"90^\circ", "90"),
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("x = 5", "5"),
        ("5 x", "5x"),
        ("\u22127", "-7"),
        ("(1,2)", "(1,2)"),
        (r"\sin x", r"\sinx"),
    ],
)
def test_normalize_answer(raw, expected):
    assert mg.normalize_answer(raw) == expected


def test_parse_number_is_exact():
    from fractions import Fraction

    assert mg.parse_number("-3.25") == Fraction(-13, 4)
    assert mg.parse_number("3/4") == Fraction(3, 4)
    assert mg.parse_number(r"-\frac{3}{4}") == Fraction(-3, 4)
    assert mg.parse_number(r"\frac{-3}{4}") == Fraction(-3, 4)
    assert mg.parse_number("1e3") == 1000
    assert mg.parse_number("1/0") is None
    assert mg.parse_number("1e999999") is None
    assert mg.parse_number(r"\sqrt{2}") is None


@pytest.mark.parametrize(
    "pred, ref",
    [
        ("18", "18"),
        (r"\$18.00", "18"),
        ("1,000", "1000"),
        ("0.5", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", "1/2"),
        ("-0.75", r"-\frac{3}{4}"),
        ("0.3333333333", "1/3"),  # within the default relative tolerance 1e-6
        (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"),
        (r"\frac{\pi}{2}", r"\pi/2"),
        ("2(x+1)", "2x+2"),
        (r"x^2 + 2x + 1", r"(x+1)^2"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
    ],
)
def test_equivalent(pred, ref):
    assert mg.is_equivalent(pred, ref)


@pytest.mark.parametrize(
    "pred, ref",
    [
        ("17", "18"),
        ("0.333", "1/3"),  # outside 1e-6
        ("-18", "18"),
        (r"\frac{1}{3}", "0.3"),
        ("2x+1", "2x+2"),
        ("5 x", "5"),
        ("", "0"),
        ("(1,2)", "(2,1)"),
    ],
)
def test_not_equivalent(pred, ref):
    assert not mg.is_equivalent(pred, ref)


def test_tolerance_is_configurable():
    assert mg.is_equivalent("0.333", "1/3", rel_tol=1e-2)


def test_sympy_input_is_sanitised_and_bounded():
    # Anything that could reach eval() as code is refused before sympy sees it.
    for text in ["__import__('os')", "x.__class__", "E.n", "lambda:1", r"\input{x}", "a;b"]:
        assert mg.latex_to_sympy_syntax(text) is None, text
    start = time.perf_counter()
    assert not mg.is_equivalent("9^{9^{9^{9}}}", "1")
    assert not mg.is_equivalent("10^{100000000}", "1")
    assert time.perf_counter() - start < 5.0  # generous: a blow-up would take minutes, not seconds


def test_grade_scores_and_truncation():
    response = r"3 + 4 = 7. The answer is \boxed{7}."
    assert mg.grade(response, "7", truncated=False) == 1.0
    assert mg.grade(response, 7, truncated=False) == 1.0
    assert mg.grade(response, "7", truncated=True) == 0.0  # truncated answers score 0
    assert mg.grade(response, "8", truncated=False) == 0.0
    # MaxRL's rule reads the whole response; the final-answer rule only boxes and ####.
    assert mg.grade("I think it is 7", "7", truncated=False) == 1.0
    assert mg.grade("I think it is 7", "7", truncated=True) == 0.0
    assert mg.grade("I think it is 7", "7", truncated=False, rule="final_answer") == 0.0
    assert mg.grade("I think it is 7", "7", truncated=False, rule="final_answer", last_number_fallback=True) == 1.0
    assert mg.grade("Natalia sold 48/2 = 24 clips.\n#### 72", "72", truncated=False) == 1.0
    with pytest.raises(ValueError, match="backend"):
        mg.grade(response, "7", truncated=False, backend="exact")
    with pytest.raises(ValueError, match="rule"):
        mg.grade(response, "7", truncated=False, rule="lenient")


def test_grade_batch():
    responses = [r"\boxed{1}", r"\boxed{2}", r"\boxed{3}", "no answer"]
    rewards = mg.grade_batch(responses, ["1", "5", "3", "4"], [False, False, True, False])
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="lengths differ"):
        mg.grade_batch(responses, ["1"], [False] * 4)


# (response, gold, builtin, math-verify): MaxRL's rule with each backend, values checked by hand (math-verify's
# extraction: a box or "final answer is" first, then "answer: ...", then the rightmost number or LaTeX).
GRADING_TABLE = [
    # Where the two agree.
    ("The answer is 18.", "18", 1, 1),  # unboxed: MaxRL scores it
    (r"so \boxed{18}", "18", 1, 1),
    ("I think it is 7", "7", 1, 1),  # the rightmost number
    ("3 + 4 = 7 apples.", "7", 1, 1),
    (r"The answer is \boxed{7}. Check: 7 + 1 = 8", "7", 1, 1),  # a box beats later numbers
    (r"\boxed{18} wait, actually the answer is 20", "18", 1, 1),
    ("The answer is 18 but no, it is 19", "18", 1, 1),  # "answer ... X" beats the rightmost number
    ("The answer is 18. Then I add 2 to get 20.", "18", 1, 1),
    ("The final answer is 12. I hope it is correct.", "12", 1, 1),
    ("Final answer: 1,234", "1234", 1, 1),
    ("Janet has 3 eggs.\n#### 18", "18", 1, 1),
    ("It costs $18.", "18", 1, 1),
    ("x = 5", "5", 1, 1),
    ("The answer is 18.0", "18", 1, 1),
    ("The answer is -3", "-3", 1, 1),
    ("The answer is 3.", "-3", 0, 0),
    (r"$\frac{1}{2}$", "0.5", 1, 1),
    (r"\boxed{\frac{3}{4}}", "0.75", 1, 1),
    ("The answer is 3/4.", "0.75", 1, 1),
    (r"The answer is $x^2+2x+1$", "(x+1)^2", 1, 1),
    (r"$\sqrt{8}$", r"2\sqrt{2}", 1, 1),
    ("The answer is 0.3333333", "1/3", 1, 1),
    ("The result is 2x+2", "2(x+1)", 0, 0),  # plain text algebra: both read the number 2
    ("x^2 = 4 so x = 2 or x = -2", "2", 0, 0),
    ("No digits at all", "3", 0, 0),
    # Where they differ (the builtin grader is stricter).
    ("The answer is 50%", "0.5", 0, 1),  # math-verify reads 50% as 0.5
    ("It is 12,5", "12.5", 0, 1),  # a decimal comma
    ("The answer is 1 234", "1234", 0, 1),  # a space as thousands separator
    ("The answer is 0.333333", "1/3", 0, 1),  # math-verify rounds to 6 digits; builtin: relative 1e-6
    ("The answer is 10^3", "1000", 0, 1),  # plain-text powers
]


@pytest.mark.parametrize("response, gold, builtin, _", GRADING_TABLE)
def test_builtin_grader_table(response, gold, builtin, _):
    assert mg.grade(response, gold, truncated=False) == builtin
    assert mg.grade(response, gold, truncated=True) == 0.0


def test_math_verify_grader_table():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'sera_jax[math]')")
    responses, golds, _, expected = zip(*GRADING_TABLE)
    grader = mg.Grader(backend="math_verify", num_workers=2)
    rewards, counts = grader.grade_batch(responses, golds, [False] * len(responses))
    assert counts == mg.GradingCounts(calls=len(set(responses)), timeouts=0, errors=0)
    for response, got, want in zip(responses, rewards, expected):
        assert got == want, response
    np.testing.assert_array_equal(grader.grade_batch(responses, golds, [True] * len(responses))[0], 0.0)
    # The final-answer rule reads only boxes and ####.
    assert mg.grade("The answer is 18.", "18", False, backend="math_verify", rule="final_answer") == 0.0
    assert mg.grade(r"so \boxed{\frac{1}{2}}", "0.5", False, backend="math_verify", rule="final_answer") == 1.0


def test_math_verify_backend_works_off_the_main_thread():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'sera_jax[math]')")
    result = []
    thread = threading.Thread(
        target=lambda: result.append(mg.grade(r"\boxed{0.5}", r"\frac{1}{2}", False, backend="math_verify"))
    )
    thread.start()
    thread.join()
    assert result == [1.0]


# Adversarial responses (issue 19 §3): 100,000 characters built to make a backtracking pattern quadratic, or an
# expression that sympy / math-verify would work on for minutes.
ADVERSARIAL = {
    "100k digits": "1" * 100_000,  # 68 s in the old normalisation (a quadratic regex, outside any time limit)
    "digits then a word": "1" * 100_000 + " apples",
    "unclosed boxes": "\\boxed{" * 5_000,
    "unclosed display math": "\\[" * 50_000,
    "unit words": "5 " + "cm " * 33_000 + "x!",
    "trailing zeros": "\\boxed{1." + "0" * 100_000 + "1}",
    "100k-character text": "The answer is 12. " * 5_600,
    "huge symbolic power": r"so \boxed{(x+y+1)^{999}}",
    "power tower": r"\boxed{9^{9^{9^{9^{9}}}}}",
}
MARGIN_S = 20.0  # a killed worker's replacement on a loaded 2-core machine; an unbounded call takes minutes


def test_extraction_and_normalisation_are_linear_in_the_response():
    """In-process, unbounded: each adversarial text takes milliseconds (before: 100k digits 68 s, 50k unclosed
    ``\\[`` ~90 s; both quadratic)."""
    for name, text in ADVERSARIAL.items():
        start = time.perf_counter()
        for stage in (mg.normalize_answer, mg.whole_response_answer, mg.extract_answer, mg.last_number):
            stage(text)
        assert time.perf_counter() - start < 5.0, name
    assert mg.whole_response_answer("\\[" * 1000 + r"\[ 7 \]") == " 7 "  # the innermost block is the one read
    assert mg.normalize_answer("1" * 1000 + " apples") == "1" * 1000


_PLAIN_NUMBER_THEN_WORDS = re.compile(r"^(-?[\d,]*\.?\d+)\s+[A-Za-z]{3,}[A-Za-z\s'-]*$")  # the backtracking form
_PLAIN_UNIT_SUFFIX = re.compile(r"(?:\s*(?<![A-Za-z])(?:" + "|".join(mg._UNIT_WORDS) + r")\b\.?)+\s*$",
                                re.IGNORECASE)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="01-.,5 \tabmsx'", max_size=14))
def test_linear_number_then_words_pattern_accepts_what_the_plain_one_does(text):
    plain, linear = _PLAIN_NUMBER_THEN_WORDS.match(text), mg._NUMBER_THEN_WORDS_RE.match(text)
    assert (plain and plain.group(1)) == (linear and linear.group(1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["5", "cm", "in", "sin", "kg.", " ", ".", "x", "hours", "Dollars", "5cm", "_", "é",
                                 "inche", "sq"]), max_size=6).map("".join))
def test_unit_suffix_scan_strips_what_the_plain_pattern_does(text):
    assert mg.strip_unit_suffix(text).strip() == _PLAIN_UNIT_SUFFIX.sub("", text).strip()


@settings(max_examples=100, deadline=None)
@given(st.from_regex(r"-?[0-9]{1,4}", fullmatch=True), st.from_regex(r"([0-9]{0,3}[1-9])?", fullmatch=True),
       st.integers(0, 6))
def test_trailing_zeros_of_decimals_go(whole, fraction, zeros):
    text = f"{whole}.{fraction}" + "0" * zeros
    assert mg.normalize_answer(text) == (f"{whole}.{fraction}" if fraction else whole)


def _timed_grades(grader: mg.Grader, responses, reference: str):
    """(reward, counts, seconds) of each response graded alone."""
    out = []
    for response in responses:
        start = time.perf_counter()
        rewards, counts = grader.grade_batch([response], [reference], [False])
        out.append((float(rewards[0]), counts, time.perf_counter() - start))
    return out


def test_builtin_grading_is_bounded_in_time_on_adversarial_responses():
    """Every call returns within its limit plus a worker's replacement: extraction and normalisation run in the
    worker too (they ran in the parent, unbounded). sympy would expand (x+y+1)^999 for minutes: that call is cut
    at its limit, scores 0, is counted, and the next call works (its worker was replaced)."""
    grader = mg.Grader(timeout_s=1.0)
    assert grader.grade("it is 5", "5", False) == 1.0  # the worker is up
    for name, (reward, counts, seconds) in zip(ADVERSARIAL, _timed_grades(grader, ADVERSARIAL.values(), "1")):
        assert reward == 0.0 and counts.calls == 1 and counts.errors == 0, name
        assert seconds < 1.0 + MARGIN_S, (name, seconds)
    assert grader.timeouts == 1 and grader.errors == 0  # the symbolic power; the rest took milliseconds
    assert grader.grade(r"\boxed{2(x+1)}", "2x+2", False) == 1.0
    assert mg.is_equivalent("2(x+1)", "2x+2", timeout_s=5.0)


def test_math_verify_grading_is_bounded_in_time_on_adversarial_responses():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'sera_jax[math]')")
    grader = mg.Grader(backend="math_verify", timeout_s=1.0)
    assert grader.grade("The answer is 18.", "18", False) == 1.0  # the worker is up
    names = ("100k digits", "unclosed boxes", "100k-character text", "power tower")
    for name, (reward, counts, seconds) in zip(names, _timed_grades(grader, [ADVERSARIAL[n] for n in names], "1")):
        assert reward == 0.0 and counts.calls == 1 and counts.errors == 0, name
        assert seconds < 1.0 + MARGIN_S, (name, seconds)
    assert grader.timeouts >= 1  # the power tower at least
    assert grader.grade("The answer is 18.", "18", False) == 1.0


def test_a_dead_worker_is_a_counted_error_and_is_replaced():
    grader = mg.Grader(timeout_s=60.0)
    assert grader.grade("it is 5", "5", False) == 1.0  # the worker is up
    killer = threading.Timer(0.5, os.kill, (mg._POOL._workers[0].proc.pid, signal.SIGKILL))
    killer.start()
    start = time.perf_counter()
    rewards, counts = grader.grade_batch([r"\boxed{(x+y+1)^{999}}"], ["1"], [False])  # minutes, unless killed
    killer.join()
    assert time.perf_counter() - start < 30.0  # the death was noticed, not the 60 s limit waited out
    assert rewards[0] == 0.0 and counts == mg.GradingCounts(calls=1, timeouts=0, errors=1) and grader.errors == 1
    assert grader.grade("it is 5", "5", False) == 1.0 and grader.errors == 1


def test_a_grading_call_that_raises_is_a_counted_and_logged_error(monkeypatch, caplog):
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'sera_jax[math]')")
    import math_verify.metric

    def changed_api(**kwargs):  # what an API change in math-verify looks like from here
        raise TypeError("math_metric() got an unexpected keyword argument 'gold_extraction_target'")

    monkeypatch.setattr(math_verify.metric, "math_metric", changed_api)
    grader = mg.Grader(backend="math_verify", timeout_s=None)  # in-process, where the patch applies
    rewards, counts = grader.grade_batch(["The answer is 18.", r"\boxed{3}", "x"], ["18", "3", "1"],
                                         [False, False, True])
    np.testing.assert_array_equal(rewards, [0.0, 0.0, 0.0])
    assert counts == mg.GradingCounts(calls=2, timeouts=0, errors=2) and grader.errors == 2
    assert "2 of 2 distinct responses failed" in caplog.text and "unexpected keyword argument" in caplog.text
    # In a worker process, a call that raises (here: a function the worker does not have) is an error too.
    assert mg.bounded_call("no_such_function", [], {}, timeout_s=10.0)[1] == "error"


@pytest.mark.parametrize("calls, errors, max_error_frac, raises", [
    (10, 1, 0.1, False), (10, 2, 0.1, True), (10, 0, 0.0, False), (10, 1, 0.0, True), (0, 0, 0.1, False),
    (4, 4, 0.99, True), (4, 4, 1.0, False)])
def test_check_error_rate(calls, errors, max_error_frac, raises):
    counts = mg.GradingCounts(calls=calls, timeouts=3, errors=errors)
    if raises:
        with pytest.raises(mg.GradingError, match=rf"^{errors} of {calls} grading calls failed .*3 more timed out.*"
                                                  rf"config\.grading\.max_error_frac={max_error_frac}"):
            mg.check_error_rate(counts, max_error_frac, "config.grading.max_error_frac")
    else:
        mg.check_error_rate(counts, max_error_frac, "config.grading.max_error_frac")
    assert mg.GradingCounts(1, 2, 3) + mg.GradingCounts(10, 20, 30) == mg.GradingCounts(11, 22, 33)
