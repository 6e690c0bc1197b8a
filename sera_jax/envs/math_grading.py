"""Final-answer extraction and grading for math word problems (arithmetic task, GSM8K, MATH, POLARIS).

Pipeline: ``extract_answer`` (last ``\\boxed{...}``/``\\fbox{...}``, else GSM8K ``#### x``, else — only when
asked — the last number) -> ``normalize_answer`` (strip $, units, commas, LaTeX spacing...) ->
``is_equivalent`` (exact string, then exact/tolerant numbers, then a guarded sympy comparison) ->
``grade`` (1.0 or 0.0; a truncated response scores 0 whatever it contains).

``backend="math_verify"`` hands the equivalence test to the `math-verify` package (optional extra
``math``); extraction stays ours in both backends so that the fallback rules are the same.
"""

from __future__ import annotations

import fractions
import math
import re
import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np

Backend = Literal["builtin", "math_verify"]

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


# ------------------------------------------------------------------------------------------ normalisation

_UNIT_WORDS = (
    "dollars? cents? euros? pounds? units? hours? hrs? minutes? mins? seconds? secs? days? weeks? months? "
    "years? meters? metres? centimeters? cm km kg grams? g miles? mph feet foot ft inches? in degrees? "
    "percent people persons? students? points? square sq cubic per each"
).split()
# A unit must start a word ("5cm" and "5 cm" lose it, "sin" keeps its "in").
_UNIT_SUFFIX_RE = re.compile(
    r"(?:\s*(?<![A-Za-z])(?:" + "|".join(_UNIT_WORDS) + r")\b\.?)+\s*$", re.IGNORECASE
)
# "18 apples", "3 red marbles": a number followed only by words is that number. The first word needs 3+
# letters so that "5 x" (an algebraic answer) is left alone.
_NUMBER_THEN_WORDS_RE = re.compile(r"^(-?[\d,]*\.?\d+)\s+[A-Za-z]{3,}[A-Za-z\s'-]*$")
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
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")


def normalize_answer(answer: str) -> str:
    """Canonical string form: no $/%/degree signs, units, thousands commas, LaTeX spacing or trailing .0.

    ``\\dfrac``/``\\tfrac`` become ``\\frac``; ``\\text{...}`` keeps its content (then unit words go);
    ``x = 5`` becomes ``5``; ``5.00`` becomes ``5``; spaces are removed.
    """
    s = answer.strip().replace("\u2212", "-")  # unicode minus sign
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for _ in range(3):  # nested \text{\textbf{..}} unwraps from the inside out
        s = _TEXT_MACRO_RE.sub(r"\1", s)
    for token in _DELETE_TOKENS:
        s = s.replace(token, "")
    s = _ASSIGNMENT_RE.sub("", s)
    s = _UNIT_SUFFIX_RE.sub("", s).strip()
    s = s.rstrip(".").strip()
    s = _NUMBER_THEN_WORDS_RE.sub(r"\1", s)
    s = _THOUSANDS_RE.sub("", s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^(-?\d+)\.0*$", r"\1", s)  # 5.00 -> 5
    s = re.sub(r"^(-?\d+\.\d*?)0+$", r"\1", s)  # 2.50 -> 2.5
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
) -> bool:
    """Whether a predicted final answer matches the reference (both raw strings, normalised here).

    Equal normalised strings, or equal numbers within tolerance, or — when sympy is importable and
    ``use_sympy`` — expressions whose difference simplifies to 0 (see ``sympy_equivalent``).
    """
    pred, ref = normalize_answer(prediction), normalize_answer(reference)
    if not pred:
        return False
    if pred == ref:
        return True
    pred_num, ref_num = parse_number(pred), parse_number(ref)
    if pred_num is not None and ref_num is not None:
        return numbers_close(pred_num, ref_num, rel_tol, abs_tol)
    return use_sympy and sympy_equivalent(pred, ref, rel_tol=rel_tol, abs_tol=abs_tol)


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
    simplify to zero.
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


def _math_verify_equivalent(prediction: str, reference: str) -> bool:
    try:
        import math_verify
    except ImportError as e:
        raise ImportError("backend='math_verify' needs the math extra: pip install 'sera_jax[math]'") from e
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = math_verify.parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
    pred = math_verify.parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout)
    return bool(math_verify.verify(gold, pred, timeout_seconds=timeout))


def grade(
    response_text: str,
    reference: str | int | float,
    truncated: bool,
    *,
    last_number_fallback: bool = False,
    backend: Backend = "builtin",
    rel_tol: float = 1e-6,
) -> float:
    """Reward of one response: 1.0 if its extracted final answer equals ``reference``, else 0.0.

    A ``truncated`` response (cut by the length limit before its stop token) scores 0.0, as in the paper.
    """
    if backend not in ("builtin", "math_verify"):
        raise ValueError(f"backend must be 'builtin' or 'math_verify', got {backend!r}")
    if truncated:
        return 0.0
    prediction = extract_answer(response_text, last_number_fallback=last_number_fallback)
    if prediction is None:
        return 0.0
    reference = str(reference)
    if backend == "math_verify":
        return float(_math_verify_equivalent(prediction, reference))
    return float(is_equivalent(prediction, reference, rel_tol=rel_tol))


def grade_batch(
    responses: Sequence[str],
    references: Sequence[str | int | float],
    truncated: Sequence[bool] | np.ndarray,
    *,
    last_number_fallback: bool = False,
    backend: Backend = "builtin",
    rel_tol: float = 1e-6,
) -> np.ndarray:
    """``grade`` per rollout; all three sequences have one entry per rollout. Returns rewards_B float32.

    For a flat rollout batch pass ``[answers[i] for i in prompt_ids_B]`` as ``references``.
    """
    truncated = np.asarray(truncated, dtype=bool)
    if not len(responses) == len(references) == len(truncated):
        raise ValueError(
            f"responses/references/truncated lengths differ: {len(responses)}, {len(references)}, "
            f"{len(truncated)}"
        )
    return np.array(
        [
            grade(
                r, ref, bool(t), last_number_fallback=last_number_fallback, backend=backend, rel_tol=rel_tol
            )
            for r, ref, t in zip(responses, references, truncated, strict=True)
        ],
        dtype=np.float32,
    )
