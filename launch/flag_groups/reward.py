"""The reward's flags."""

from __future__ import annotations

from absl import flags

from env.rewards import RewardConfig
from launch.flag_groups import field_values

_FIELDS = {
    "format_error": flags.DEFINE_float("reward_format_error", 0.0, "Reward of a completion that does not parse."),
    "wrong": flags.DEFINE_float("reward_wrong", 0.5, "Reward of a valid workflow with a wrong answer."),
    "correct": flags.DEFINE_float("reward_correct", 1.0, "Reward of a correct answer."),
    "format_bonus": flags.DEFINE_float("format_bonus", 0.0, "Added to every valid workflow's reward."),
    "step_penalty": flags.DEFINE_float("workflow_step_penalty", 0.0, "Subtracted per workflow step."),
    "token_penalty": flags.DEFINE_float("token_penalty", 0.0, "Subtracted per 1,000 worker tokens."),
    "usd_penalty": flags.DEFINE_float("usd_penalty", 0.0, "Subtracted per US dollar of worker cost."),
    "recursion_discount": flags.DEFINE_float("recursion_discount", 0.2, "Weight of an earlier round's reward."),
}


def from_flags() -> RewardConfig:
    return RewardConfig(**field_values(_FIELDS))
