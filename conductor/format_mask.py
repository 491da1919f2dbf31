"""Invalid-action masking for the whole workflow: decoding writes only completions `env.workflow.parse_workflow`
reads as a workflow over the question's offered ids (`WorkflowFormatMask`, a `rollout.types.TokenMask`).

`conductor.id_mask` masks the model ids alone; a small Conductor under RL can still lose the format around them (a
label skipped, lists of unequal length, a stop before the lists), and once every sample of a group is malformed
every advantage is 0 and nothing brings the format back. Under this mask the structure is not the policy's to lose:
where the grammar leaves one choice the token is forced (log-probability 0, so RL neither rewards nor punishes it),
and the policy chooses only what a workflow is made of: the reasoning, the number of steps, each model id, each
instruction, each access entry.

The grammar is the canonical form every teacher writes (`conductor.loop_environment.completion_text`: a newline,
then `env.workflow.render_workflow`'s text), read character by character (`WorkflowGrammar`): a newline; one
paragraph of reasoning (any text without a blank line, a `[` or a `<think>` tag: a label in it then has no list to
mislead the parser) and a blank line, or no reasoning;

    model_id = [ID, ID, ...]                 1 to max_steps offered ids
    subtasks = ["...", "..."]                as many JSON strings, each with a non-blank character
    access_list = [[], "all", ...]           as many entries: binary mode [] or "all"; fine mode "all" or
                                             increasing indices of earlier steps

then a stop token. Strings may escape `\\"`, `\\\\`, `\\n`, `\\t` and `\\uXXXX` (no surrogates), and hold no raw
newline or control character and no `<think>` or `</think>` tag (the parser drops think blocks before it reads the
lists). The mask also keeps the workflow within the completion limit: near it, the shortest finish is forced (a
policy that would ramble past the limit writes one-character instructions), so a completion never ends cut off.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from env.workflow import ACCESS_MODES, AccessMode, model_ids
from rollout.types import TokenConstraint

_BLANK_LINE = "\n\n"
# Tokens kept in hand beyond the shortest finish: one token moves that finish by at most five (a backslash, a \u
# escape's digits, an instruction's first non-blank character, an access index), so it is never out of reach.
BUDGET_MARGIN = 6
_FIRST_LABEL = "model_id = ["
_THINK_TAGS = ("<think>", "</think>")
_SIMPLE_ESCAPES = {'"': True, "\\": True, "n": False, "t": False}  # escape letter -> whether it is non-blank
_HEX = frozenset("0123456789abcdefABCDEF")

# A state is a tuple whose first item names the phase:
#   ("start",)                                  the opening newline
#   ("lead", written)                           after it, `written` is so far a prefix of the first label
#   ("reasoning", tail)                         tail: the text's end that may begin a blank line or a think tag
#   ("literal", text, then)                     `text` must follow, then state `then`
#   ("id", written, steps)                      an id of model_id, `written` its digits so far; `steps` ids before
#   ("string_open", index, steps)               subtask `index` of `steps` begins with '"'
#   ("string", index, steps, escape, content, tail)
#   ("access_open", index, steps)               access entry `index` begins
#   ("access_index", index, steps, written, low)  a fine-mode entry: digits `written` of an index >= `low`
#   ("end",)                                    only a stop token
State = tuple


class WorkflowGrammar:
    """The canonical workflow text over `ids` as a character automaton: `step(state, char)` is the next state, or
    None where no workflow continues that way; `complete(state)` says whether a stop may come there."""

    def __init__(self, ids: Sequence[int], max_steps: int, access_mode: AccessMode = "binary"):
        if access_mode not in ACCESS_MODES:
            raise ValueError(f"access_mode must be one of {ACCESS_MODES}, got {access_mode!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        self.ids = model_ids(tuple(ids))
        self.max_steps = max_steps
        self.access_mode = access_mode
        self.names = tuple(str(i) for i in self.ids)

    initial: State = ("start",)

    @staticmethod
    def complete(state: State) -> bool:
        return state[0] == "end"

    def shortest_finish(self, state: State) -> str:
        """The shortest text that completes a workflow from `state`: every open part closed at once, one-character
        instructions, `[]` access entries, no step added."""
        phase = state[0]
        if phase == "start":
            return "\n" + self.shortest_finish(("lead", ""))
        if phase == "lead":
            return _FIRST_LABEL[len(state[1]):] + self._finish_ids("", 0)
        if phase == "reasoning":
            return ("\n" if state[1] == "\n" else _BLANK_LINE) + _FIRST_LABEL + self._finish_ids("", 0)
        if phase == "literal":
            return state[1] + self.shortest_finish(state[2])
        if phase == "id":
            return self._finish_ids(state[1], state[2])
        if phase == "string_open":
            return self._finish_strings(state[1], state[2])
        if phase == "string":
            index, steps, escape, content, _ = state[1:]
            if escape == "\\":
                return '\\"' + self._finish_strings(index + 1, steps, opened=False)
            if escape:
                digits = (escape[1:] + "0041")[:4]  # "A" where no digit is written yet, else zeros after them
                content = content or not chr(int(digits, 16)).isspace()
                return (escape[1:] + "0041")[len(escape) - 1:4] + ("" if content else "x") + '"' + self._finish_strings(
                    index + 1, steps, opened=False)
            return ("" if content else "x") + '"' + self._finish_strings(index + 1, steps, opened=False)
        if phase == "access_open":
            return self._finish_access(state[1], state[2])
        if phase == "access_index":
            index, steps, written, low = state[1:]
            if written == "":
                head = "]" if low == 0 else f"{low}]"
            else:
                head = next(str(k) for k in range(low, index) if str(k).startswith(written))[len(written):] + "]"
            return head + self._finish_access(index + 1, steps, opened=False)
        return ""

    def _finish_ids(self, written: str, steps: int) -> str:
        name = min((n for n in self.names if n.startswith(written)), key=len)
        return name[len(written):] + "]\nsubtasks = [" + self._finish_strings(0, steps + 1)

    def _finish_strings(self, index: int, steps: int, opened: bool = True) -> str:
        """From subtask `index` on (`opened`: at its opening quote; else after the one before it closed)."""
        parts = ['"x"'] * (steps - index)
        text = ", ".join(parts) if opened else "".join(", " + part for part in parts)
        return text + "]\naccess_list = [" + self._finish_access(0, steps)

    @staticmethod
    def _finish_access(index: int, steps: int, opened: bool = True) -> str:
        parts = ["[]"] * (steps - index)
        return (", ".join(parts) if opened else "".join(", " + part for part in parts)) + "]"

    def run(self, text: str, state: State | None = None) -> State | None:
        """The state after `text` from `state` (the initial one by default), or None once a character is refused."""
        state = self.initial if state is None else state
        for char in text:
            state = self.step(state, char)
            if state is None:
                return None
        return state

    def step(self, state: State, char: str) -> State | None:
        phase = state[0]
        if phase == "reasoning":
            return self._reasoning(state[1], char)
        if phase == "start":
            return ("lead", "") if char == "\n" else None
        if phase == "lead":
            written = state[1] + char
            if written == _FIRST_LABEL:
                return ("id", "", 0)
            if _FIRST_LABEL.startswith(written):
                return ("lead", written)
            return self.run(written, ("reasoning", ""))  # no lists yet: the reasoning has begun
        if phase == "literal":
            text, then = state[1], state[2]
            if char != text[0]:
                return None
            return ("literal", text[1:], then) if len(text) > 1 else then
        if phase == "id":
            return self._id(state[1], state[2], char)
        if phase == "string_open":
            return ("string", state[1], state[2], "", False, "") if char == '"' else None
        if phase == "string":
            return self._string(*state[1:], char)
        if phase == "access_open":
            return self._access_open(state[1], state[2], char)
        if phase == "access_index":
            return self._access_index(*state[1:], char)
        return None  # "end": nothing but a stop token

    def _reasoning(self, tail: str, char: str) -> State | None:
        if char == "[":
            return None
        text = tail + char
        if text == _BLANK_LINE:
            return ("literal", _FIRST_LABEL, ("id", "", 0))
        tail = _tail(text, (_BLANK_LINE, *_THINK_TAGS))
        if tail is None:
            return None
        return ("reasoning", tail)

    def _id(self, written: str, steps: int, char: str) -> State | None:
        if char.isdigit() and char.isascii():
            return ("id", written + char, steps) if any(n.startswith(written + char) for n in self.names) else None
        if written not in self.names:
            return None
        if char == "," and steps + 1 < self.max_steps:
            return ("literal", " ", ("id", "", steps + 1))
        if char == "]":
            return ("literal", "\nsubtasks = [", ("string_open", 0, steps + 1))
        return None

    def _string(self, index: int, steps: int, escape: str, content: bool, tail: str, char: str) -> State | None:
        if escape == "\\":
            if char in _SIMPLE_ESCAPES:
                return ("string", index, steps, "", content or _SIMPLE_ESCAPES[char], "")
            return ("string", index, steps, "u", content, "") if char == "u" else None
        if escape:  # "u" and the hex digits of a \uXXXX escape so far
            digits = escape[1:] + char
            # A surrogate is refused at its second digit (D8 to DF), so no allowed digit leads where none can follow.
            if char not in _HEX or (len(digits) == 2 and 0xD8 <= int(digits, 16) <= 0xDF):
                return None
            if len(digits) < 4:
                return ("string", index, steps, escape + char, content, "")
            return ("string", index, steps, "", content or not chr(int(digits, 16)).isspace(), "")
        if char == "\\":
            return ("string", index, steps, "\\", content, "")
        if char == '"':
            if not content:
                return None
            if index + 1 < steps:
                return ("literal", ", ", ("string_open", index + 1, steps))
            return ("literal", "]\naccess_list = [", ("access_open", 0, steps))
        if char == "\n" or ord(char) < 0x20:
            return None
        tail = _tail(tail + char, _THINK_TAGS)
        if tail is None:
            return None
        return ("string", index, steps, "", content or not char.isspace(), tail)

    def _after_access(self, index: int, steps: int) -> State:
        if index + 1 < steps:
            return ("literal", ", ", ("access_open", index + 1, steps))
        return ("literal", "]", ("end",))

    def _access_open(self, index: int, steps: int, char: str) -> State | None:
        if char == '"':
            return ("literal", 'all"', self._after_access(index, steps))
        if char != "[":
            return None
        if self.access_mode == "binary" or index == 0:
            return ("literal", "]", self._after_access(index, steps))
        return ("access_index", index, steps, "", 0)

    def _access_index(self, index: int, steps: int, written: str, low: int, char: str) -> State | None:
        # Indices of earlier steps, increasing, without leading zeros: each digit must keep a value in [low, index)
        # reachable, so no allowed character leads where nothing can follow.
        if char.isdigit() and char.isascii():
            digits = written + char
            if written == "0" or not any(str(k).startswith(digits) for k in range(low, index)):
                return None
            return ("access_index", index, steps, digits, low)
        if written == "":
            return self._after_access(index, steps) if char == "]" and low == 0 else None
        if not low <= int(written) < index:
            return None
        if char == "," and int(written) + 1 < index:
            return ("literal", " ", ("access_index", index, steps, "", int(written) + 1))
        return self._after_access(index, steps) if char == "]" else None


# Characters after which the free-text phases may change state or refuse: a token without any is accepted there as
# it stands (`_free_text_accepts`).
_FREE_TEXT_SPECIAL = frozenset('\n<"\\[') | frozenset(chr(code) for code in range(0x20))


def _free_text_accepts(state: State, text: str) -> bool | None:
    """Whether `text` is accepted from `state` without running the automaton: True where `state` is free text with
    nothing pending (reasoning, or a string outside an escape, with no tag begun) and `text` holds no special
    character; None where the automaton must decide."""
    free = (state[0] == "reasoning" and state[1] == "") or (state[0] == "string" and state[3] == "" and state[5] == "")
    if free and text and _FREE_TEXT_SPECIAL.isdisjoint(text):
        return True
    return None


@functools.lru_cache(maxsize=8)
def _vocabulary(tokenizer: Any) -> tuple[dict[str, tuple[tuple[int, str], ...]], tuple[tuple[int, str], ...],
                                         frozenset[int], int]:
    """The tokens decoding writes text with, grouped by their first character ((id, text) pairs); those of them
    that hold a character special to free text (`_FREE_TEXT_SPECIAL`); the special tokens' ids (decoded to
    nothing); the count of tokens with text."""
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    groups: dict[str, list[tuple[int, str]]] = {}
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if token_id not in special and text:
            groups.setdefault(text[0], []).append((token_id, text))
    pairs = [pair for group in groups.values() for pair in group]
    free_text_special = tuple(pair for pair in pairs if not _FREE_TEXT_SPECIAL.isdisjoint(pair[1]))
    return {first: tuple(group) for first, group in groups.items()}, free_text_special, special, len(pairs)


class WorkflowFormatMask:
    """The constraint on a completion's next token that keeps it a prefix of a canonical workflow over `ids`
    (`WorkflowGrammar`) that fits in `max_tokens`, and allows a stop (`stop_token_ids`) only once the workflow is
    complete. The tokens allowed at a state are those whose text the grammar accepts from it; special tokens are never
    allowed but a stop at the end. Once the tokens left are within `BUDGET_MARGIN` of what the shortest finish from
    the state takes (`WorkflowGrammar.shortest_finish`, as the tokenizer writes it, the stop included), that finish is
    forced token by token, and a step is not added where its shortest finish would not fit: so every completion stops,
    and parses, within `max_tokens`. After text the mask did not write (a completion decoded without it), no
    constraint."""

    def __init__(self, tokenizer: Any, ids: Sequence[int], max_steps: int, access_mode: AccessMode,
                 stop_token_ids: Sequence[int], max_tokens: int):
        if not stop_token_ids:
            raise ValueError("the workflow-format mask needs the stop token ids that end a completion")
        self.grammar = WorkflowGrammar(ids, max_steps, access_mode)
        self.ids = self.grammar.ids
        self.stop_token_ids = tuple(sorted({int(t) for t in stop_token_ids}))
        self._tokenizer = tokenizer
        self._constraints: dict[Any, TokenConstraint] = {}
        self._reserves: dict[State, int] = {}
        shortest = self.reserve(self.grammar.initial)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < shortest + BUDGET_MARGIN:
            raise ValueError(f"max_tokens must be an int >= {shortest + BUDGET_MARGIN} (the shortest workflow takes "
                             f"{shortest} tokens with its stop), got {max_tokens!r}")
        self.max_tokens = max_tokens

    def reserve(self, state: State) -> int:
        """The tokens the shortest finish from `state` takes, its stop included."""
        if state not in self._reserves:
            finish = self.grammar.shortest_finish(state)
            self._reserves[state] = len(self._tokenizer.encode(finish, add_special_tokens=False)) + 1
        return self._reserves[state]

    def constraint(self, completion_ids: Sequence[int]) -> TokenConstraint | None:
        state = self.grammar.run(self._tokenizer.decode(list(completion_ids), skip_special_tokens=True))
        if state is None:
            return None
        left = self.max_tokens - len(completion_ids)
        if left <= self.reserve(state) + BUDGET_MARGIN:
            key: Any = ("finish", state)
            if key not in self._constraints:
                finish = self._tokenizer.encode(self.grammar.shortest_finish(state), add_special_tokens=False)
                self._constraints[key] = TokenConstraint(finish[:1] or self.stop_token_ids, only=True)
            return self._constraints[key]
        # Only in the model_id list, after a whole id, does one token add a step (its comma); the other tokens move the
        # shortest finish by a few tokens at most, which the margin covers.
        adds_step = state[0] == "id" and state[1] in self.grammar.names and state[2] + 1 < self.grammar.max_steps
        step_fits = not adds_step or left - 1 > self.reserve(("literal", " ", ("id", "", state[2] + 1))) + BUDGET_MARGIN
        key = (state, step_fits)
        if key not in self._constraints:
            self._constraints[key] = self._at(state, step_fits)
        return self._constraints[key]

    def _at(self, state: State, step_fits: bool = True) -> TokenConstraint:
        if self.grammar.complete(state):
            return TokenConstraint(self.stop_token_ids, only=True)
        groups, free_text_special, special, count = _vocabulary(self._tokenizer)
        if _free_text_accepts(state, "a"):
            # Free text accepts every token without a special character, so only those with one are run.
            refused = [token_id for token_id, text in free_text_special if self.grammar.run(text, state) is None]
            return TokenConstraint(tuple(refused) + tuple(special), only=False)
        allowed = []
        # A token's first character decides most of it: a group whose first character is refused is skipped whole;
        # the structural phases take ASCII characters alone.
        structural = state[0] not in ("reasoning", "string")
        for first, group in groups.items():
            if structural and not first.isascii():
                continue
            after_first = self.grammar.step(state, first)
            if after_first is not None and (step_fits or first != ","):
                allowed.extend(
                    token_id for token_id, text in group
                    if _free_text_accepts(after_first, text[1:]) or self.grammar.run(text[1:], after_first) is not None
                )
        if len(allowed) <= count // 2:
            return TokenConstraint(tuple(allowed), only=True)
        allowed_set = set(allowed)
        refused = [token_id for group in groups.values() for token_id, _ in group if token_id not in allowed_set]
        return TokenConstraint(tuple(refused) + tuple(special), only=False)


def _tail(text: str, patterns: Sequence[str]) -> str | None:
    """The longest end of `text` that begins one of `patterns` (compared in lower case), or None where `text` ends
    with a think tag."""
    lowered = text.lower()
    if any(lowered.endswith(tag) for tag in _THINK_TAGS):
        return None
    for start in range(len(text)):
        if any(pattern.startswith(lowered[start:]) for pattern in patterns):
            return text[start:]
    return ""
