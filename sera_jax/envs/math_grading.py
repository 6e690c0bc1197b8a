"""Grading of math responses (arithmetic task, GSM8K, MATH, POLARIS) as MaxRL grades them, in bounded time.

MaxRL's rule (``rule="maxrl"``, the default; ``verl/utils/reward_score/math_verify.py``): math-verify parses the
**whole response** (LaTeX and plain-expression extraction: a ``\\boxed{}`` or "final answer is ..." first,
then "answer: ...", then the rightmost number or LaTeX expression), so an unboxed "The answer is 18." can
score 1, against the gold answer parsed as ``\\boxed{gold}``. A response cut at the length limit (no stop
token) scores 0. ``rule="final_answer"`` is the stricter rule this module used before: only the last
``\\boxed{}`` / ``\\fbox{}``, else GSM8K's ``#### x`` (else, with ``last_number_fallback``, the last number).

Backends: ``math_verify`` runs the `math-verify` package (extra ``math``) exactly as MaxRL calls it;
``builtin`` (offline, no dependency) follows the same rule as far as it can: ``whole_response_answer``
extracts in math-verify's priority order, ``is_equivalent`` compares (exact string, exact/tolerant numbers,
then a guarded sympy comparison). ``tests/envs/test_math_grading.py`` has a table of where the two agree and
differ.

Time bounds: every grading call of either backend (``Grader``, ``grade``, ``grade_batch``, ``is_equivalent``)
runs whole -- extraction, normalisation, sympy or math-verify -- in a worker process that is killed when the
call exceeds ``timeout_s`` (default ``DEFAULT_TIMEOUT_S``), so it returns within ``timeout_s`` plus the
replacement of its worker on any input; the call then scores 0 and counts as a timeout. A call that raises,
or whose worker dies, scores 0 and counts as an error (``Grader.timeouts`` / ``Grader.errors``, per batch in
the ``GradingCounts`` that ``Grader.grade_batch`` returns; both are logged); ``check_error_rate`` turns too
many errors into a ``GradingError``. Workers start on first use (about a second) and are reused; a killed one
is replaced. The builtin extraction and normalisation are linear in the response's length (no regular
expression here backtracks quadratically), so ``timeout_s=None`` -- in-process, unbounded -- is bounded in
practice by the sympy guards alone.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import fractions
import importlib.util
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

Backend = Literal["builtin", "math_verify"]
Rule = Literal["maxrl", "final_answer"]
BACKENDS = ("builtin", "math_verify")
RULES = ("maxrl", "final_answer")
DEFAULT_TIMEOUT_S = 10.0  # math-verify's own limits inside a call are 5 s (parse) + 5 s (verify)
_log = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")

# ------------------------------------------------------------------------------------------- extraction


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the '}' closing the '{' at ``open_index`` (nesting counted), or None if unbalanced."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces kept), else None.

    ``\\boxed 5`` (argument without braces) yields "5". An unclosed last box yields None: earlier boxes
    are not consulted, since the last one is the model's final word.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(cmd for cmd in _BOX_COMMANDS if text.startswith(cmd, start))
    rest_index = start + len(command)
    if text[rest_index : rest_index + 1].isalpha():  # e.g. \boxedfoo is another macro
        return None
    j = rest_index
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        close = _matching_brace(text, j)
        return None if close is None else text[j + 1 : close]
    if j > rest_index:  # "\boxed 5": the argument runs to the next whitespace or '$'
        match = re.match(r"[^\s$]+", text[j:])
        return match.group(0) if match else None
    return None


def gsm8k_hash_answer(text: str) -> str | None:
    """Text after the last GSM8K ``####`` marker (to the end of its line), else None."""
    matches = _GSM8K_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (integers with thousands commas, decimals, a/b, negatives), else None."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None


def extract_answer(text: str, *, last_number_fallback: bool = False) -> str | None:
    """The response's final answer: last box, else ``####``, else (only if asked) the last number."""
    for extractor in (last_boxed, gsm8k_hash_answer):
        answer = extractor(text)
        if answer is not None:
            return answer
    return last_number(text) if last_number_fallback else None


