"""The sandbox side of a code verdict (env/tasks/code_verdict.py), and the value codec both sides share.

Run inside the sandbox as its main program, with `solution.py` (the response's code) in its working directory and
argv `[kind, entry_point]`, it serves the trusted grader over its standard input and output, one JSON object a
line: it answers `{"ready": true}` once the solution is loaded, then each request `{"args": ..., "kwargs": ...}`
(humaneval, functional: call the function) or `{"stdin": text}` (stdin: run the program on that input) with
`{"value": ...}` or `{"error": exception name, "message": ...}`. It knows no expected output and decides nothing:
the grader compares what comes back. Before the solution runs, the protocol moves to private copies of fds 0 and 1;
fd 0 becomes /dev/null and fd 1 the standard error, so the solution's own prints cannot interleave with replies.

Values cross as tagged JSON (`to_json` / `from_json`): null, booleans, strings and floats (NaN and infinities
included) as themselves, ints as numbers or {"int": hex} past 63 bits, and {"list" | "tuple" | "set" | "frozenset":
[...]}, {"dict": [[key, value], ...]}, {"bytes": hex}. `from_json` builds only these builtin types and refuses
anything else, so whatever the sandbox sends decodes to plain data (an object whose `__eq__` is always true cannot
cross).
"""

import io
import json
import os
import sys

_CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
_INT_BITS = 63


def to_json(value):
    """`value` (builtin types, nested) as a JSON-able tagged structure; TypeError for any other type. Subclasses
    of the builtin types are sent as the builtin type's value."""
    if value is None or isinstance(value, bool):  # bool admits no subclass
        return value
    if isinstance(value, int):
        value = int.__index__(value)
        return value if value.bit_length() <= _INT_BITS else {"int": hex(value)}
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, dict):
        return {"dict": [[to_json(key), to_json(item)] for key, item in dict.items(value)]}
    for tag, kind in _CONTAINERS.items():
        if isinstance(value, kind):
            return {tag: [to_json(item) for item in kind.__iter__(value)]}
    raise TypeError(f"cannot send a value of type {type(value).__name__}")


def from_json(tagged):
    """The value a `to_json` structure stands for, built from builtin types only; ValueError (or TypeError for an
    unhashable set member or key) for anything that is not such a structure."""
    if tagged is None or type(tagged) in (bool, int, float, str):
        return tagged
    if type(tagged) is dict and len(tagged) == 1:
        ((tag, body),) = tagged.items()
        if tag in ("int", "bytes") and type(body) is str:
            return int(body, 16) if tag == "int" else bytes.fromhex(body)
        if tag in _CONTAINERS and type(body) is list:
            return _CONTAINERS[tag](from_json(item) for item in body)
        if tag == "dict" and type(body) is list and all(type(pair) is list and len(pair) == 2 for pair in body):
            return {from_json(key): from_json(item) for key, item in body}
    raise ValueError(f"not a tagged value: {str(tagged)[:100]}")


def _run_stdin(code, text):
    """The standard output of `code` run as `__main__` on `text`; a non-zero exit status is an error."""
    stdin = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8")
    captured = io.BytesIO()
    stdout = io.TextIOWrapper(captured, encoding="utf-8", write_through=True)
    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = stdin, stdout
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise RuntimeError(f"exited with status {stop.code}") from None
    finally:
        stdout.flush()
        sys.stdin, sys.stdout = saved
    return captured.getvalue().decode("utf-8", errors="replace")


def _callable(kind, namespace, entry_point):
    if kind == "functional" and "Solution" in namespace:
        return getattr(namespace["Solution"](), entry_point)
    return namespace[entry_point]


def main():
    kind, entry_point = sys.argv[1], sys.argv[2]
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)

    def reply(message):
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    def error(caught):
        return {"error": type(caught).__name__, "message": str(caught)[:300]}

    namespace = {"__name__": "__main__" if kind == "humaneval" else "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py", encoding="utf-8") as handle:
            code = compile(handle.read(), "solution.py", "exec")
        if kind != "stdin":
            exec(code, namespace)
            _callable(kind, namespace, entry_point)
    except BaseException as caught:  # SystemExit included: a solution that exits while loading is not loaded
        reply(error(caught))
        return
    reply({"ready": True})
    for line in requests:
        try:
            request = json.loads(line)
            if kind == "stdin":
                value = _run_stdin(code, request["stdin"])
            else:
                function = _callable(kind, namespace, entry_point)
                value = function(*from_json(request["args"]), **from_json(request["kwargs"]))
            message = {"value": to_json(value)}
        except BaseException as caught:
            message = error(caught)
        reply(message)


if __name__ == "__main__":
    main()
