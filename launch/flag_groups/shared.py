"""Flags that several groups read: the run's seed and two choices both the learner and the warm-start follow."""

from __future__ import annotations

from absl import flags

SEED = flags.DEFINE_integer("seed", 0, "Seed of initialisation, data order and sampling.")
STRATIFY_QUESTIONS = flags.DEFINE_boolean(
    "stratify_questions", False,
    "Questions take the tasks in turn: each training iteration holds one of each per run of as many questions as "
    "there are tasks, and the world warm-start teacher draws the tasks equally.",
)
SHARE_PROMPTS = flags.DEFINE_boolean(
    "share_prompts", True,
    "Encode a prompt once per block of consecutive rows that carry it: a GRPO group in the learner, a question's "
    "routes in the world warm-start (the same update, less work).",
)