# math-verify's whole-response extraction, as far as regular expressions follow it (math_verify/parser.py:
# priority groups, lowest first; within a group the match that ends rightmost wins). A number needs a start of
# line, a space or "=" before it (so "x2" gives nothing) and may carry a currency sign. A \\[ or \\( block ends at
# its first closer and may not contain another opener (math-verify's may: there, thousands of unclosed
# openers cost quadratic time; here every pattern is linear in the response).
_MV_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+"
_MV_NUMBER_ANCHORED = rf"(?:^|(?<=\s)|(?<==))(?:\*\*)?[$€£¥₹]?(?P<num>{_MV_NUMBER})"
_MV_LATEX = (r"\$\$(?P<l1>(?:[^$]|\$(?!\$))+?)\$\$|\\\[(?P<l2>(?:[^\\]|\\(?![\[\]]))+?)\\\]"
             r"|(?<![\\\d])\$(?P<l3>(?:\\\$|[^\n$])+?)(?<!\\)\$|\\\((?P<l4>(?:[^\\\n]|\\(?![()]))+?)\\\)"
             r"|(?P<l5>-?\\frac\{-?\d+(?:\.\d+)?\}\{-?\d+(?:\.\d+)?\})")
_MV_TARGET = rf"(?:{_MV_LATEX}|{_MV_NUMBER_ANCHORED})"
_MV_GROUPS = (
    (re.compile(rf"(?i:final answer is):?\s*{_MV_TARGET}\.?\s?I hope"),),
    (re.compile(rf"(?i:final answer)[^\n]{{0,100}}?\s+is:?\s*{_MV_TARGET}"), "boxed"),
    (re.compile(rf"(?i:answer):(?:[^\n]{{0,100}}=\s*|[^\n]{{0,50}}?){_MV_TARGET}(?!\s*=)"),),
    (re.compile(rf"(?i:answer)(?:[^\n]{{0,100}}=\s*|[^\n]{{0,50}}?){_MV_TARGET}(?!\s*=)"),),
    (re.compile(_MV_LATEX), re.compile(_MV_NUMBER_ANCHORED, re.MULTILINE)),
)


def _target(match: re.Match) -> str | None:
    return next((v for v in match.groupdict().values() if v is not None), None)


def whole_response_answer(text: str) -> str | None:
    """The answer math-verify would take from the whole response (MaxRL's rule), approximated:

    1. "final answer is X. I hope"; 2. the last ``\\boxed{}`` or "final answer ... is X"; 3. "answer: ... X"
    (after the last "=" within 100 characters, else the first X within 50); 4. the same after "answer";
    5. the rightmost LaTeX expression (``$..$``, ``\\(..\\)``, ``\\[..\\]``, ``$$..$$``, ``\\frac{a}{b}``) or number.
    X is a number (thousands commas, decimals, a/b, a currency sign) or a LaTeX expression. Within a step the
    candidate that ends rightmost wins. Returns None when nothing numeric or LaTeX is found.
    """
    for group in _MV_GROUPS:
        best: tuple[int, str] | None = None
        for pattern in group:
            if pattern == "boxed":
                start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
                box = last_boxed(text)
                if start >= 0 and box is not None:
                    best = max(best or (-1, ""), (start + len(box) + 8, box))
                continue
            for match in pattern.finditer(text):
                value = _target(match)
                if value is not None and value.strip():
                    best = max(best or (-1, ""), (match.end(), value))
        if best is not None:
            return best[1]
    return None


# ------------------------------------------------------------------------------------------ normalisation

_UNIT_WORDS = (
    "dollars? cents? euros? pounds? units? hours? hrs? minutes? mins? seconds? secs? days? weeks? months? "
    "years? meters? metres? centimeters? cm km kg grams? g miles? mph feet foot ft inches? in degrees? "
    "percent people persons? students? points? square sq cubic per each"
).split()
_UNITS = frozenset(w.lower() for word in _UNIT_WORDS
                   for w in ((word[:-2], word[:-1]) if word.endswith("?") else (word,)))  # "hours?": hour, hours
