"""The supervised warm-start trainer's flags (`rl.supervised.SFTConfig`, with the Conductor's task probe as its head:
`conductor.supervised.TaskProbe`)."""

from __future__ import annotations

from absl import flags

from conductor.supervised import TaskProbe
from launch.flag_groups import field_choices, shared
from rl.learner import OptimizerConfig
from rl.supervised import SFTConfig

STEPS = flags.DEFINE_integer(
    "warm_start_steps", None,
    "Warm-start optimizer steps (default: launch.train 0, no warm-start before RL; launch.sft 100).", lower_bound=0,
)
_LR = flags.DEFINE_float(
    "warm_start_learning_rate", 3e-4,
    "Warm-start peak learning rate (reached after warmup; --warm_start_learning_rate_schedule).",
)
_WARMUP = flags.DEFINE_integer(
    "warm_start_warmup_steps", 10, "Linear warmup steps of the warm-start learning rate."
)
_LR_SCHEDULE = flags.DEFINE_enum(
    "warm_start_learning_rate_schedule", "constant", field_choices(OptimizerConfig, "schedule"),
    "After warmup: a constant rate, or a cosine decay to 0 at the last step (the student then settles on the "
    "teacher's average over many batches, e.g. uniform routing, rather than on the last few batches' draws).",
)
CACHE_DIR = flags.DEFINE_string(
    "warm_start_cache_dir", None,
    "A directory of warm-started Conductors keyed by everything that decides them (the Conductor and its seed, the "
    "world, the warm-start's and the teacher's settings, the token masks; not the code): a run whose key is "
    "there loads it instead of warming up, and stores its own otherwise (conductor.warm_start.cached_warm_start). "
    "launch.compare gives its runs one, so a sweep over an RL setting warms up once per seed.",
)
_BATCH = flags.DEFINE_integer("warm_start_batch_size", 8, "Warm-start examples per optimizer step.")
_TASK_PROBE_WEIGHT = flags.DEFINE_float(
    "warm_start_task_probe_weight", 0.0,
    "Weight of a discarded linear probe's task cross-entropy at the first worker-id decision (0: no probe).",
    lower_bound=0.0,
)
_TASK_DECORRELATION_WEIGHT = flags.DEFINE_float(
    "warm_start_task_decorrelation_weight", 0.0,
    "Weight of the mean squared cosine between tasks' mean states at the first worker-id decision (needs "
    "--warm_start_task_probe_weight > 0; 0: off), so that GRPO's update of a worker's output row from one task "
    "does not move the others' logits for it.",
    lower_bound=0.0,
)


def steps(default: int) -> int:
    """--warm_start_steps, or the entry point's own default when it is not set."""
    return default if STEPS.value is None else STEPS.value


def from_flags(steps: int, tasks: int) -> SFTConfig:
    """The trainer's config for `steps` steps over a world of `tasks` tasks (the probe's classes)."""
    optimizer = OptimizerConfig(
        learning_rate=_LR.value, schedule=_LR_SCHEDULE.value, warmup_steps=min(_WARMUP.value, steps),
        total_steps=max(steps, 1),
    )
    if _TASK_DECORRELATION_WEIGHT.value and not _TASK_PROBE_WEIGHT.value:
        raise ValueError(
            "--warm_start_task_decorrelation_weight needs the probe's labels (--warm_start_task_probe_weight > 0)"
        )
    head = None
    if _TASK_PROBE_WEIGHT.value > 0:
        head = TaskProbe(tasks, _TASK_PROBE_WEIGHT.value, _TASK_DECORRELATION_WEIGHT.value)
    return SFTConfig(
        optimizer=optimizer,
        batch_size=_BATCH.value,
        seed=shared.SEED.value,
        head=head,
        share_prompts=shared.SHARE_PROMPTS.value,
    )
