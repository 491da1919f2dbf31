"""Graders: `grade(response_text, gold) -> float` in [0, 1] (docs/design.md section 8). Pure functions of text.

Every grader reads the final answer from the last `<answer>...</answer>`; a response without one scores 0.
Code is graded in env/tasks/code.py because it runs the program.
"""

from __future__ import annotations

import math
import re
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from env.tasks.answers import MAX_ANSWER_CHARS, extract_answer, extract_choice, parse_number

# RLPR-style short answers: numbers within this relative tolerance are equal (answers are often rounded).
RELATIVE_TOLERANCE = 1e-2
ABSOLUTE_TOLERANCE = 1e-9

_LATEX_WRAPPERS = (r"\boxed{", r"\text{", r"\textbf{", r"\mathrm{", r"\mbox{")
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())


def grade_exact(response_text: str, gold: str) -> float:
    """1 when the extracted answer equals `gold` exactly (opaque answers such as the replay world's tokens)."""
    answer = extract_answer(response_text)
    return float(answer is not None and answer == gold)


def grade_choice(response_text: str, gold: str) -> float:
    """Multiple choice (MMLU, GPQA): the option letter in the answer equals the gold letter."""
    answer = extract_answer(response_text)
    return float(answer is not None and extract_choice(answer) == gold.strip().upper())


def grade_math(response_text: str, gold: str) -> float:
    """MATH-style answers: equal after normalisation, else equivalent according to math-verify."""
    answer = extract_answer(response_text)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    if normalize_math(answer) == normalize_math(gold):
        return 1.0
    return float(_math_verify_equal(gold, answer))


def grade_short_answer(response_text: str, gold: str) -> float:
    """RLPR-style short answers: numbers equal within a relative tolerance, with "25%" equal to 0.25 and to 25
    (a percentage may be written as its number of percent); other answers equal ignoring case, surrounding
    punctuation, articles and repeated spaces; LaTeX answers fall back to math-verify."""
    answer = extract_answer(response_text)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    gold_number, answer_number = parse_number(gold), parse_number(answer)
    if gold_number is not None and answer_number is not None:
        return float(
            any(
                _close(g, a)
                for g in _percent_readings(gold, gold_number)
                for a in _percent_readings(answer, answer_number)
            )
        )
    if normalize_text(answer) == normalize_text(gold):
        return 1.0
    if gold_number is None and "\\" in gold:
        return float(_math_verify_equal(gold, answer))
    return 0.0


def normalize_math(answer: str) -> str:
    """Drops what does not change a MATH answer's value: `$`, `\\boxed{}`/`\\text{}` wrappers, `\\left`/`\\right`,
    spacing commands, a trailing period, degree marks and `\\dfrac`/`\\tfrac` spellings."""
    text = answer.strip().rstrip(".").strip().strip("$").strip()
    for wrapper in _LATEX_WRAPPERS:
        text = _unwrap(text, wrapper)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""),
                     ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", ""), ("°", "")):
        text = text.replace(old, new)
    return re.sub(r"\s+", "", text).rstrip(".")


def normalize_text(answer: str) -> str:
    text = answer.strip().lower().strip(" .,;:!?\"'`*")
    text = re.sub(r"^(?:the|a|an)\s+", "", text)
    return re.sub(r"\s+", " ", text)


def _unwrap(text: str, wrapper: str) -> str:
    """`\\boxed{x}` -> `x` when the wrapper spans the whole text."""
    if not (text.startswith(wrapper) and text.endswith("}")):
        return text
    depth = 0
    for index in range(len(wrapper) - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[len(wrapper) : -1] if index == len(text) - 1 else text
    return text


def _math_verify_equal(gold: str, answer: str) -> bool:
    # math-verify's timeouts use SIGALRM, which only works on the main thread; elsewhere (a grading pool) the
    # bounded answer length is what keeps sympy quick.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(_as_latex(gold), extraction_config=_EXTRACTION, parsing_timeout=timeout)
        answer_parsed = parse(_as_latex(answer), extraction_config=_EXTRACTION, parsing_timeout=timeout)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
    except Exception:  # math-verify/sympy raise many types on odd input; an unreadable answer is wrong
        return False


def _as_latex(answer: str) -> str:
    stripped = answer.strip()
    return stripped if stripped.startswith("$") or "\\boxed" in stripped else f"${stripped}$"


def _percent_readings(text: str, value: float) -> tuple[float, ...]:
    """"25%" (parsed as 0.25) may mean 0.25 or 25; a plain number means itself."""
    if text.strip().endswith("%"):
        return (value, value * 100)
    return (value,)


def _close(gold: float, answer: float) -> bool:
    if math.isnan(gold) or math.isnan(answer):
        return False
    return math.isclose(gold, answer, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)
