"""Invalid-action masking for the Conductor's worker choice: decoding writes a model id only among a question's
offered ids (`OfferedIdsMask`, a `rollout.types.TokenMask`).

A pool changes which ids a question allows, not what an id means (`env.pools`), so a Conductor that has learnt an
order of preference over workers can use a pool it never saw if the ids it may not name are masked where it writes
one: the workflow it samples is then always over the pool, and its first choice among the offered workers is taken
(Huang and Ontañón 2022, "A Closer Look at Invalid Action Masking in Policy Gradient Algorithms").
Where the completion writes a model id is decided on its text by `env.workflow.model_id_in_progress`, the parser's
own reading of the `model_id` label.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from env.workflow import model_id_in_progress, model_ids
from rollout.types import TokenConstraint


@functools.lru_cache(maxsize=8)
def _id_tokens(tokenizer: Any) -> tuple[tuple[tuple[int, str], ...], tuple[int, ...], tuple[int, ...]]:
    """The vocabulary's tokens an id list is written with: (id, text) of those whose text is spaces then digits; the
    ids of those that hold a digit beside other characters (never allowed inside a model id list); the ids of those
    that are whitespace alone."""
    numbers, mixed, spaces = [], [], []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if text and not text.strip():
            spaces.append(token_id)
        if not any(character.isdigit() for character in text):
            continue
        digits = text.lstrip(" ")
        if digits.isascii() and digits.isdigit():
            numbers.append((token_id, text))
        else:
            mixed.append(token_id)
    return tuple(numbers), tuple(mixed), tuple(spaces)


class OfferedIdsMask:
    """The constraint on a completion's next token that keeps every id of its `model_id` list among `ids`: where an
    id begins (after `[` or `,`), only a token that starts an offered id, or whitespace; while the id is an unfinished
    prefix (a "1" when only 12 is offered), only digits that extend it towards an offered id; after a whole id, any
    token but a digit that would make it another.

    So where the policy would name an absent worker it names its next choice among the offered ones, rather than
    closing the list or writing a name there (a list that names no worker is malformed). Outside the list, and after
    text the mask did not write (an id no offered one completes), any token is allowed.
    """

    def __init__(self, tokenizer: Any, ids: Sequence[int]):
        self.ids = model_ids(tuple(ids))
        self._tokenizer = tokenizer
        self._names = tuple(str(i) for i in self.ids)
        self._constraints: dict[str, TokenConstraint] = {}

    def constraint(self, completion_ids: Sequence[int]) -> TokenConstraint | None:
        written = model_id_in_progress(self._tokenizer.decode(list(completion_ids), skip_special_tokens=True))
        if written is None or not any(name.startswith(written.rstrip()) for name in self._names):
            # Not at an id, or at one no offered id completes (text the mask did not write): nothing to keep valid.
            return None
        if written not in self._constraints:
            self._constraints[written] = self._after(written)
        return self._constraints[written]

    def _after(self, written: str) -> TokenConstraint:
        numbers, mixed, spaces = _id_tokens(self._tokenizer)
        if written != written.rstrip():  # the id ended with a space: no digit may follow it
            return TokenConstraint(tuple(token_id for token_id, _ in numbers) + mixed, only=False)
        # A token with leading spaces starts a new id only where none has begun.
        extends = [
            token_id for token_id, text in numbers
            if (written == "" or not text.startswith(" "))
            and any(name.startswith(written + text.lstrip(" ")) for name in self._names)
        ]
        if not written:
            return TokenConstraint(tuple(extends) + spaces, only=True)
        if written not in self._names:
            return TokenConstraint(tuple(extends), only=True)
        allowed = set(extends)
        return TokenConstraint(
            tuple(token_id for token_id, _ in numbers if token_id not in allowed) + mixed, only=False
        )
