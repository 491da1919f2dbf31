"""The warm-start teacher's flags (`conductor.teachers.TeacherConfig`)."""

from __future__ import annotations

from typing import get_args

from absl import flags

from conductor.teachers import Reasoning, RouteWeighting, Teacher, TeacherConfig
from env.policies import DEFAULT_TEMPLATES, TEMPLATES
from launch.flag_groups import field_values, shared

_FIELDS = {
    "teacher": flags.DEFINE_enum(
        "warm_start_teacher", "templates", get_args(Teacher),
        "Where the targets come from: template workflows with drawn workers (templates), a run log's high-reward "
        "completions (rollouts), template workflows graded in the world (world), or each training question's best "
        "workflow under the run's reward, where the world knows it exactly (optimum: --world=orchestration).",
    ),
    "rollouts": flags.DEFINE_string("warm_start_rollouts", None, "A run's rollouts.jsonl (teacher=rollouts)."),
    "min_reward": flags.DEFINE_float("warm_start_min_reward", 1.0, "Keep logged rollouts with at least this reward."),
    "world_weights": flags.DEFINE_enum(
        "warm_start_world_weights", "grade", get_args(RouteWeighting),
        "How the world teacher weights a route: by its grade, or by how far its grade exceeds the mean grade of the "
        "question's routes (routes at or under the mean get 0).",
    ),
    "reasoning": flags.DEFINE_enum(
        "warm_start_reasoning", "template", get_args(Reasoning),
        "The reasoning line of the templates and world teachers' workflows: the template's own, or the template's "
        "opened by the question's task label ('This is a gsm8k question.').",
    ),
    "all_routes": flags.DEFINE_boolean(
        "warm_start_all_routes", False,
        "Templates teacher: write each drawn question's template once per pool worker, so the warm-start's routing "
        "target is exactly uniform on every question (drawn workers leave chance leanings task by task).",
    ),
}
_TEMPLATES = flags.DEFINE_list(
    "warm_start_templates", list(DEFAULT_TEMPLATES),
    f"Template policies of the templates teacher, of {', '.join(TEMPLATES)}.",
)


def from_flags() -> TeacherConfig:
    return TeacherConfig(
        **field_values(_FIELDS), templates=tuple(_TEMPLATES.value), stratify_questions=shared.STRATIFY_QUESTIONS.value
    )
