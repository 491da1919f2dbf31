"""The Conductor's action: a workflow of up to `max_steps` worker calls (docs/design.md sections 3 and 8).

The dataclasses below are the contract used by the executor, the prompts and the baselines.

Grammar (the reference's action format): after free reasoning the completion holds three lists of equal length,

    model_id = [0, 2]
    subtasks = ["Solve the problem.", "Check the solution above and give the final answer."]
    access_list = [[], "all"]

Extraction is lenient because a policy in training writes almost-right text: the label may be followed by `:` or
`=` (and may be quoted or bold), the list is the first balanced `[...]` after the label, brackets inside quoted
strings do not count, smart quotes work as quotes, and each list is read as a Python literal, then as JSON, then
by splitting on top-level commas. `<think>...</think>` blocks are ignored. When a label appears more than once,
the last complete list wins (earlier ones are drafts in the reasoning). Validation is strict: the first problem
found becomes the single line of the `WorkflowFormatError`.

`parse_workflow` never raises anything else, and its work is bounded: completions of at most
MAX_COMPLETION_CHARS, at most 64 label occurrences, each list scanned over at most 20,000 characters.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, Literal, Sequence, Union

Access = Union[Literal["all"], tuple[int, ...]]
AccessMode = Literal["binary", "fine"]

ACCESS_MODES = ("binary", "fine")
LABELS = ("model_id", "subtasks", "access_list")
# A Conductor completion is at most a few thousand tokens; anything much longer is refused before any work.
MAX_COMPLETION_CHARS = 100_000

# A label may be quoted (JSON) or bold (markdown) and is followed by ":" or "=".
_LABEL_RE = re.compile(
    r"(?<![\w])[\"'`*{]{0,4}(model_id|subtasks|access_list)(?![\w])[\"'`*]{0,4}[ \t]*[:=]", re.IGNORECASE
)
# A think tag inside an instruction would hide the lists from the parser, so render escapes its "<".
_THINK_TAG_RE = re.compile(r"<(?=/?think>)", re.IGNORECASE)
_ESCAPED_LESS_THAN = r"\\u003c"
_QUOTE_PAIRS = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
# Between a label and its `[` we skip only layout: spaces, markdown emphasis and a code-fence opener.
_GAP_CHARS = " \t\r\n*`"
_FENCE_LANGUAGES = ("python", "json", "py")
_MAX_GAP = 64
_MAX_NESTING = 3
_ID_IN_PROGRESS_RE = re.compile(r"[0-9]*[ \t\r\n]*")
_MODEL_NAME_RE = re.compile(r"^\s*model[ _]?(?:id)?\s*", re.IGNORECASE)
# Bounds that keep the worst case small: each label occurrence costs at most one scan of one list's length.
_MAX_LABEL_OCCURRENCES = 64
_MAX_LIST_CHARS = 20_000


class WorkflowFormatError(ValueError):
    """The completion is not a valid workflow; the message is one human-readable line."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One worker call: `worker` indexes the pool; `access` is "all" (every earlier step) or earlier indices."""

    worker: int
    instruction: str
    access: Access = ()

    def visible_steps(self, index: int) -> tuple[int, ...]:
        """Indices of the earlier steps this step (at position `index`) may read."""
        if self.access == "all":
            return tuple(range(index))
        return tuple(self.access)


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A parsed action. No steps means "keep the previous answer" (the recursion round's empty lists)."""

    steps: tuple[Step, ...]
    reasoning: str = ""

    @property
    def keeps_previous_answer(self) -> bool:
        return not self.steps

    @property
    def final_step_reads_every_step(self) -> bool:
        """Whether the last step reads every earlier step, directly or through the steps it reads: every call can
        then change the answer (a step nothing reads costs a call and cannot). True for a single step."""
        if not self.steps:
            return False
        last = len(self.steps) - 1
        reached: set[int] = set()
        frontier = [last]
        while frontier:
            index = frontier.pop()
            for earlier in self.steps[index].visible_steps(index):
                if earlier not in reached:
                    reached.add(earlier)
                    frontier.append(earlier)
        return reached >= set(range(last))


def parse_workflow(
    text: str,
    pool: int | Sequence[int],
    max_steps: int = 5,
    access_mode: AccessMode = "binary",
    allow_empty: bool = False,
) -> Workflow:
    """Reads the workflow in a Conductor completion or raises `WorkflowFormatError` with one precise reason.

    `allow_empty=True` (the recursion round) accepts three empty lists as `Workflow(steps=())`.
    In binary mode each access entry is "all" or []; "all" on step 0 becomes (). In fine mode each entry is a
    list of earlier step indices (returned sorted and deduplicated); "all" is accepted as every earlier step.
    `pool` is the model ids a step may name (`model_ids`): a count n for ids 0 to n - 1, or the ids a question
    offers (`env.pools`), whose ids keep the meaning they have in the whole pool.
    """
    ids = model_ids(pool)
    check_settings(len(ids), max_steps, access_mode)
    if not isinstance(text, str):
        raise WorkflowFormatError(f"the completion must be text, got {type(text).__name__}")
    if len(text) > MAX_COMPLETION_CHARS:
        raise WorkflowFormatError(
            f"the completion has {len(text)} characters, more than the limit of {MAX_COMPLETION_CHARS}"
        )
    body = _strip_think(text)
    spans, first_label_at, unbalanced = _find_lists(body)
    missing = [label for label in LABELS if label not in spans]
    if missing:
        if missing[0] in unbalanced:
            raise WorkflowFormatError(
                f"the {missing[0]} list opens with '[' but is not closed within {_MAX_LIST_CHARS} characters"
            )
        names = ", ".join(f"`{label} = [...]`" for label in missing)
        raise WorkflowFormatError(f"missing list{'s' if len(missing) > 1 else ''}: {names}")
    values = {}
    for label in LABELS:
        start, end = spans[label]
        parsed = _parse_list(body[start:end], depth=0)
        if parsed is None:
            raise WorkflowFormatError(f"the {label} list could not be read: {_excerpt(body[start:end])}")
        values[label] = parsed
    workers, subtasks, accesses = values["model_id"], values["subtasks"], values["access_list"]
    reasoning = body[:first_label_at].strip()
    return Workflow(
        steps=_validate(workers, subtasks, accesses, ids, max_steps, access_mode, allow_empty),
        reasoning=reasoning,
    )


def render_workflow(workflow: Workflow, access_mode: AccessMode = "binary") -> str:
    """The text `parse_workflow` reads back as `workflow` (with step 0's "all" normalised to ())."""
    if access_mode not in ACCESS_MODES:
        raise ValueError(f"access_mode must be one of {ACCESS_MODES}, got {access_mode!r}")
    rendered_access = []
    for index, step in enumerate(workflow.steps):
        if access_mode == "fine":
            rendered_access.append(list(step.visible_steps(index)))
        elif step.access == "all" or (index > 0 and tuple(step.access) == tuple(range(index))):
            rendered_access.append("all")
        elif tuple(step.access) == ():
            rendered_access.append([])
        else:
            raise ValueError(
                f"step {index} reads steps {tuple(step.access)}, which binary mode cannot express (\"all\" or [])"
            )
    instructions = json.dumps([step.instruction for step in workflow.steps], ensure_ascii=False)
    lists = "\n".join(
        [
            f"model_id = {json.dumps([step.worker for step in workflow.steps])}",
            f"subtasks = {_THINK_TAG_RE.sub(_ESCAPED_LESS_THAN, instructions)}",
            f"access_list = {json.dumps(rendered_access)}",
        ]
    )
    reasoning = workflow.reasoning.strip()
    return f"{reasoning}\n\n{lists}" if reasoning else lists


def model_ids(pool: int | Sequence[int]) -> tuple[int, ...]:
    """The model ids a workflow may name: 0 to `pool` - 1 for a count, else `pool`'s ids (distinct ints >= 0),
    sorted."""
    if isinstance(pool, bool) or not isinstance(pool, (int, Sequence)) or isinstance(pool, str):
        raise ValueError(f"a pool is a positive int or a sequence of model ids, got {pool!r}")
    if isinstance(pool, int):
        if pool < 1:
            raise ValueError(f"pool_size must be a positive int, got {pool!r}")
        return tuple(range(pool))
    ids = tuple(pool)
    if (not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)
            or len(set(ids)) != len(ids)):
        raise ValueError(f"a pool's model ids are distinct ints >= 0, got {ids!r}")
    return tuple(sorted(ids))


