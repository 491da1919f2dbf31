"""The Conductor's action: a workflow of up to `max_steps` worker calls (DESIGN.md sections 3 and 8).

The dataclasses below are the contract used by the executor, the prompts and the baselines.
`parse_workflow` and `render_workflow` are implemented in this module too.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

Access = Union[Literal["all"], tuple[int, ...]]
AccessMode = Literal["binary", "fine"]


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
