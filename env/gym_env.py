"""The Conductor's environment: a gymnasium `Env` for one question at a time, and a batched async API.

Observation: the Conductor prompt (messages, the assistant prefix it continues, a plain-text rendering) and the
task id. Action: the completion text (what follows the prefix). One round is one step; with `recursion_rounds`
> 0 the episode continues with the recursion prompt until the last round or a format error. Info: the parsed
workflow or the format error, the execution record, the grade and the reward components.

`score_batch` scores many completions concurrently (bounded by `max_concurrency`); grading runs in a thread pool
(code graders wait on sandboxed processes), never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import random
from typing import Any, Sequence

import gymnasium

from env import prompts
from env.executor import Execution, ExecutorConfig, aclose_workers, execute_async, expected_grade
from env.pools import offered_ids
from env.rewards import RewardConfig, reward
from env.tasks import sandbox
from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code, tamper_suspect
from env.workers.base import Message
from env.workers.cache import ResponseCache
from env.workflow import AccessMode, Workflow, WorkflowFormatError, parse_workflow, render_workflow
from env.worlds import World


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    max_steps: int = 5
    access_mode: AccessMode = "binary"
    conductor_prompt: prompts.ConductorPrompt = "full"
    recursion_rounds: int = 0
    max_concurrency: int = 1024
    grading_threads: int = 8
    seed: int = 0
    # Grade a world-model worker's final answer by its probability of being right instead of its 0/1 draw: the
    # same expected reward and accuracy, without the draw's variance (`env.executor.expected_grade`).
    expected_grades: bool = False
    # Where no kernel sandbox works (env.tasks.sandbox), run code tasks' generated programs anyway, with only
    # resource limits and an audit hook, instead of refusing; process-wide once an env is built with it.
    allow_unsandboxed_code: bool = False
    executor: ExecutorConfig = ExecutorConfig()
    reward: RewardConfig = RewardConfig()

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.access_mode not in ("binary", "fine"):
            raise ValueError(f"access_mode must be 'binary' or 'fine', got {self.access_mode!r}")
        prompts.check_conductor_prompt(self.conductor_prompt)
        if self.recursion_rounds < 0:
            raise ValueError(f"recursion_rounds must be >= 0, got {self.recursion_rounds}")
        if self.max_concurrency < 1 or self.grading_threads < 1:
            raise ValueError("max_concurrency and grading_threads must be >= 1")


@dataclasses.dataclass(frozen=True)
class Scored:
    """One scored completion: the reward, its components, and what produced them."""

    task_id: str
    round: int
    reward: float
    components: dict[str, float]
    workflow: Workflow | None
    parse_error: str | None
    execution: Execution | None
    grade: float | None
    # For a code task's passing answer (grade > 0): whether its program names what a forged verdict needs
    # (`env.tasks.code.tamper_suspect`); None otherwise. Its mean is the share of code passes flagged.
    code_tamper_suspect: bool | None = None

    def info(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "round": self.round,
            "workflow": self.workflow,
            "parse_error": self.parse_error,
            "execution": self.execution,
            "grade": self.grade,
            "reward_components": self.components,
        }


class TextSpace(gymnasium.spaces.Space[str]):
    """Any string (gymnasium's `Text` space restricts the character set; prompts hold arbitrary Unicode)."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return ""


class MessagesSpace(gymnasium.spaces.Space[list]):
    """A chat: a list of {"role", "content"} string dicts."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in x
        )

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        return []


def plain_text(messages: Sequence[Message], prefix: str) -> str:
    """The prompt without any chat template: role-labelled messages, then the assistant prefix."""
    turns = [f"{m['role']}:\n{m['content']}" for m in messages]
    return "\n\n".join([*turns, f"assistant:\n{prefix}"])


class ConductorEnv(gymnasium.Env):
    """One episode = one question; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, world: World, config: EnvConfig = EnvConfig(), cache: ResponseCache | None = None) -> None:
        self.world = world
        self.config = config
        self.cache = cache
        if config.allow_unsandboxed_code:
            sandbox.allow_unsandboxed_code()
        # None, or the kernel layer the world's code tasks run in: checked now rather than at the first program.
        self.sandbox_layer = (
            sandbox.check_available() if any(isinstance(task.gold, CodeTests) for task in world.tasks) else None
        )
        self.observation_space = gymnasium.spaces.Dict(
            {"task_id": TextSpace(), "messages": MessagesSpace(), "prefix": TextSpace(), "text": TextSpace()}
        )
        self.action_space = TextSpace()
        self._grading = concurrent.futures.ThreadPoolExecutor(config.grading_threads, thread_name_prefix="grading")
        self._runner = asyncio.Runner()
        self._order = list(range(len(world.tasks)))
        random.Random(config.seed).shuffle(self._order)
        self._next = 0
        self._task: Task | None = None
        self._round = 0
        self._previous: Scored | None = None
        self._episode_seed: int | None = None
        self._closed = False

    # ---- prompts ----

    def observation(
        self, task: Task, previous: Scored | None = None, prompt: prompts.ConductorPrompt | None = None
    ) -> dict[str, Any]:
        """The Conductor prompt for `task`: the first round, or the recursion round after `previous`; `prompt`
        replaces the config's `conductor_prompt`."""
        ids, config = offered_ids(task, len(self.world.pool)), self.config
        prompt = config.conductor_prompt if prompt is None else prompt
        if previous is None:
            messages = prompts.conductor_messages(task.question, ids, config.max_steps, config.access_mode, prompt)
        else:
            if previous.workflow is None or previous.execution is None:
                raise ValueError("a recursion round needs a previous round with a valid workflow")
            messages = prompts.recursion_messages(
                task.question,
                ids,
                config.max_steps,
                # the lists only: the earlier round's free reasoning would double the prompt for little
                render_workflow(Workflow(steps=previous.workflow.steps), config.access_mode),
                previous.execution.final_answer,
                config.access_mode,
                prompt,
            )
        return {
            "task_id": task.id,
            "messages": messages,
            "prefix": prompts.CONDUCTOR_PREFIX,
            "text": plain_text(messages, prompts.CONDUCTOR_PREFIX),
        }

    # ---- scoring ----

    async def score(
        self,
        task: Task,
        completion_text: str,
        *,
        sample_index: int = 0,
        previous: Scored | None = None,
        executor_seed: int | None = None,
    ) -> Scored:
        """Parse, execute, grade and reward one completion (a later round when `previous` is given);
        `executor_seed`, when given, replaces `ExecutorConfig.seed` (the gym API's per-episode seed)."""
        if previous is not None and previous.execution is None:
            raise ValueError("a recursion round needs a previous round with a valid workflow")
        round_index = 0 if previous is None else previous.round + 1
        previous_reward = None if previous is None else previous.reward
        config = self.config
        try:
            workflow = parse_workflow(
                prompts.CONDUCTOR_PREFIX + completion_text,
                offered_ids(task, len(self.world.pool)),
                config.max_steps,
                config.access_mode,
                allow_empty=previous is not None,
            )
        except WorkflowFormatError as error:
            total, components = reward(None, None, str(error), config.reward, previous_reward=previous_reward)
            return Scored(task.id, round_index, total, components, None, str(error), None, None)
        executor = config.executor
        if executor_seed is not None:
            executor = dataclasses.replace(executor, seed=executor_seed)
        execution = await execute_async(
            workflow,
            task,
            self.world.pool,
            self.cache,
            config=executor,
            sample_index=sample_index,
            previous=None if previous is None else previous.execution,
        )
        grade = expected_grade(execution, task, self.world.pool) if config.expected_grades else None
        if grade is None:
            grade = await asyncio.get_running_loop().run_in_executor(
                self._grading, task.grade, execution.final_answer
            )
        total, components = reward(execution, grade, None, config.reward, previous_reward=previous_reward)
        suspect = tamper_suspect(execution.final_answer) if task.grader is grade_code and grade > 0 else None
        return Scored(task.id, round_index, total, components, workflow, None, execution, grade, suspect)

    async def score_batch(
        self,
        tasks: Sequence[Task],
        completion_texts: Sequence[str],
        *,
        sample_indices: Sequence[int] | None = None,
        previous: Sequence[Scored | None] | None = None,
    ) -> list[Scored]:
        """Score completion i for tasks[i], at most `max_concurrency` at a time. `sample_indices` tells the
        samples of one prompt apart (seeds and cache keys); `previous` makes entry i a recursion round."""
        count = len(tasks)
        if len(completion_texts) != count:
            raise ValueError(f"{count} tasks but {len(completion_texts)} completions")
        for name, values in (("sample_indices", sample_indices), ("previous", previous)):
            if values is not None and len(values) != count:
                raise ValueError(f"{count} tasks but {len(values)} {name}")
        results: list[Scored | None] = [None] * count
        indices = iter(range(count))

        # A fixed number of lanes pulling the next index bounds concurrency without a semaphore, whose wake-up
        # cost grows with the number of waiters (thousands here).
        async def lane() -> None:
            for i in indices:
                results[i] = await self.score(
                    tasks[i],
                    completion_texts[i],
                    sample_index=0 if sample_indices is None else sample_indices[i],
                    previous=None if previous is None else previous[i],
                )

        await asyncio.gather(*(lane() for _ in range(min(self.config.max_concurrency, count))))
        return results  # type: ignore[return-value]

    def score_batch_sync(self, tasks: Sequence[Task], completion_texts: Sequence[str], **kwargs: Any) -> list[Scored]:
        """`score_batch` on the env's own event loop (reused across calls, so provider clients are too)."""
        return self._runner.run(self.score_batch(tasks, completion_texts, **kwargs))

    # ---- gymnasium ----

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Next task in a seeded shuffled order (`seed` reshuffles); `options={"task_id": ...}` picks one.

        Each episode's worker draws take a seed from the env's generator (mixed with `ExecutorConfig.seed` when set),
        so `reset(seed=...)` repeats the episodes after it, and successive episodes draw afresh.
        """
        super().reset(seed=seed)
        draw = int(self.np_random.integers(2**31))
        base = self.config.executor.seed
        self._episode_seed = draw if base is None else hash((base, draw)) & 0x7FFFFFFF
        if seed is not None:
            self._order = list(range(len(self.world.tasks)))
            random.Random(seed).shuffle(self._order)
            self._next = 0
        if options and "task_id" in options:
            matches = [task for task in self.world.tasks if task.id == options["task_id"]]
            if not matches:
                raise KeyError(f"no task {options['task_id']!r} in world {self.world.name!r}")
            self._task = matches[0]
        else:
            self._task = self.world.tasks[self._order[self._next % len(self._order)]]
            self._next += 1
        self._round = 0
        self._previous = None
        return self.observation(self._task), {"task_id": self._task.id, "round": 0}

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if not isinstance(action, str):
            raise TypeError(f"the action is the completion text, got {type(action).__name__}")
        scored = self._runner.run(
            self.score(self._task, action, previous=self._previous, executor_seed=self._episode_seed)
        )
        terminated = scored.round >= self.config.recursion_rounds or scored.parse_error is not None
        if terminated:  # the final observation repeats the prompt just answered; the next episode needs reset()
            observation = self.observation(self._task, self._previous)
            self._task, self._previous = None, None
        else:
            self._previous = scored
            observation = self.observation(self._task, scored)
        return observation, scored.reward, terminated, False, scored.info()

    def close(self) -> None:
        """Closes the workers' clients, the event loop and the grading pool; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._runner.run(aclose_workers(self.world.pool))
        self._runner.close()
        self._grading.shutdown()