# "18 apples", "3 red marbles": a number followed only by words is that number. The first word needs 3+
# letters so that "5 x" (an algebraic answer) is left alone. Possessive quantifiers and a look-behind in place
# of backtracking: the same strings as r"^(-?[\d,]*\.?\d+)\s+[A-Za-z]{3,}[A-Za-z\s'-]*$", in linear time.
_NUMBER_THEN_WORDS_RE = re.compile(r"^(-?[\d,]*+(?:\.\d++)?+)(?<=\d)\s++[A-Za-z]{3,}+[A-Za-z\s'-]*+$")
_TEXT_MACRO_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DELETE_TOKENS = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "\\%",
    "%",
    "\\$",
    "$",
    "^\\circ",
    "^{\\circ}",
    "°",
)
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12 -> \frac{1}{2}
_FRAC_HALF_RE = re.compile(r"\\frac\s*\{([^{}]*)\}\s*(\d)")  # \frac{1}2 -> \frac{1}{2}
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DECIMAL_POINT_RE = re.compile(r"^-?\d+\.\d*$")
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")


def strip_unit_suffix(text: str) -> str:
    """``text`` without its trailing unit words (each a whole ASCII word, optionally with a '.'), e.g.
    "18 sq cm." -> "18"; "5cm" loses its "cm", "sin" keeps its "in". A scan from the right: linear time."""
    while True:
        text = text.rstrip()
        body = text[:-1] if text.endswith(".") else text
        start = len(body)
        while start and body[start - 1].isascii() and body[start - 1].isalpha():
            start -= 1
        if start == len(body) or body[start:].lower() not in _UNITS:
            return text
        text = body[:start]


