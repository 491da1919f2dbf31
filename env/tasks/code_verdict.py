"""The trusted side of a code verdict: the grader decides, from plain data, whether a sandboxed program passes.

The response's program runs in a sandbox session (`env.tasks.sandbox.open_session`) under env/tasks/code_harness.py,
which loads it and answers requests; everything that decides the verdict runs here, in the grader's process:
- humaneval: the problem's prompt and `check(candidate)` run here, with `candidate` (and the entry point's own name,
  which some checks call) a proxy that sends each call's arguments to the sandbox and returns the decoded result,
  or raises the candidate's exception (the builtin exception of that name, else `CandidateError`);
- functional (LiveCodeBench, LeetCode style): each case's JSON arguments go to the sandbox; the decoded return
  value, tuples read as lists, must equal the case's JSON output;
- stdin (LiveCodeBench): each case's input goes to the sandbox; the program's standard output must match the
  expected one line by line, token by token, numbers within 1e-6.
Expected outputs never enter the sandbox, and its exit status is never read: a program passes only by sending
values that compare equal here. Values come back through `code_harness.from_json`, which builds builtin types only.
A timeout, a crash, a reply that is not one well-formed line of at most `_reply_bytes` bytes, or any
call after one of these fails the verdict, even where a check catches the exception it raises.
"""

from __future__ import annotations

import builtins
import functools
import json
import math
import os
import select
import time
from pathlib import Path
from typing import Any, Sequence

from env.tasks.code_harness import from_json, to_json
from env.tasks.sandbox import SandboxLimits, SandboxSession, open_session

_HARNESS = Path(__file__).with_name("code_harness.py")
_EXIT_GRACE_S = 0.5


class CandidateError(Exception):
    """The candidate raised an exception that is not a builtin one; its name and message."""


class _Broken(BaseException):
    """The session failed (timeout, crash, malformed reply). A BaseException, so that a check's `except Exception`
    does not hide it."""


def passes(
    code: str,
    *,
    kind: str,
    entry_point: str = "",
    prompt: str = "",
    test_code: str = "",
    cases: Sequence[tuple[str, str]] = (),
    limits: SandboxLimits = SandboxLimits(),
    layer: str | None = None,
) -> bool:
    """Whether `code` passes the tests of a `kind` problem (see the module docstring), run in a sandbox under
    `layer` (default `isolation_layer()`). Never raises for anything the program does."""
    solution = f"{prompt}{code}\n" if kind == "humaneval" else code
    with open_session(
        _harness_source(), files={"solution.py": solution}, argv=[kind, entry_point], limits=limits, layer=layer
    ) as session:
        try:
            channel = _Channel(session, _reply_bytes(limits, cases))
            return _decide(channel, kind, entry_point, prompt, test_code, cases)
        finally:
            _let_exit(session)


def _reply_bytes(limits: SandboxLimits, cases: Sequence[tuple[str, str]]) -> int:
    """The longest reply read: `limits.max_output_chars`, or for a case whose expected output is longer room for
    that output JSON-escaped (up to 6 bytes a character) with a margin, so an honest long answer fits."""
    return max([limits.max_output_chars, *(8 * len(expected) + 1024 for _, expected in cases)])


def _decide(
    channel: _Channel, kind: str, entry_point: str, prompt: str, test_code: str, cases: Sequence[tuple[str, str]]
) -> bool:
    try:
        if channel.exchange(None) != {"ready": True}:
            return False
        if kind == "humaneval":
            _run_check(channel, prompt, test_code, entry_point)
            return not channel.broken
        for case_input, expected in cases:
            if kind == "stdin":
                actual = channel.value({"stdin": case_input})
                if type(actual) is not str or not outputs_equal(expected, actual):
                    return False
            else:
                arguments = [json.loads(line) for line in case_input.split("\n") if line.strip()]
                actual = channel.value({"args": to_json(arguments), "kwargs": to_json({})})
                if _as_lists(actual) != _as_lists(json.loads(expected)):
                    return False
        return not channel.broken
    except (Exception, _Broken):
        return False


