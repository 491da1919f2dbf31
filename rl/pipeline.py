"""The asynchronous pipeline of `LoopConfig.max_staleness` K >= 1: the next batches are sampled, executed by the
environment and scored while the learner updates (docs/design.md, "The asynchronous pipeline").

    producer thread   waits for free slots, samples a round of questions (one `generate` call, under the generator
                      lock), hands each question's group to the scoring loop
    scoring thread    an asyncio loop; each group is scored as a task of its own (`Environment.score_async`, else
                      `Environment.score` on a thread of its own), so a group's workflows run to their end whatever the
                      learner does, and a group is ready as soon as its own workflows are
    learner           (the caller, `rl.loop.TrainingLoop`) takes ready groups in the order they become ready, trains,
                      syncs the weights under the generator lock (between two `generate` calls, never during one;
                      environment calls in flight are not touched) and frees the groups' slots

Slots bound how far sampling runs ahead: (K + 1) x the groups a batch takes from this process. A group holds its slot
from its sampling until it is trained or dropped, so a round sampled under policy version v is trained, in the order
of sampling, by the update from version v + K at the latest. Groups become ready in the order their scorings finish,
though, so a slow group can be overtaken; one sampled more than K versions before the learner's weights is dropped
(its slot freed, its rows counted in `async/rows_dropped`). Nothing here is a JAX collective: in a multi-process
run every process runs its own pipeline over its share of each round's questions, and the learner gathers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Group:
    """One question's completions, scored, with the policy version of the weights that sampled them and the seconds
    its scoring took."""

    question: int
    completions: list[Any]
    rollouts: list[Any]
    policy_version: int
    score_seconds: float


@dataclasses.dataclass(frozen=True)
class Round:
    """What the producer samples next: a round of questions (this process's share), their rows' first sample id
    and the seed their row seeds start from (`SamplingParams.seed`: row r draws from seed + r)."""

    questions: list[int]
    sample_ids: list[int]
    seed: int


class Pipeline:
    """Samples and scores groups ahead of the learner; see the module docstring.

    `next_round()` (called on the producer thread, one round at a time) says what to sample; `version()` is the
    policy version of the generator's weights, read under `generator_lock`, which the learner holds while it syncs.
    `token_masks(questions)` gives the masks a round's prompts are sampled under (`LoopConfig.mask_tokens`).
    """

    def __init__(
        self,
        *,
        environment: Any,
        sampler: Any,
        sampling_params: Any,
        group_size: int,
        groups_per_round: int,
        max_staleness: int,
        next_round: Callable[[], Round],
        version: Callable[[], int],
        generator_lock: threading.Lock,
        token_masks: Callable[[Sequence[int]], Sequence[Any] | None] = lambda questions: None,
    ):
        if max_staleness < 1:
            raise ValueError(f"the pipeline runs with max_staleness >= 1, got {max_staleness}")
        self.environment = environment
        self.sampler = sampler
        self.sampling_params = sampling_params
        self.group_size = group_size
        self.groups_per_round = groups_per_round
        self.capacity = (max_staleness + 1) * groups_per_round
        self._next_round = next_round
        self._version = version
        self.generator_lock = generator_lock
        self.token_masks = token_masks
        self._ready: queue.Queue[Group | BaseException] = queue.Queue()
        self._slots = threading.Condition()
        self._held = 0  # slots taken by groups sampled and not yet trained or dropped
        self._stopping = False
        self._generate_seconds = 0.0
        self._loop = asyncio.new_event_loop()
        self._scoring = threading.Thread(target=self._loop.run_forever, name="pipeline-scoring", daemon=True)
        self._producer = threading.Thread(target=self._produce, name="pipeline-producer", daemon=True)
        # Environments without `score_async` score each group on a thread of their own.
        self._score_threads = concurrent.futures.ThreadPoolExecutor(self.capacity, thread_name_prefix="pipeline-score")

    def start(self) -> "Pipeline":
        self._scoring.start()
        self._producer.start()
        return self

    @property
    def generate_seconds(self) -> float:
        """Seconds spent in `generate` calls so far."""
        return self._generate_seconds

    def next_group(self) -> Group:
        """The next group to become ready (blocks); re-raises what failed in the producer or in scoring."""
        item = self._ready.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the pipeline's producer or scoring failed") from item
        return item

    def release(self, groups: int) -> None:
        """Frees the slots of `groups` groups trained or dropped, so the producer may sample more."""
        with self._slots:
            if groups > self._held:
                raise ValueError(f"releasing {groups} slots but only {self._held} are held")
            self._held -= groups
            self._slots.notify_all()

    def close(self) -> None:
        """Stops sampling, cancels the scoring of groups nobody will train, and joins the threads."""
        with self._slots:
            self._stopping = True
            self._slots.notify_all()
        self._producer.join()
        asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._scoring.join()
        self._loop.close()
        self._score_threads.shutdown(wait=True, cancel_futures=True)

    # -- the producer thread -------------------------------------------------------------------------------------------

    def _produce(self) -> None:
        try:
            while True:
                with self._slots:
                    while not self._stopping and self._held + self.groups_per_round > self.capacity:
                        self._slots.wait()
                    if self._stopping:
                        return
                    self._held += self.groups_per_round
                self._sample(self._next_round())
        except BaseException as error:  # handed to the learner, which raises it
            self._ready.put(error)

    def _sample(self, round_: Round) -> None:
        prompts = [self.environment.prompt_ids(q) for q in round_.questions]
        params = dataclasses.replace(self.sampling_params, seed=round_.seed)
        with self.generator_lock:
            version = self._version()
            started = time.perf_counter()
            groups = self.sampler.generate(prompts, params, self.group_size,
                                           token_masks=self.token_masks(round_.questions))
            self._generate_seconds += time.perf_counter() - started
        for index, (question, completions) in enumerate(zip(round_.questions, groups, strict=True)):
            ids = round_.sample_ids[index * self.group_size : (index + 1) * self.group_size]
            asyncio.run_coroutine_threadsafe(self._score(question, completions, ids, version), self._loop)

    # -- the scoring loop -------------------------------------------------------------------------------------------

    async def _score(self, question: int, completions: list[Any], sample_ids: Sequence[int], version: int) -> None:
        questions = [question] * len(completions)
        completion_ids = [c.completion_ids for c in completions]
        started = time.perf_counter()
        try:
            if hasattr(self.environment, "score_async"):
                rollouts = await self.environment.score_async(questions, completion_ids, None, sample_ids)
            else:
                rollouts = await asyncio.get_running_loop().run_in_executor(
                    self._score_threads, self.environment.score, questions, completion_ids, None, sample_ids
                )
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._ready.put(error)
            return
        self._ready.put(Group(question, list(completions), list(rollouts), version, time.perf_counter() - started))


async def _cancel_other_tasks() -> None:
    """Cancels every other task of the running loop and waits until each has ended, so none is left pending."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def round_seed(seed: int, position: int) -> int:
    """The row seeds of the round that starts at data position `position` start here: a function of the run's seed
    and the position alone, so a resumed pipeline draws what it would have."""
    return int(np.random.default_rng([seed, position]).integers(0, np.iinfo(np.int32).max // 2))
