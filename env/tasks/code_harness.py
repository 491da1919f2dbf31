"""Test runner executed inside the sandbox as its main program (not imported by the package).

Reads `tests.json` ({"kind": "stdin" | "functional", "func_name": str, "cases": [[input, output], ...]}) and
`solution.py` from the working directory, runs the cases in order and exits 0 only if every case passes;
the first failure is described on stderr. LiveCodeBench conventions:
- stdin: the solution is run as `__main__` with the input on stdin; outputs are equal when their lines match
  after stripping, token by token, numbers within 1e-6.
- functional: the input holds one JSON value per line (the arguments); the output is the JSON return value of
  `Solution().<func_name>(*args)` (or of a top-level function of that name).
"""

import io
import json
import math
import os
import sys


class _CaseFailed(Exception):
    pass


def _tokens_equal(expected, actual):
    if expected == actual:
        return True
    try:
        return math.isclose(float(expected), float(actual), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return False


def _outputs_equal(expected, actual):
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


def _run_stdin_case(code, case_input):
    stdin = io.TextIOWrapper(io.BytesIO(case_input.encode()), encoding="utf-8")
    captured = io.BytesIO()
    stdout = io.TextIOWrapper(captured, encoding="utf-8", write_through=True)
    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = stdin, stdout
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise _CaseFailed(f"exited with status {stop.code}")
    finally:
        stdout.flush()
        sys.stdin, sys.stdout = saved
    return captured.getvalue().decode("utf-8", errors="replace")


def _normalise(value):
    if isinstance(value, tuple):
        return [_normalise(item) for item in value]
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def _run_functional_case(namespace, func_name, case_input):
    arguments = [json.loads(line) for line in case_input.split("\n") if line.strip()]
    if "Solution" in namespace:
        function = getattr(namespace["Solution"](), func_name)
    else:
        function = namespace[func_name]
    return _normalise(function(*arguments))


def main():
    with open("tests.json", encoding="utf-8") as handle:
        tests = json.load(handle)
    with open("solution.py", encoding="utf-8") as handle:
        code = compile(handle.read(), "solution.py", "exec")
    # The solution runs in this process and may read files in its working directory: not the expected outputs.
    os.remove("tests.json")
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    if tests["kind"] == "functional":
        exec(code, namespace)
    for number, (case_input, expected) in enumerate(tests["cases"]):
        if tests["kind"] == "stdin":
            actual = _run_stdin_case(code, case_input)
            passed = _outputs_equal(expected, actual)
        else:
            actual = _run_functional_case(namespace, tests["func_name"], case_input)
            passed = actual == _normalise(json.loads(expected))
        if not passed:
            print(f"case {number} failed: expected {expected[:200]!r}, got {str(actual)[:200]!r}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
