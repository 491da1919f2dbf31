"""The env's flags: the world (`world`), the reward (`reward`), the workflow format, the executor and the cache."""

from __future__ import annotations

from typing import Any, Mapping, Sequence, get_args

from absl import flags

from conductor.conductor_env import EnvSpec
from env.executor import ExecutorConfig
from env.gym_env import EnvConfig
from env.prompts import ConductorPrompt
from env.workflow import AccessMode
from launch.flag_groups import field_values, reward, shared, world

_FIELDS = {
    "max_steps": flags.DEFINE_integer("max_workflow_steps", 5, "Most steps a workflow may have."),
    "access_mode": flags.DEFINE_enum("access_mode", "binary", get_args(AccessMode), "Access-list format."),
    "conductor_prompt": flags.DEFINE_enum(
        "conductor_prompt", "full", get_args(ConductorPrompt),
        "The Conductor's prompt: 'full' (instructions, the format and example workflows, for a pretrained Conductor) "
        "or 'compact' (the question and the offered model ids alone, for one trained from scratch). A trained "
        "Conductor's is recorded beside it, and launch.eval and launch.serve prompt it so unless this flag is given.",
    ),
    "recursion_rounds": flags.DEFINE_integer(
        "recursion_rounds", 0, "Extra Conductor rounds on the first round's result."
    ),
    "max_concurrency": flags.DEFINE_integer("max_concurrency", 256, "Workflows executed at once."),
    "expected_grades": flags.DEFINE_boolean(
        "expected_grades", False,
        "Grade a synthetic or replay worker's final answer by its probability of being right (for a replay worker, "
        "what its recorded outcome says) instead of a 0/1 draw: same expected reward and accuracy, no draw variance.",
    ),
    "allow_unsandboxed_code": flags.DEFINE_boolean(
        "allow_unsandboxed_code", False,
        "Where no kernel sandbox works (neither bubblewrap nor user namespaces), run the generated programs of code "
        "tasks anyway, with only resource limits and a Python audit hook, which a program can get past: only on a "
        "machine whose every user and file you would trust that program with. Off: such a machine refuses code "
        "tasks.",
    ),
}
_EXECUTOR_FIELDS = {
    "max_tokens": flags.DEFINE_integer("worker_max_tokens", 4096, "Token limit of each worker call."),
    "temperature": flags.DEFINE_float("worker_temperature", 0.2, "Sampling temperature of worker calls."),
}
_CACHE = flags.DEFINE_string("cache", None, "SQLite response cache path (none: no cache).")


def from_flags(tasks: Sequence[str] | None = None, trained: Mapping[str, Any] | None = None) -> EnvSpec:
    """The env of `--world` over `tasks` (default `--tasks`), with the reward, workflow and executor flags;
    `trained` (a trained Conductor's record, `conductor.model.trained_sampling`) gives the prompt it was trained with
    unless --conductor_prompt is on the command line."""
    seed = shared.SEED.value
    values = field_values(_FIELDS)
    if trained is not None and not _FIELDS["conductor_prompt"].present:
        values["conductor_prompt"] = trained.get("conductor_prompt", "full")  # records before the flag: full
    config = EnvConfig(
        **values,
        seed=seed,
        executor=ExecutorConfig(**field_values(_EXECUTOR_FIELDS), seed=seed),
        reward=reward.from_flags(),
    )
    return EnvSpec(world=world.from_flags(tasks), config=config, cache_path=_CACHE.value)