def normalize_answer(answer: str) -> str:
    """Canonical string form: no $/%/degree signs, units, thousands commas, LaTeX spacing or trailing .0.

    ``\\dfrac``/``\\tfrac`` become ``\\frac``; ``\\text{...}`` keeps its content (then unit words go);
    ``x = 5`` becomes ``5``; ``5.00`` becomes ``5``; spaces are removed. Linear time in ``answer`` (no pattern
    here backtracks), so a 100,000-digit answer costs milliseconds.
    """
    s = answer.strip().replace("\u2212", "-")  # unicode minus sign
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for _ in range(3):  # nested \text{\textbf{..}} unwraps from the inside out
        s = _TEXT_MACRO_RE.sub(r"\1", s)
    for token in _DELETE_TOKENS:
        s = s.replace(token, "")
    s = _ASSIGNMENT_RE.sub("", s)
    s = strip_unit_suffix(s).strip()
    s = s.rstrip(".").strip()
    s = _NUMBER_THEN_WORDS_RE.sub(r"\1", s)
    s = _THOUSANDS_RE.sub("", s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^(-?\d+)\.0*$", r"\1", s)  # 5.00 -> 5
    if _DECIMAL_POINT_RE.match(s):  # 2.50 -> 2.5 (str.rstrip: a lazy regex here is quadratic in the zeros)
        s = s.rstrip("0")
    return s


_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_DECIMAL_RE = re.compile(rf"^{_DECIMAL}$")
_SLASH_RE = re.compile(rf"^({_DECIMAL})/({_DECIMAL})$")
_FRAC_RE = re.compile(rf"^([+-]?)\\frac\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}$")


def parse_number(answer: str) -> fractions.Fraction | None:
    """Exact value of a normalised answer.

    Accepts ``12``, ``-3.5``, ``1e3``, ``3/4``, ``-\\frac{3}{4}`` and ``\\frac{-3}{4}``, else None.
    """
    s = answer
    if len(s) > 64:  # guards Fraction() against absurd exponents and digit strings
        return None
    try:
        if _DECIMAL_RE.match(s):
            return _checked(fractions.Fraction(s))
        if m := _SLASH_RE.match(s):
            return _checked(fractions.Fraction(m.group(1)) / fractions.Fraction(m.group(2)))
        if m := _FRAC_RE.match(s):
            value = fractions.Fraction(m.group(2)) / fractions.Fraction(m.group(3))
            return _checked(-value if m.group(1) == "-" else value)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def _checked(value: fractions.Fraction) -> fractions.Fraction | None:
    # 1e999999 parses but its numerator has a million digits; such answers are nonsense anyway.
    return value if abs(value.numerator) < 10**100 and value.denominator < 10**100 else None


# ------------------------------------------------------------------------------------------- equivalence


def numbers_close(a: fractions.Fraction, b: fractions.Fraction, rel_tol: float, abs_tol: float) -> bool:
    """``|a - b| <= max(rel_tol * |b|, abs_tol)``; ``b`` is the reference."""
    return abs(a - b) <= max(fractions.Fraction(rel_tol) * abs(b), fractions.Fraction(abs_tol))


def is_equivalent(
    prediction: str,
    reference: str,
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
    use_sympy: bool = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> bool:
    """Whether a predicted final answer matches the reference (both raw strings, normalised here).

    Equal normalised strings, or equal numbers within tolerance, or — when sympy is importable and
    ``use_sympy`` — expressions whose difference simplifies to 0 (``sympy_equivalent``). The whole comparison
    runs in a worker process killed after ``timeout_s`` seconds (None: in-process, unbounded); a timeout or
    an error is False.
    """
    value, status = bounded_call("equivalent", [prediction, reference],
                                 dict(rel_tol=rel_tol, abs_tol=abs_tol, use_sympy=use_sympy), timeout_s)
    return status == "ok" and bool(value)


def _equivalent(prediction: str, reference: str, *, rel_tol: float, abs_tol: float, use_sympy: bool) -> bool:
    """``is_equivalent`` in-process and unbounded (what a worker runs)."""
    pred, ref = normalize_answer(prediction), normalize_answer(reference)
    if not pred:
        return False
    if pred == ref:
        return True
    pred_num, ref_num = parse_number(pred), parse_number(ref)
    if pred_num is not None and ref_num is not None:
        return numbers_close(pred_num, ref_num, rel_tol, abs_tol)
    if not use_sympy or not latex_to_sympy_syntax(pred) or not latex_to_sympy_syntax(ref):
        return False
    return sympy_equivalent(pred, ref, rel_tol=rel_tol, abs_tol=abs_tol)


# A small LaTeX -> sympy-syntax rewrite. Anything outside this grammar is rejected before sympy sees it,
# because sympy's parser calls eval(): only digits, operators, brackets, single-letter symbols and the
# function names below may reach it.
_LATEX_REWRITES = (
    (re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}"), r"((\1)/(\2))"),
    (re.compile(r"\\sqrt\[([^{}\[\]]*)\]\{([^{}]*)\}"), r"((\2)**(1/(\1)))"),
    (re.compile(r"\\sqrt\{([^{}]*)\}"), r"sqrt(\1)"),
    (re.compile(r"\\sqrt(\d)"), r"sqrt(\1)"),
)
_PLAIN_REWRITES = (
    ("\\cdot", "*"),
    ("\\times", "*"),
    ("\\div", "/"),
    ("\\pi", "pi"),
    ("^", "**"),
    ("{", "("),
    ("}", ")"),
    ("\\infty", "oo"),
)
_SYMPY_FUNCTIONS = frozenset({"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp", "E", "I"})
_SAFE_CHARS_RE = re.compile(r"^[0-9A-Za-z+\-*/().]*$")
_MAX_SYMPY_CHARS = 80


def latex_to_sympy_syntax(answer: str) -> str | None:
    """Rewrites a normalised answer into sympy-parsable syntax, or None when it is out of scope."""
    s = answer
    for _ in range(4):  # innermost fractions/roots first, so a few rounds cover nesting
        for pattern, replacement in _LATEX_REWRITES:
            s = pattern.sub(replacement, s)
    for old, new in _PLAIN_REWRITES:
        s = s.replace(old, new)
    if "\\" in s or not _SAFE_CHARS_RE.match(s) or len(s) > _MAX_SYMPY_CHARS:
        return None
    if "__" in s or re.search(r"\.[A-Za-z_]", s):  # no attribute access reaches eval()
        return None
    names = re.findall(r"[A-Za-z]+", s)
    if any(len(n) > 1 and n not in _SYMPY_FUNCTIONS for n in names):
        return None
    # Exponents are the way to make evaluation explode (9**9**9): allow one small power tower only.
    if s.count("**") > 2 or any(len(e) > 3 for e in re.findall(r"\*\*\(?(\d+)", s)):
        return None
    return s


def sympy_equivalent(
    prediction: str, reference: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """Equivalence of two normalised answers through sympy (False if sympy is missing or parsing fails).

    Constant expressions compare numerically within tolerance; with free symbols the difference must
    simplify to zero. No time bound here (graders run this inside a worker that has one).
    """
    try:
        import sympy
        from sympy.parsing import sympy_parser
    except ImportError:
        return False
    exprs = []
    transformations = (
        *sympy_parser.standard_transformations,
        sympy_parser.implicit_multiplication_application,
    )
    for text in (prediction, reference):
        syntax = latex_to_sympy_syntax(text)
        if syntax is None or not syntax:
            return False
        try:
            exprs.append(sympy_parser.parse_expr(syntax, transformations=transformations, evaluate=True))
        except Exception:  # sympy raises many kinds (SyntaxError, TokenError, TypeError...)
            return False
    pred, ref = exprs
    try:
        if not pred.free_symbols and not ref.free_symbols:
            pred_value, ref_value = complex(pred.evalf(30)), complex(ref.evalf(30))
            if not all(
                map(math.isfinite, (pred_value.real, pred_value.imag, ref_value.real, ref_value.imag))
            ):
                return False
            return abs(pred_value - ref_value) <= max(rel_tol * abs(ref_value), abs_tol)
        return sympy.simplify(pred - ref) == 0
    except Exception:
        return False


# ------------------------------------------------------------------------------------------------ grading

Status = Literal["ok", "timeout", "error"]


class GradingTimeout(Exception):
    """A grading call ran out of time inside its worker (math-verify's own limits): scored 0, a timeout."""


class GradingError(RuntimeError):
    """Too many grading calls of a step raised or lost their worker: a systematic failure, not a 0 reward."""


@dataclasses.dataclass(frozen=True)
class GradingCounts:
    """Distinct grading calls of a batch, and how many timed out or failed (raised, or their worker died)."""

    calls: int = 0
    timeouts: int = 0
    errors: int = 0

    def __add__(self, other: GradingCounts) -> GradingCounts:
        return GradingCounts(self.calls + other.calls, self.timeouts + other.timeouts, self.errors + other.errors)


def check_error_rate(counts: GradingCounts, max_error_frac: float, field: str = "max_error_frac") -> None:
    """GradingError when more than ``max_error_frac`` of ``counts.calls`` failed: a grader that fails
    systematically (e.g. an API change in math-verify) would otherwise train on all-zero rewards."""
    if counts.errors and counts.errors > max_error_frac * counts.calls:
        raise GradingError(
            f"{counts.errors} of {counts.calls} grading calls failed (raised or lost their worker process; "
            f"{counts.timeouts} more timed out), above the threshold {field}={max_error_frac} "
            f"({max_error_frac * counts.calls:g} calls): the grader is broken, see the logged error")


def _math_verify_score(response: str, reference: str, rule: str) -> float:
    """math-verify as MaxRL calls it (``rule="maxrl"``: ``compute_score`` of verl's math_verify.py, the gold
    wrapped in ``\\boxed{}``, the prediction extracted from the whole response), or on this module's
    extracted final answer (``rule="final_answer"``). MaxRL scores any exception 0; here it scores 0 too but
    propagates, so that the caller counts it (``GradingTimeout`` for math-verify's own time limits)."""
    try:
        from math_verify.errors import TimeoutException
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    except ImportError as e:
        raise ImportError("backend='math_verify' needs the math extra: pip install 'sera_jax[math]'") from e
    if rule == "final_answer":
        prediction = extract_answer(response)
        if prediction is None:
            return 0.0
        response = f"\\boxed{{{prediction}}}"
    verify = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        score, _ = verify([f"\\boxed{{{reference}}}"], [response])
    except TimeoutException as e:  # math-verify's derives from BaseException
        raise GradingTimeout(repr(e)) from None
    return float(score)


def _builtin_score(response: str, reference: str, rule: str, last_number_fallback: bool, rel_tol: float) -> float:
    """The builtin grader's score of one untruncated response, in-process and unbounded (a worker runs it)."""
    if rule == "maxrl":
        prediction = whole_response_answer(response)
    else:
        prediction = extract_answer(response, last_number_fallback=last_number_fallback)
    if prediction is None:
        return 0.0
    return float(_equivalent(prediction, reference, rel_tol=rel_tol, abs_tol=1e-9, use_sympy=True))


# Functions a worker process runs by name (arguments and results are JSON).
_WORKER_FUNCTIONS = {"sympy_equivalent": sympy_equivalent, "equivalent": _equivalent,
                     "builtin_score": _builtin_score, "math_verify_score": _math_verify_score}


def _call_in_process(name: str, args: Sequence[Any], kwargs: dict) -> tuple[Any, Status]:
    """``(result, status)`` of worker function ``name`` run here: no time bound beyond math-verify's own."""
    try:
        return _WORKER_FUNCTIONS[name](*args, **kwargs), "ok"
    except GradingTimeout:
        return None, "timeout"
    except Exception as e:  # noqa: BLE001 - counted by the caller
        return repr(e)[:200], "error"


# Hand-written rather than a maintained pool: pebble's ProcessPool (a per-task timeout that kills and replaces the
# worker) starts workers through multiprocessing, whose fork is unsafe in a process running JAX (its threads, a GPU
# context) and whose spawn/forkserver import the main script and the sera_jax package (so JAX) in every worker to
# unpickle a task: about twice this worker's start-up (measured on the shared 2-core machine: a pebble worker
# 21-24 s against 9-13 s), paid again by each replacement after a timeout. This worker runs this file as a script,
# with no package imports.
class _Worker:
    """One grading process: this file run as a script (no package imports), one request at a time."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "--grading-worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.ready = False

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        if not self.ready:
            if not select.select([self.proc.stdout], [], [], timeout_s)[0] or self.proc.stdout.readline() != "ready\n":
                self.kill()
                raise RuntimeError("the math grading worker process did not start")
            self.ready = True

    def send(self, name: str, args: list, kwargs: dict) -> None:
        self.proc.stdin.write(json.dumps({"f": name, "a": args, "k": kwargs}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> tuple[Any, Status]:
        """``(result, "ok")``, ``(None, "timeout")`` (math-verify's own limit) or ``(message, "error")`` when
        the call raised or the process died."""
        line = self.proc.stdout.readline()
        if not line.endswith("\n"):
            return f"the grading worker process died (exit status {self.proc.wait()})", "error"
        reply = json.loads(line)
        if "r" in reply:
            return reply["r"], "ok"
        return (None, "timeout") if "t" in reply else (reply.get("e"), "error")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class _WorkerPool:
    """Grading processes shared by the whole program (started on first use, replaced when killed or dead)."""

    def __init__(self):
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker()

    def run(self, calls: Sequence[tuple[str, list, dict]], timeout_s: float,
            num_workers: int = 1) -> list[tuple[Any, Status]]:
        """Runs each ``(function name, args, kwargs)`` in a worker, at most ``timeout_s`` seconds each (from
        when the worker takes it). Returns ``(result, status)`` per call: ``ok``; ``timeout`` (its worker is
        killed and replaced); ``error`` with a message (the call raised, or its worker died and was replaced)."""
        results: list[tuple[Any, Status]] = [(None, "error")] * len(calls)
        if not calls:
            return results
        with self._lock:
            while len(self._workers) < min(max(num_workers, 1), len(calls)):
                self._workers.append(_Worker())
            pending = collections.deque(range(len(calls)))
            busy: dict[int, tuple[int, float]] = {}  # worker slot -> (call index, deadline)
            while pending or busy:
                for slot, worker in enumerate(self._workers):
                    if pending and slot not in busy:
                        worker.wait_ready()
                        i = pending.popleft()
                        try:
                            worker.send(*calls[i])
                        except OSError as e:  # it died while idle
                            results[i] = (f"the grading worker process died: {e!r}", "error")
                            self._replace(slot)
                            continue
                        busy[slot] = (i, time.monotonic() + timeout_s)
                if not busy:
                    continue
                wait = max(0.0, min(deadline for _, deadline in busy.values()) - time.monotonic())
                ready = select.select([self._workers[s].proc.stdout for s in busy], [], [], wait)[0]
                for slot in list(busy):
                    worker, (i, deadline) = self._workers[slot], busy[slot]
                    if worker.proc.stdout in ready:
                        try:
                            results[i] = worker.receive()
                        except ValueError as e:  # a garbled reply
                            results[i] = (f"unreadable reply from the grading worker: {e!r}", "error")
                        del busy[slot]
                        if results[i][1] == "error" and worker.proc.poll() is not None:  # died (e.g. out of memory)
                            self._replace(slot)
                    elif time.monotonic() >= deadline:
                        self._replace(slot)
                        results[i] = (None, "timeout")
                        del busy[slot]
        return results

    def close(self) -> None:
        with self._lock:
            for worker in self._workers:
                worker.kill()
            self._workers = []


_POOL = _WorkerPool()
atexit.register(_POOL.close)


def bounded_call(name: str, args: list, kwargs: dict, timeout_s: float | None) -> tuple[Any, Status]:
    """``(result, status)`` of worker function ``name`` (``_WORKER_FUNCTIONS``; status ``ok``, ``timeout`` or
    ``error``): in a worker process with a ``timeout_s`` limit, or in-process and unbounded when None."""
    if timeout_s is None:
        return _call_in_process(name, args, kwargs)
    return _POOL.run([(name, list(args), dict(kwargs))], timeout_s)[0]


def _check(rule: str, backend: str) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {list(RULES)}, got {rule!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


@dataclasses.dataclass
class Grader:
    """Grades responses with fixed settings, every call bounded by ``timeout_s``, and counts what failed.

    ``rule``: ``maxrl`` (the whole response, MaxRL's) or ``final_answer``; ``backend``: ``builtin`` or
    ``math_verify``; ``num_workers``: processes that grade a batch in parallel; ``timeouts`` / ``errors``:
    calls so far that hit the limit / raised or lost their worker (each scored 0).
    """

    rule: Rule = "maxrl"
    backend: Backend = "builtin"
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    num_workers: int = 1
    last_number_fallback: bool = False
    rel_tol: float = 1e-6
    timeouts: int = 0
    errors: int = 0

    def __post_init__(self):
        _check(self.rule, self.backend)
        if self.backend == "math_verify" and importlib.util.find_spec("math_verify") is None:
            raise ImportError("backend='math_verify' needs the math extra: pip install 'sera_jax[math]'")

    def _call(self, response: str, reference: str) -> tuple[str, list]:
        if self.backend == "math_verify":
            return "math_verify_score", [response, reference, self.rule]
        return "builtin_score", [response, reference, self.rule, self.last_number_fallback, self.rel_tol]

    def grade_batch(self, responses: Sequence[str], references: Sequence[str | int | float],
                    truncated: Sequence[bool] | np.ndarray) -> tuple[np.ndarray, GradingCounts]:
        """Rewards ``(B,)`` float32 (a ``truncated`` response scores 0) and this batch's ``GradingCounts``.
        Identical (response, reference) pairs are graded once; each distinct pair is one call, run whole
        (extraction included) in a worker killed after ``timeout_s``."""
        truncated = np.asarray(truncated, dtype=bool)
        if not len(responses) == len(references) == len(truncated):
            raise ValueError(f"responses/references/truncated lengths differ: {len(responses)}, "
                             f"{len(references)}, {len(truncated)}")
        keys = sorted({(r, str(ref)) for r, ref, t in zip(responses, references, truncated) if not t})
        calls = [self._call(*k) for k in keys]
        if self.timeout_s is not None:
            outcomes = _POOL.run([(name, args, {}) for name, args in calls], self.timeout_s, self.num_workers)
        else:
            # math-verify's timeouts use SIGALRM, which only a main thread may set (a worker's is one).
            if self.backend == "math_verify" and threading.current_thread() is not threading.main_thread():
                raise RuntimeError("backend='math_verify' with timeout_s=None runs math-verify in-process, which "
                                   "needs the main thread; give a timeout_s (then it runs in a worker process)")
            outcomes = [_call_in_process(name, args, {}) for name, args in calls]
        scores = {k: float(value) if status == "ok" else 0.0 for k, (value, status) in zip(keys, outcomes)}
        rewards = np.array([0.0 if t else scores[(r, str(ref))]
                            for r, ref, t in zip(responses, references, truncated)], np.float32)
        statuses = [status for _, status in outcomes]
        counts = GradingCounts(len(keys), statuses.count("timeout"), statuses.count("error"))
        self.timeouts += counts.timeouts
        self.errors += counts.errors
        if counts.timeouts:
            _log.warning("math grading: %d of %d distinct responses timed out after %ss (scored 0)",
                         counts.timeouts, counts.calls, self.timeout_s)
        if counts.errors:
            first = next(value for value, status in outcomes if status == "error")
            _log.warning("math grading: %d of %d distinct responses failed (scored 0); the first: %s",
                         counts.errors, counts.calls, first)
        return rewards, counts

    def grade(self, response_text: str, reference: str | int | float, truncated: bool) -> float:
        return float(self.grade_batch([response_text], [reference], [truncated])[0][0])


def grade(
    response_text: str,
    reference: str | int | float,
    truncated: bool,
    *,
    rule: Rule = "maxrl",
    last_number_fallback: bool = False,
    backend: Backend = "builtin",
    rel_tol: float = 1e-6,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> float:
    """Reward of one response: 1.0 if its answer equals ``reference`` under ``rule``, else 0.0.

    A ``truncated`` response (cut by the length limit before its stop token) scores 0.0, as in MaxRL. The
    grading is bounded by ``timeout_s`` (a timeout or an error scores 0; see ``Grader`` to count them).
    """
    return Grader(rule=rule, backend=backend, timeout_s=timeout_s, last_number_fallback=last_number_fallback,
                  rel_tol=rel_tol).grade(response_text, reference, truncated)


def grade_batch(
    responses: Sequence[str],
    references: Sequence[str | int | float],
    truncated: Sequence[bool] | np.ndarray,
    *,
    rule: Rule = "maxrl",
    last_number_fallback: bool = False,
    backend: Backend = "builtin",
    rel_tol: float = 1e-6,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    num_workers: int = 1,
) -> np.ndarray:
    """``grade`` per rollout; all three sequences have one entry per rollout. Returns rewards_B float32
    (timeouts and errors are logged; ``Grader.grade_batch`` also returns their counts).

    For a flat rollout batch pass ``[answers[i] for i in prompt_ids_B]`` as ``references``.
    """
    grader = Grader(rule=rule, backend=backend, timeout_s=timeout_s, num_workers=num_workers,
                    last_number_fallback=last_number_fallback, rel_tol=rel_tol)
    return grader.grade_batch(responses, references, truncated)[0]


def _worker_main() -> None:
    """A grading worker: imports what grading needs, says "ready", then answers one JSON line per request."""
    for module in ("sympy", "sympy.parsing.sympy_parser", "math_verify", "math_verify.metric"):
        try:
            __import__(module)
        except ImportError:
            pass
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"r": _WORKER_FUNCTIONS[request["f"]](*request["a"], **request["k"])}
        except GradingTimeout:
            reply = {"t": True}
        except BaseException as e:  # noqa: BLE001 - a failed call is a counted error, never a dead worker
            reply = {"e": repr(e)[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--grading-worker"]:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    _worker_main()
