"""Reading answers out of response text: the `<answer>` tag, code blocks, choice letters, numbers.

Pure string functions shared by the graders and the reference/wrong responses.
"""

from __future__ import annotations

import re

ANSWER_INSTRUCTION = "Give your final answer inside <answer>...</answer>."
CHOICE_INSTRUCTION = (
    "Answer with the letter of the correct option inside <answer>...</answer>, e.g. <answer>B</answer>."
)
CODE_INSTRUCTION = "Give your complete solution as one ```python code block inside <answer>...</answer>."

_OPEN, _CLOSE = "<answer>", "</answer>"
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_CHOICE_RE = re.compile(
    r"^\W{0,4}(?:the\s+)?(?:answer|option|choice)?\s*(?:is)?\s*:?\s*\(?([A-Z])\)?(?:[\s.:)\]*]|$)", re.IGNORECASE
)
# Short answers are compared; anything longer is not an answer and would only cost regex and sympy time.
MAX_ANSWER_CHARS = 300
_NUMBER_RE = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?$")


def extract_answer(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` (tags matched case-insensitively), stripped; else None."""
    lowered = text.lower()
    close = lowered.rfind(_CLOSE)
    if close < 0:
        return None
    open_at = lowered.rfind(_OPEN, 0, close)
    if open_at < 0:
        return None
    return text[open_at + len(_OPEN) : close].strip()


def extract_code(text: str) -> str:
    """The program in a response: the last ```python (or unlabelled) fenced block of the answer if there is one
    (the answer is the `<answer>` content when present, else the whole text), else that text itself."""
    answer = extract_answer(text)
    source = answer if answer is not None else text
    blocks = _FENCE_RE.findall(source)
    python_blocks = [body for language, body in blocks if language.lower() in ("", "python", "py", "python3")]
    if python_blocks:
        return python_blocks[-1]
    if blocks:
        return blocks[-1][1]
    return source


def extract_choice(answer: str) -> str | None:
    """The option letter in an answer such as "B", "(b)", "B. Paris", "The answer is C"; None if there is none."""
    match = _CHOICE_RE.match(answer.strip()[:MAX_ANSWER_CHARS])
    return match.group(1).upper() if match else None


def parse_number(text: str) -> float | None:
    """A plain number with optional thousands separators, sign, decimals, exponent or trailing percent sign
    (returned as a fraction: "25%" -> 0.25); None for anything else."""
    cleaned = text.strip().replace("$", "").replace(" ", "")
    scale = 1.0
    if cleaned.endswith("%"):
        cleaned, scale = cleaned[:-1], 0.01
    if not cleaned or not _NUMBER_RE.match(cleaned) or not any(char.isdigit() for char in cleaned):
        return None
    return float(cleaned.replace(",", "")) * scale
