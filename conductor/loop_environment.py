"""`TokenizedConductorEnv`: the `rl.loop.Environment` protocol over an `env.gym_env.ConductorEnv` and the Conductor's
tokenizer, and the per-rollout metrics it reports."""

from __future__ import annotations

import bisect
import functools
import re
import threading
from typing import Any, Literal, Sequence, get_args

from conductor.advantages import ROUTE
from conductor.format_mask import WorkflowFormatMask
from conductor.id_mask import OfferedIdsMask
from env.gym_env import ConductorEnv, Scored
from env.pools import offered_ids
from env.workflow import AccessMode, Step, Workflow, render_workflow
from models.tokenizer import render_chat
from rl.loop import Rollout

# What decoding is masked to: nothing, the offered model ids (`conductor.id_mask`) or the whole workflow over them
# (`conductor.format_mask`).
TokenMasks = Literal["none", "ids", "workflow"]
TOKEN_MASKS = get_args(TokenMasks)


def rollout_metrics(scored: Scored) -> dict[str, float]:
    """The per-rollout numbers the loop averages and the evaluation reports."""
    metrics = {
        "valid_format": float(scored.parse_error is None),
        "correct": float(scored.grade or 0.0),
        "steps": float(len(scored.workflow.steps)) if scored.workflow else 0.0,
        # A workflow of several calls whose every call can change the final answer.
        "multi_step_reading": float(
            scored.workflow is not None and len(scored.workflow.steps) >= 2
            and scored.workflow.final_step_reads_every_step
        ),
    }
    if scored.execution is not None:
        metrics.update(
            worker_calls=float(scored.execution.calls),
            tokens=float(scored.execution.tokens),
            cost_usd=float(scored.execution.cost_usd),
            failed_steps=float(scored.execution.failed_steps),
        )
    if scored.code_tamper_suspect is not None:  # only code passes carry it: its mean is their share flagged
        metrics["code_tamper_suspect"] = float(scored.code_tamper_suspect)
    return metrics


# The first `model_id` list: the label, `=` or `:`, then everything up to its closing bracket.
_WORKER_LIST_RE = re.compile(r"model_id\W{0,4}[=:]\s*\[([^\]]*)\]", re.IGNORECASE)


def worker_id_tokens(tokenizer: Any, ids: Sequence[int]) -> tuple[int, ...]:
    """Indices of the completion tokens that write each worker id of the first `model_id = [...]` list (the token
    holding an id's first digit), in order; empty without such a list.

    Decoded prefixes only grow as tokens are added, so a binary search over prefix lengths finds each id's token.
    """
    match = _WORKER_LIST_RE.search(tokenizer.decode(list(ids), skip_special_tokens=True))
    if match is None:
        return ()
    offsets = [match.start(1) + digits.start() for digits in re.finditer(r"\d+", match.group(1))]

    def decoded_length(prefix_end: int) -> int:
        return len(tokenizer.decode(list(ids[: prefix_end + 1]), skip_special_tokens=True))

    return tuple(bisect.bisect_right(range(len(ids)), offset, key=decoded_length) for offset in offsets)


def completion_text(workflow: Workflow, access_mode: AccessMode = "binary") -> str:
    """`workflow` as the Conductor writes it: a newline first, so the workflow follows a blank line after the prompt's
    prefix (`env.prompts.CONDUCTOR_PREFIX`, which ends in one), the format every teacher and test completion uses."""
    return "\n" + render_workflow(workflow, access_mode)


def completion_ids(environment: TokenizedConductorEnv, workflow: Workflow) -> tuple[int, ...]:
    """The tokens of `workflow` as a target completion, ending with EOS so the Conductor learns to stop."""
    text = completion_text(workflow, environment.env.config.access_mode)
    return tuple(environment.tokenizer.encode(text, add_special_tokens=False)) + (environment.tokenizer.eos_token_id,)