def _let_exit(session: SandboxSession) -> None:
    """Ends the requests, which ends the harness's loop, and waits up to `_EXIT_GRACE_S` for the end of its
    output: a sandbox whose program exited is torn down sooner than one the session has to kill
    (docs/log/2026-12-05-unforgeable-verdict.md), and the verdict is decided already either way."""
    try:
        session.stdin.close()
    except OSError:  # the program is gone and its pipe with it
        return
    output = session.stdout.fileno()
    waiting = select.poll()  # not select(): a grader's process may hold more than 1024 fds
    waiting.register(output, select.POLLIN)
    deadline = time.monotonic() + _EXIT_GRACE_S
    while (left := deadline - time.monotonic()) > 0 and waiting.poll(1000 * left):
        if not os.read(output, 1 << 16):
            return


class _Channel:
    """One request, one reply, over the session's pipes; `broken` once anything went wrong."""

    def __init__(self, session: SandboxSession, max_bytes: int):
        self.session = session
        self.max_bytes = max_bytes
        self.broken = False

    def exchange(self, request: dict | None) -> dict:
        """The reply to `request` (None: the reply the program sends unasked, its "ready")."""
        if self.broken:
            raise _Broken("the sandbox failed earlier")
        try:
            if request is not None:
                self.session.stdin.write(json.dumps(request).encode() + b"\n")
                self.session.stdin.flush()
            line = self.session.stdout.readline(self.max_bytes + 1)
            if not line.endswith(b"\n") or len(line) > self.max_bytes:
                raise ValueError("no complete reply")
            reply = json.loads(line)
            if type(reply) is not dict:
                raise ValueError("a reply is a JSON object")
        except Exception:  # anything the program can make of its side of the pipe: all of it fails the verdict
            self.broken = True
            raise _Broken("no well-formed reply") from None
        return reply

    def value(self, request: dict) -> Any:
        """The decoded value the program replied to `request`; raises the exception it reported."""
        reply = self.exchange(request)
        if list(reply) == ["value"]:
            try:
                return from_json(reply["value"])
            except Exception:
                self.broken = True
                raise _Broken("an undecodable value") from None
        if sorted(reply) == ["error", "message"] and all(type(text) is str for text in reply.values()):
            raise _candidate_exception(reply["error"], reply["message"])
        self.broken = True
        raise _Broken("a reply neither a value nor an error")


def _candidate_exception(name: str, message: str) -> Exception:
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:  # a builtin whose constructor wants other arguments (UnicodeDecodeError, ...)
            pass
    return CandidateError(f"{name}: {message}")


def _run_check(channel: _Channel, prompt: str, test_code: str, entry_point: str) -> None:
    """Runs HumanEval's `check` here (the prompt first: checks call its helpers) on a proxy of the candidate."""

    def candidate(*args: Any, **kwargs: Any) -> Any:
        return channel.value({"args": to_json(list(args)), "kwargs": to_json(kwargs)})

    namespace: dict[str, Any] = {"__name__": "humaneval_check"}
    exec(_compiled_check(prompt, test_code), namespace)
    namespace[entry_point] = candidate
    namespace["check"](candidate)


@functools.lru_cache(maxsize=512)
def _compiled_check(prompt: str, test_code: str):
    return compile(f"{prompt}\n\n{test_code}\n", "<humaneval check>", "exec")


@functools.lru_cache(maxsize=1)
def _harness_source() -> str:
    return _HARNESS.read_text(encoding="utf-8")


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(item) for item in value]
    return value


def _tokens_equal(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    try:
        return math.isclose(float(expected), float(actual), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return False


def outputs_equal(expected: str, actual: str) -> bool:
    """LiveCodeBench's stdin comparison: the same lines after stripping, token by token, numbers within 1e-6."""
    expected_lines = [line.split() for line in expected.strip().splitlines()]
    actual_lines = [line.split() for line in actual.strip().splitlines()]
    if len(expected_lines) != len(actual_lines):
        return False
    for expected_tokens, actual_tokens in zip(expected_lines, actual_lines):
        if len(expected_tokens) != len(actual_tokens):
            return False
        if not all(_tokens_equal(e, a) for e, a in zip(expected_tokens, actual_tokens)):
            return False
    return True
