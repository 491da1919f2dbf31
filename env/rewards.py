"""The reward of one Conductor completion (docs/design.md section 8), with every term reported for logging.

    outcome = format_error                                  if the workflow did not parse
            = wrong + (correct - wrong) * grade             otherwise (grade in [0, 1]; 0.5 / 1 by default)
    total   = outcome + format_bonus - step_penalty * steps
              - token_penalty * tokens / 1000 - usd_penalty * cost_usd        (extra terms: valid workflows only)
    blended = recursion_discount * previous_reward + (1 - recursion_discount) * total   (a later recursion round)

The defaults are the paper's: 0 / 0.5 / 1 and no shaping. The blend is our reading of the paper's discounted
first-round reward (0.25 in the paper, 0.2 in the authors' code): the earlier round's reward enters a later
round's reward with weight `recursion_discount`.
"""

from __future__ import annotations

import dataclasses

from env.executor import Execution
from env.workflow import WorkflowFormatError


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    format_error: float = 0.0
    wrong: float = 0.5
    correct: float = 1.0
    format_bonus: float = 0.0
    step_penalty: float = 0.0
    token_penalty: float = 0.0  # per 1,000 worker tokens (prompt + completion)
    usd_penalty: float = 0.0  # per US dollar of worker cost
    recursion_discount: float = 0.2

    def __post_init__(self) -> None:
        for name in ("step_penalty", "token_penalty", "usd_penalty"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} is a penalty and must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.recursion_discount <= 1.0:
            raise ValueError(f"recursion_discount must be in [0, 1], got {self.recursion_discount}")


def reward(
    execution: Execution | None,
    grade: float | None,
    parse_error: WorkflowFormatError | str | None,
    config: RewardConfig = RewardConfig(),
    *,
    previous_reward: float | None = None,
) -> tuple[float, dict[str, float]]:
    """(reward, components). A format error needs no execution or grade; a valid workflow needs both."""
    if parse_error is not None:
        components = {"outcome": config.format_error, "format_valid": 0.0}
        total = config.format_error
    else:
        if execution is None or grade is None:
            raise ValueError("a valid workflow needs its execution and grade")
        if not 0.0 <= grade <= 1.0:
            raise ValueError(f"grade must be in [0, 1], got {grade}")
        components = {
            "outcome": config.wrong + (config.correct - config.wrong) * grade,
            "format_valid": 1.0,
            "format_bonus": config.format_bonus,
            "step_penalty": -config.step_penalty * len(execution.steps),
            "token_penalty": -config.token_penalty * execution.tokens / 1000.0,
            "usd_penalty": -config.usd_penalty * execution.cost_usd,
        }
        total = sum(value for name, value in components.items() if name != "format_valid")
    if previous_reward is not None:
        components["this_round"] = total
        components["previous_round"] = previous_reward
        total = config.recursion_discount * previous_reward + (1.0 - config.recursion_discount) * total
    components["total"] = total
    return total, components
