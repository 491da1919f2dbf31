"""The baselines' flags (`conductor.baselines.BaselineConfig`)."""

from __future__ import annotations

from typing import Sequence

from absl import flags

from conductor.baselines import BaselineConfig
from launch.flag_groups import field_values, sampling, shared

_FIELDS = {
    "moa_layers": flags.DEFINE_integer("moa_layers", 1, "Mixture-of-Agents layers (every worker proposes in each)."),
    "reflection_revisions": flags.DEFINE_integer(
        "reflection_revisions", 2, "Revisions of the self-reflection baseline."
    ),
    "consensus_samples": flags.DEFINE_integer(
        "consensus_samples", 3, "Independent samples of the consensus baseline."
    ),
    "bandit_budget": flags.DEFINE_integer(
        "bandit_budget", 1920,
        "Pulls of the contextual UCB1 baseline (conductor.bandit): a training run's feedback budget, iterations x "
        "questions_per_iteration x group_size.",
    ),
    "worker": flags.DEFINE_integer(
        "baseline_worker", None,
        "Worker of self-reflection and consensus and aggregator of MoA (default: the best single worker of this "
        "run).",
    ),
}
BANDIT_TASKS = flags.DEFINE_list(
    "bandit_tasks", None,
    "On a replay world, the questions the contextual UCB1 baseline learns from, named as --tasks names them (the "
    "training files of the run it is compared with); default: the evaluated questions themselves. The orchestration "
    "world's bandit always learns on its training split.",
)
_PROMPTED_CONDUCTORS = flags.DEFINE_list(
    "prompted_conductors", ["0"], "Pool workers each prompted as an untrained Conductor."
)


def from_flags(baselines: Sequence[str]) -> BaselineConfig:
    """The config of `baselines`; a prompted Conductor writes at most `--max_tokens` tokens, like the trained one."""
    return BaselineConfig(
        **field_values(_FIELDS),
        baselines=tuple(baselines),
        prompted_conductors=tuple(int(w) for w in _PROMPTED_CONDUCTORS.value),
        prompted_max_tokens=sampling.from_flags().max_new_tokens,
        seed=shared.SEED.value,
    )