def model_id_in_progress(text: str) -> str | None:
    """Where a completion written so far ends inside its last `model_id` list at an id (after `[` or `,` and any
    spaces, in the id's digits or in spaces after them), that id's text so far: "" before its first digit, "12" or
    "12 " in or after it; None elsewhere.

    Decoding uses it to allow only the offered ids (`conductor.id_mask`); it reads the label as the parser does. Only
    the last `_MAX_LIST_CHARS` characters are read, so a call's work is bounded.
    """
    tail = _strip_think(text[-_MAX_LIST_CHARS:])
    last = None
    for last in _LABEL_RE.finditer(tail):
        pass
    if last is None or last.group(1).lower() != "model_id":
        return None
    opening = _list_start(tail, last.end())
    if opening is None:
        return None
    inside = tail[opening + 1:]
    if "]" in inside or "[" in inside:
        return None
    item = inside.rsplit(",", 1)[-1].lstrip()
    return item if _ID_IN_PROGRESS_RE.fullmatch(item) else None


def check_settings(pool_size: int, max_steps: int, access_mode: str) -> None:
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise ValueError(f"pool_size must be a positive int, got {pool_size!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
    if access_mode not in ACCESS_MODES:
        raise ValueError(f"access_mode must be one of {ACCESS_MODES}, got {access_mode!r}")


def _strip_think(text: str) -> str:
    """Drops `<think>...</think>` blocks, everything before a `</think>` that has no opener (templates that open
    the block in the prompt) and an unclosed `<think>` to the end."""
    lowered = text.lower()
    kept: list[str] = []
    position = 0
    opened = lowered.find("<think>")
    closed = lowered.find("</think>")
    while True:
        if closed >= 0 and (opened < 0 or closed < opened):
            kept.clear()
        elif opened >= 0:
            kept.append(text[position:opened])
            if closed < 0:
                return "".join(kept)
        else:
            kept.append(text[position:])
            return "".join(kept)
        position = closed + len("</think>")
        if 0 <= opened < position:
            opened = lowered.find("<think>", position)
        closed = lowered.find("</think>", position)


def _find_lists(body: str) -> tuple[dict[str, tuple[int, int]], int, set[str]]:
    """Spans of the last complete list after each label, where the earliest chosen label starts, and the labels
    that only ever had an unclosed list. Labels inside an already-read list (e.g. quoted in a subtask) are skipped.
    """
    spans: dict[str, tuple[int, int]] = {}
    label_starts: dict[str, int] = {}
    unbalanced: set[str] = set()
    position = 0
    for _ in range(_MAX_LABEL_OCCURRENCES):
        match = _LABEL_RE.search(body, position)
        if match is None:
            break
        label = match.group(1).lower()
        open_at = _list_start(body, match.end())
        close_at = _matching_bracket(body, open_at) if open_at is not None else None
        if close_at is None:
            if open_at is not None:
                unbalanced.add(label)
            position = match.end()
            continue
        spans[label] = (open_at, close_at + 1)
        label_starts[label] = match.start()
        position = close_at + 1
    else:
        if _LABEL_RE.search(body, position) is not None:
            raise WorkflowFormatError(
                f"the labels model_id/subtasks/access_list occur more than {_MAX_LABEL_OCCURRENCES} times"
            )
    first_label_at = min(label_starts.values()) if label_starts else len(body)
    return spans, first_label_at, unbalanced - set(spans)


def _list_start(body: str, position: int) -> int | None:
    limit = min(len(body), position + _MAX_GAP)
    while position < limit:
        char = body[position]
        if char == "[":
            return position
        if char in _GAP_CHARS:
            position += 1
            continue
        language = next((name for name in _FENCE_LANGUAGES if body.startswith(name, position)), None)
        if language is None or body[position - 1] != "`":
            return None
        position += len(language)
    return None


def _matching_bracket(body: str, open_at: int) -> int | None:
    """Index of the `]` closing `body[open_at]`, ignoring brackets inside quotes; if quotes never balance (an
    apostrophe in an unquoted list), the first bracket-balanced close ignoring quotes."""
    closing = _scan_brackets(body, open_at, quote_aware=True)
    return closing if closing is not None else _scan_brackets(body, open_at, quote_aware=False)


def _scan_brackets(body: str, open_at: int, quote_aware: bool) -> int | None:
    depth = 0
    closing_quote = None
    index = open_at
    end = min(len(body), open_at + _MAX_LIST_CHARS)
    while index < end:
        char = body[index]
        if closing_quote is not None:
            if char == "\\":
                index += 2
                continue
            if char == closing_quote:
                closing_quote = None
        elif quote_aware and char in _QUOTE_PAIRS:
            closing_quote = _QUOTE_PAIRS[char]
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return None


def _parse_list(segment: str, depth: int) -> list[Any] | None:
    """`segment` is `[...]`: a Python literal, then JSON, then the same with smart quotes made straight, then a
    split on top-level commas whose items are read recursively. None when nothing yields a list."""
    candidates = (segment, segment.translate(_SMART_QUOTES))
    for candidate in candidates:
        for reader in (_read_python, _read_json):
            value = reader(candidate)
            if isinstance(value, (list, tuple)):
                return list(value)
    if depth >= _MAX_NESTING:
        return None
    return _split_commas(candidates[1][1:-1], depth)


def _read_python(segment: str) -> Any:
    try:
        return ast.literal_eval(segment)
    except Exception:  # literal_eval raises many types (SyntaxError, ValueError, RecursionError, MemoryError...)
        return None


def _read_json(segment: str) -> Any:
    try:
        return json.loads(segment)
    except Exception:  # ValueError and RecursionError on deep nesting
        return None


def _split_commas(inner: str, depth: int) -> list[Any] | None:
    if not inner.strip():
        return []
    items, current, nesting = [], [], 0
    for char in inner:
        if char == "[":
            nesting += 1
        elif char == "]":
            nesting -= 1
        if char == "," and nesting == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    values = []
    for item in items:
        item = item.strip()
        if item.startswith("[") and item.endswith("]"):
            nested = _parse_list(item, depth + 1)
            if nested is None:
                return None
            values.append(nested)
        else:
            values.append(_strip_quotes(item))
    return values


def _strip_quotes(item: str) -> str:
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "\"'`":
        return item[1:-1]
    return item


def _validate(
    workers: list[Any],
    subtasks: list[Any],
    accesses: list[Any],
    ids: tuple[int, ...],
    max_steps: int,
    access_mode: str,
    allow_empty: bool,
) -> tuple[Step, ...]:
    lengths = (len(workers), len(subtasks), len(accesses))
    if lengths == (0, 0, 0):
        if allow_empty:
            return ()
        raise WorkflowFormatError("the three lists are empty; a workflow needs at least one step")
    if len(set(lengths)) > 1:
        empty = [label for label, length in zip(LABELS, lengths) if length == 0]
        if len(empty) == 1:
            raise WorkflowFormatError(f"the {empty[0]} list is empty but the other lists have {max(lengths)} entries")
        raise WorkflowFormatError(
            "the lists have different lengths: "
            + ", ".join(f"{label} {length}" for label, length in zip(LABELS, lengths))
        )
    if lengths[0] > max_steps:
        raise WorkflowFormatError(f"the workflow has {lengths[0]} steps, more than the limit of {max_steps}")
    steps = []
    for index, (worker, subtask, access) in enumerate(zip(workers, subtasks, accesses)):
        steps.append(
            Step(
                worker=_worker_id(worker, index, ids),
                instruction=_instruction(subtask, index),
                access=_access(access, index, access_mode),
            )
        )
    return tuple(steps)


def _worker_id(value: Any, index: int, ids: tuple[int, ...]) -> int:
    if isinstance(value, str):
        # The prompt lists the pool as "Model id N", which policies sometimes copy into the list.
        value = _MODEL_NAME_RE.sub("", value)
    worker = _as_int(value)
    if worker is None:
        raise WorkflowFormatError(f"model_id[{index}] is {_excerpt(value)}, not an integer model id")
    if worker not in ids:
        if ids == tuple(range(len(ids))):
            raise WorkflowFormatError(f"model_id[{index}] is {worker}, outside the pool's ids 0..{len(ids) - 1}")
        offered = ", ".join(map(str, ids))
        raise WorkflowFormatError(f"model_id[{index}] is {worker}, not one of the offered ids {offered}")
    return worker


def _instruction(value: Any, index: int) -> str:
    if not isinstance(value, str):
        raise WorkflowFormatError(f"subtasks[{index}] is {_excerpt(value)}, not a string")
    if not value.strip():
        raise WorkflowFormatError(f"subtasks[{index}] is empty")
    return value


def _access(value: Any, index: int, access_mode: str) -> Access:
    if isinstance(value, str) and value.strip().lower() == "all":
        if access_mode == "fine":
            return tuple(range(index))
        return "all" if index > 0 else ()
    if access_mode == "binary":
        if isinstance(value, (list, tuple)) and not value:
            return ()
        raise WorkflowFormatError(f'access_list[{index}] is {_excerpt(value)}; binary mode allows only "all" or []')
    if not isinstance(value, (list, tuple)):
        raise WorkflowFormatError(f'access_list[{index}] is {_excerpt(value)}, not a list of step indices or "all"')
    visible = set()
    for entry in value:
        step = _as_int(entry)
        if step is None:
            raise WorkflowFormatError(f"access_list[{index}] contains {_excerpt(entry)}, not a step index")
        if step < 0:
            raise WorkflowFormatError(f"access_list[{index}] contains {step}, a negative step index")
        if step >= index:
            raise WorkflowFormatError(
                f"access_list[{index}] refers to step {step}, which does not come before step {index}"
            )
        visible.add(step)
    return tuple(sorted(visible))


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        stripped = value.strip()
        digits = stripped[1:] if stripped[:1] == "-" else stripped
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            return int(stripped)
    return None


def _excerpt(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) and value.startswith("[") else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
