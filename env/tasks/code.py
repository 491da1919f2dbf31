"""Code tasks: a gold `CodeTests`, `grade_code`, which runs the response's program against it, and
`tamper_suspect`, a cheap flag for programs that touch what a forged verdict would need.

Kinds:
- "humaneval": `prompt` (signature + docstring) and `test_code` defining `check(candidate)`; the sandboxed program
  is the prompt, then the response's code (a full definition or only the body).
- "stdin": `cases` of (stdin, expected stdout); the response is a whole program.
- "functional": `cases` of (JSON arguments one per line, JSON return value) for `Solution().<entry_point>`
  (LeetCode style) or a top-level function of that name.
The program runs in the sandbox; the tests run in the grader's process and decide from the values it sends back
(env/tasks/code_verdict.py; docs/threat-model.md, "Verdict").
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize

from env.tasks.answers import extract_code
from env.tasks.code_verdict import passes
from env.tasks.sandbox import SandboxLimits

CODE_KINDS = ("humaneval", "stdin", "functional")
# Names a program needs to end its process, reach frames, the interpreter's modules, the harness or native code.
_TAMPER_NAMES = frozenset({
    "exit", "quit", "_exit", "abort", "SystemExit", "atexit",
    "_getframe", "inspect", "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame", "cr_frame",
    "gc", "builtins", "__builtins__", "__import__", "importlib", "ctypes", "__subclasses__", "__globals__",
    "settrace", "setprofile", "addaudithook", "subprocess", "code_harness",
})
# Flagged only as an attribute (os.kill, sys.modules, os.dup2): as bare names they are common variables.
_TAMPER_ATTRIBUTES = frozenset({
    "kill", "killpg", "modules", "dup", "dup2", "closerange", "fdopen", "system", "popen", "fork",
})
# Inside a string literal (getattr(sys, "_getframe"), __import__("gc"), open("/proc/self/mem")) a word of these;
# the plain English words among the names are left out there.
_TAMPER_WORDS = (_TAMPER_NAMES | _TAMPER_ATTRIBUTES | {"proc"}) - {"exit", "quit", "abort", "inspect", "system"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    """1 if the response's program passes every test of `gold`, else 0."""
    code = extract_code(response_text)
    if not code.strip():
        return 0.0
    return float(
        passes(
            code,
            kind=gold.kind,
            entry_point=gold.entry_point,
            prompt=gold.prompt,
            test_code=gold.test_code,
            cases=gold.cases,
            limits=gold.limits,
        )
    )


def tamper_suspect(response_text: str) -> bool:
    """Whether the response's program names process exit, `atexit`, frames, `gc`, `sys.modules`, `builtins`,
    `__import__`, `ctypes`, child processes, the protocol's fds or the harness (a token scan: it cannot see names
    the program builds at run time; docs/threat-model.md, "Verdict")."""
    tokens = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(extract_code(response_text)).readline):
            tokens.append(token)
    except (tokenize.TokenError, SyntaxError):  # scan what tokenized (a program that does not will not pass)
        pass
    previous = ""
    for token in tokens:
        if token.type == tokenize.NAME:
            if token.string in _TAMPER_NAMES or (previous == "." and token.string in _TAMPER_ATTRIBUTES):
                return True
        elif token.type == tokenize.STRING and not _TAMPER_WORDS.isdisjoint(_WORD.findall(token.string)):
            return True
        previous = token.string
    return False
