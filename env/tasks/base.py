"""A benchmark question and its grader (docs/design.md section 3)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

Grader = Callable[[str, Any], float]


@dataclasses.dataclass(frozen=True)
class Task:
    """One question. `grade(response_text)` returns a score in [0, 1].

    `metadata` carries what a world knows about the question beyond the gold answer (for example the recorded
    per-model outcomes of the replay world under the key "scores").
    """

    id: str
    task_label: str
    question: str
    gold: Any
    grader: Grader = dataclasses.field(repr=False, compare=False)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def grade(self, response_text: str) -> float:
        score = float(self.grader(response_text, self.gold))
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"grader for {self.id} returned {score}, outside [0, 1]")
        return score
