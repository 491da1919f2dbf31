"""Code tasks: a gold `CodeTests` and `grade_code`, which runs the response's program against it in the sandbox.

Kinds:
- "humaneval": `prompt` (signature + docstring) and `test_code` defining `check(candidate)`; the program is the
  prompt, then the response's code (a full definition or only the body), then the tests and `check(entry_point)`.
- "stdin": `cases` of (stdin, expected stdout); the response is a whole program.
- "functional": `cases` of (JSON arguments one per line, JSON return value) for `Solution().<entry_point>`
  (LeetCode style) or a top-level function of that name.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from env.tasks.answers import extract_code
from env.tasks.sandbox import SandboxLimits, run_python

CODE_KINDS = ("humaneval", "stdin", "functional")
_HARNESS = Path(__file__).with_name("code_harness.py")


@dataclasses.dataclass(frozen=True)
class CodeTests:
    kind: str
    entry_point: str = ""
    prompt: str = ""
    test_code: str = ""
    cases: tuple[tuple[str, str], ...] = ()
    limits: SandboxLimits = SandboxLimits()

    def __post_init__(self) -> None:
        if self.kind not in CODE_KINDS:
            raise ValueError(f"CodeTests.kind must be one of {CODE_KINDS}, got {self.kind!r}")
        if self.kind == "humaneval" and not (self.prompt and self.test_code and self.entry_point):
            raise ValueError("humaneval CodeTests need prompt, test_code and entry_point")
        if self.kind in ("stdin", "functional") and not self.cases:
            raise ValueError(f"{self.kind} CodeTests need at least one case")
        if self.kind == "functional" and not self.entry_point:
            raise ValueError("functional CodeTests need entry_point (the method name)")


def grade_code(response_text: str, gold: CodeTests) -> float:
    """1 if the response's program passes every test of `gold` inside the sandbox, else 0."""
    code = extract_code(response_text)
    if not code.strip():
        return 0.0
    program, files = grading_program(code, gold)
    return float(run_python(program, files=files, limits=gold.limits).ok)


def grading_program(code: str, gold: CodeTests) -> tuple[str, dict[str, str]]:
    """The program that runs `gold`'s tests on `code`, and the files it needs in its working directory; it exits
    with status 0 exactly when every test passes."""
    if gold.kind == "humaneval":
        return f"{gold.prompt}{code}\n\n{gold.test_code}\n\ncheck({gold.entry_point})\n", {}
    tests = {"kind": gold.kind, "func_name": gold.entry_point, "cases": [list(case) for case in gold.cases]}
    return _HARNESS.read_text(encoding="utf-8"), {"solution.py": code, "tests.json": json.dumps(tests)}