class TokenizedConductorEnv:
    """A `ConductorEnv` seen through the Conductor's tokenizer, as `rl.loop.Environment`: prompts through the
    Conductor's chat template, completions decoded from the generator's own token ids, scores from the env (which
    owns the reward). `score_async` scores on the running event loop, so the asynchronous pipeline (`rl.pipeline`)
    runs many groups' workflows at once; the tokenizer is used by one thread at a time (a fast tokenizer is not
    safe to share)."""

    def __init__(self, env: ConductorEnv, tokenizer: Any, token_masks: TokenMasks = "none",
                 max_tokens: int | None = None):
        if token_masks not in TOKEN_MASKS:
            raise ValueError(f"token_masks must be one of {TOKEN_MASKS}, got {token_masks!r}")
        if token_masks == "workflow" and env.config.recursion_rounds:
            raise ValueError("the workflow-format mask covers first-round workflows; it does not take recursion rounds")
        if token_masks == "workflow" and max_tokens is None:
            raise ValueError("the workflow-format mask needs the completion limit (max_tokens) it fits workflows in")
        self.env = env
        self.tokenizer = tokenizer
        self.token_masks = token_masks
        self.max_tokens = max_tokens
        self.tasks = env.world.tasks
        self.num_questions = len(self.tasks)
        self.question_labels = [task.task_label for task in self.tasks]
        self._prompts: dict[int, list[int]] = {}
        self._masks: dict[tuple[int, ...], OfferedIdsMask | WorkflowFormatMask] = {}
        self._tokenizer_lock = threading.RLock()

    @functools.cached_property
    def route_token_ids(self) -> tuple[int, ...]:
        """The tokens that can write the first digit of a workflow's first worker id, over the pool: the token
        `worker_id_tokens` finds in each worker's one-step workflow (the route entropy term's `token_ids`,
        `conductor.losses.route_entropy`)."""
        choices = set()
        for worker in range(len(self.env.world.pool)):
            ids = completion_ids(self, Workflow(steps=(Step(worker=worker, instruction="Answer."),)))
            choices.add(ids[worker_id_tokens(self.tokenizer, ids)[0]])
        return tuple(sorted(choices))

    def prompt_ids(self, question: int) -> list[int]:
        with self._tokenizer_lock:
            if question not in self._prompts:
                observation = self.env.observation(self.tasks[question])
                self._prompts[question] = render_chat(self.tokenizer, observation["messages"], observation["prefix"])
            return self._prompts[question]

    @property
    def masked(self) -> bool:
        """Whether the Conductor decodes under `token_mask` (in training, the warm-start and the evaluation)."""
        return self.token_masks != "none"

    def token_mask(self, question: int) -> OfferedIdsMask | WorkflowFormatMask:
        """The mask `token_masks` names for the question's offered ids: its model ids among them
        (`conductor.id_mask`), or the whole workflow over them (`conductor.format_mask`); questions offered the same
        pool share one."""
        if not self.masked:
            raise ValueError("this environment decodes without token masks (token_masks='none')")
        ids = offered_ids(self.tasks[question], len(self.env.world.pool))
        if ids not in self._masks:
            config = self.env.config
            self._masks[ids] = (
                WorkflowFormatMask(self.tokenizer, ids, config.max_steps, config.access_mode,
                                   (self.tokenizer.eos_token_id,), self.max_tokens)
                if self.token_masks == "workflow" else OfferedIdsMask(self.tokenizer, ids)
            )
        return self._masks[ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def score(self, questions, completions, contexts, sample_ids) -> list[Rollout]:
        tasks = [self.tasks[q] for q in questions]
        scored = self.env.score_batch_sync(
            tasks, [self.decode(c) for c in completions], sample_indices=list(sample_ids), previous=contexts
        )
        return self._rollouts(tasks, scored, completions)

    async def score_async(self, questions, completions, contexts, sample_ids) -> list[Rollout]:
        tasks = [self.tasks[q] for q in questions]
        scored = await self.env.score_batch(
            tasks, [self.decode(c) for c in completions], sample_indices=list(sample_ids), previous=contexts
        )
        return self._rollouts(tasks, scored, completions)

    def _rollouts(self, tasks, scored, completions) -> list[Rollout]:
        with self._tokenizer_lock:
            rollouts = []
            oracle = self.env.world.oracle
            for task, result, completion in zip(tasks, scored, completions):
                metrics = rollout_metrics(result)
                if oracle is not None:
                    # Whether the workflow's answer comes from the worker the known optimal plan ends with (a recursion
                    # round that kept its answer: the worker that gave it in an earlier round).
                    execution = result.execution
                    while execution is not None and not execution.steps:
                        execution = execution.previous
                    final = execution.steps[-1].worker if execution is not None else None
                    metrics["oracle_route"] = float(final == oracle.plans[task.task_label].final)
                followup = None
                if result.round < self.env.config.recursion_rounds and result.workflow is not None:
                    observation = self.env.observation(task, result)
                    followup = render_chat(self.tokenizer, observation["messages"], observation["prefix"])
                workers = tuple(step.worker for step in result.workflow.steps) if result.workflow else ()
                route_tokens = worker_id_tokens(self.tokenizer, completion) if workers else ()
                rollouts.append(
                    Rollout(
                        reward=result.reward,
                        metrics=metrics,
                        labels={ROUTE: workers or None},
                        # A list the parser read in another form than the pattern's gives no decision tokens.
                        marked_tokens={ROUTE: route_tokens if len(route_tokens) == len(workers) else ()},
                        record={"workers": list(workers)},
                        histograms={"workers_chosen": workers},
                        context=result,
                        followup_prompt_ids=followup,
                    )
                )
            return rollouts
