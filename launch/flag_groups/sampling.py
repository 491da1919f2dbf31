"""The Conductor's sampling flags."""

from __future__ import annotations

import dataclasses
import pathlib

from absl import flags

from conductor.loop_environment import TokenMasks
from conductor.model import trained_sampling
from launch.flag_groups import field_values, shared
from rollout.types import SamplingParams

_FIELDS = {
    "temperature": flags.DEFINE_float("temperature", 1.0, "Conductor sampling temperature."),
    "top_p": flags.DEFINE_float("top_p", 1.0, "Conductor nucleus sampling."),
    "top_k": flags.DEFINE_integer("top_k", 0, "Conductor top-k sampling (0: off)."),
    "max_new_tokens": flags.DEFINE_integer("max_tokens", 1024, "Most tokens the Conductor writes per completion."),
}


MASK_UNOFFERED_IDS = flags.DEFINE_boolean(
    "mask_unoffered_ids", False,
    "Invalid-action masking: the Conductor writes each model id only among the ids its question offers "
    "(conductor.id_mask): in the warm-start's likelihood, in training (the learner's log-probs take the same mask, "
    "LoopConfig.mask_tokens) and in the greedy evaluation (launch.train's --eval_tasks, launch.eval).",
)
MASK_WORKFLOW_FORMAT = flags.DEFINE_boolean(
    "mask_workflow_format", False,
    "Invalid-action masking of the whole workflow: the Conductor writes only completions that parse as a workflow "
    "over its question's offered ids, in the canonical form (conductor.format_mask: one paragraph of reasoning, a "
    "blank line, the three lists, a stop); where the form leaves one choice the token is forced. Masks the ids as "
    "--mask_unoffered_ids does, and where it does (warm-start, training, greedy evaluation). No recursion rounds.",
)


def token_masks() -> TokenMasks:
    """What the Conductor decodes under (`TokenizedConductorEnv.token_masks`): --mask_workflow_format's whole
    workflow, else --mask_unoffered_ids's ids, else nothing."""
    if MASK_WORKFLOW_FORMAT.value:
        return "workflow"
    return "ids" if MASK_UNOFFERED_IDS.value else "none"


def from_flags(
    trained_conductor: pathlib.Path | None = None, default_temperature: float | None = None
) -> SamplingParams:
    """The sampling flags; for a `trained_conductor` (the Conductor's directory), unless `--max_tokens`
    (`--temperature`) is on the command line, its completion limit (temperature) is the one it was trained with: a
    small Conductor whose greedy completion never stops would otherwise hold every batch for the flag's default 1024
    steps, and its format is reliable at the temperature it was trained at, not necessarily at the flag's default
    1.0. `default_temperature`, when given, replaces the temperature wherever `--temperature` is not on the command
    line (launch.eval's 0: greedy). launch.serve decodes greedily first; this temperature is for its samples."""
    params = SamplingParams(**field_values(_FIELDS), seed=shared.SEED.value)
    trained = trained_sampling(trained_conductor) if trained_conductor is not None else None
    if trained is not None and not _FIELDS["max_new_tokens"].present:
        params = dataclasses.replace(params, max_new_tokens=int(trained["max_new_tokens"]))
    if not _FIELDS["temperature"].present:
        if default_temperature is not None:
            params = dataclasses.replace(params, temperature=default_temperature)
        elif trained is not None and "temperature" in trained:
            params = dataclasses.replace(params, temperature=float(trained["temperature"]))
    return params
