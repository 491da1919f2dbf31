"""The GRPO training loop: one iteration of docs/design.md section 2, repeated, resumable.

    questions -> prompts -> generator samples G completions each -> the world scores them -> advantages per group
    -> Trajectories from the generator's own token ids -> Learner.update -> weight sync (policy version + 1)
    -> metrics -> checkpoint

`rl` imports only `models`, so the loop talks to the world and to the generator through the small protocols below;
`launch/` binds them to `env` and `rollout`. A killed run resumes from its last checkpoint with the same data
position, RNG key and policy version, and the metrics it had logged past that checkpoint are dropped (so nothing is
duplicated when those iterations run again).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import numpy as np

from rl import advantages as advantage_estimators
from rl import trajectories
from rl.checkpoint import Checkpointer
from rl.learner import Learner
from rl.metrics import MetricsWriter

log = logging.getLogger(__name__)

# Per-rollout metrics the one-line progress report shows, when the world reports them.
HEADLINE_METRICS = ("correct", "valid_format", "oracle_route", "steps", "worker_calls", "tokens", "cost_usd")


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One scored completion, as the world reports it.

    `metrics` are per-rollout numbers averaged into `rollout/<name>` scalars (the world decides which: correct,
    valid_format, steps, worker_calls, tokens, cost_usd, ...). `workers` are the pool ids the workflow used.
    `context` is what the world needs to run a recursion round on this rollout; `followup_prompt_ids` is that round's
    Conductor prompt (None when the world has no further round for it).
    """

    reward: float
    metrics: Mapping[str, float]
    workers: tuple[int, ...] = ()
    context: Any = None
    followup_prompt_ids: Sequence[int] | None = None


class World(Protocol):
    """The environment as the loop sees it: questions by index, prompts as token ids, scored completions.
    `question_strata` (a label per question, e.g. its domain) is needed only by `LoopConfig.stratify_questions`."""

    num_questions: int
    question_strata: Sequence[str] | None

    def prompt_ids(self, question: int) -> list[int]: ...

    def score(
        self,
        questions: Sequence[int],
        completions: Sequence[Sequence[int]],
        contexts: Sequence[Any] | None,
        sample_ids: Sequence[int],
    ) -> list[Rollout]:
        """Scores completion i for question i. `sample_ids` are unique across the run and reproducible on resume
        (worker seeds and cache keys come from them, so a question asked again draws fresh worker samples)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class Sampler(Protocol):
    """A `rollout.types.Generator`: completions carry completion_ids, logprobs, finish_reason, policy_version."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: Any, n: int) -> list[list[Any]]: ...


WeightSync = Callable[[Any, int], None]  # (live nnx model, new policy version) -> pushes weights to generators


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What one run of the loop does.

    questions_per_step x group_size completions are sampled per iteration. `estimator` names an entry of
    `rl.advantages.ESTIMATORS`. With `dynamic_sampling`, groups whose rewards all agree carry no learning signal and
    are masked out of the loss, so they leave its denominators too (the learner does not run rows without loss
    tokens, `LearnerConfig.skip_zero_gradient_rows`). With `recursion`, each completion
    the world gives a follow-up prompt gets a second Conductor round on its first round's result; the world's
    second-round reward is the episode's (the world blends in the discounted first-round reward, so the reward is
    defined once, in `env.rewards`), and both rounds' completions train on it. With `stratify_questions`, each
    iteration's questions take the world's `question_strata` labels (its task domains) in turn.
    """

    iterations: int
    questions_per_step: int = 4
    group_size: int = 8
    estimator: str = "grpo"
    estimator_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dynamic_sampling: bool = False
    recursion: bool = False
    stratify_questions: bool = False
    checkpoint_every: int = 10
    samples_to_log: int = 4
    seed: int = 0
    length_buckets: tuple[int, ...] = trajectories.DEFAULT_LENGTH_BUCKETS

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"LoopConfig.iterations must be >= 1, got {self.iterations}")
        if self.questions_per_step < 1 or self.group_size < 2:
            raise ValueError(
                f"need questions_per_step >= 1 and group_size >= 2 (a group is compared with itself), got "
                f"{self.questions_per_step} and {self.group_size}"
            )
        if self.estimator not in advantage_estimators.ESTIMATORS:
            raise ValueError(
                f"unknown estimator {self.estimator!r}; choose one of {sorted(advantage_estimators.ESTIMATORS)}"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"LoopConfig.checkpoint_every must be >= 0 (0: only at the end), got {self.checkpoint_every}")


def question_order(
    num_questions: int, seed: int, position: int, count: int, strata: Sequence[str] | None = None
) -> list[int]:
    """Questions `position .. position + count` of an endless stream of per-epoch shuffles (a pure function, so the
    data position alone restores the stream).

    With `strata` (a label per question, e.g. its domain), the stream takes the labels in turn, each label's
    questions in their own per-epoch shuffle, so every run of as many questions as there are labels holds one of
    each: no iteration's batch leaves a domain out or doubles one up.
    """
    if num_questions < 1:
        raise ValueError("the world has no questions")
    if strata is None:
        pools = [list(range(num_questions))]
    else:
        if len(strata) != num_questions:
            raise ValueError(f"{len(strata)} strata labels for {num_questions} questions")
        labels = sorted(set(strata))
        pools = [[q for q in range(num_questions) if strata[q] == label] for label in labels]
    order = []
    for index in range(position, position + count):
        pool_index, turn = index % len(pools), index // len(pools)
        pool = pools[pool_index]
        epoch, offset = divmod(turn, len(pool))
        # The unstratified stream keeps its original seeding, so earlier runs' question orders stay reproducible.
        rng_seed = [seed, epoch] if strata is None else [seed, epoch, pool_index]
        order.append(pool[int(np.random.default_rng(rng_seed).permutation(len(pool))[offset])])
    return order


@dataclasses.dataclass
class _Sampled:
    """The rows of one round: who asked, what was sampled, how it scored."""

    questions: list[int]
    group_ids: list[int]
    completions: list[Any]
    rollouts: list[Rollout]


class TrainingLoop:
    """Runs `LoopConfig.iterations` GRPO iterations; `run()` resumes from the checkpointer's latest step if any."""

    def __init__(
        self,
        config: LoopConfig,
        *,
        learner: Learner,
        sampler: Sampler,
        sampling_params: Any,
        weight_sync: WeightSync,
        world: World,
        pad_id: int,
        writer: MetricsWriter | None = None,
        checkpointer: Checkpointer | None = None,
    ):
        self.config = config
        self.learner = learner
        self.sampler = sampler
        self.sampling_params = sampling_params
        self.weight_sync = weight_sync
        self.world = world
        self.pad_id = pad_id
        self.writer = writer
        self.checkpointer = checkpointer
        self.iteration = 0
        self.data_position = 0
        self.policy_version = 0
        self.rng_key = jax.random.key(config.seed)
        self._next_sample_id = 0
        self._strata = getattr(world, "question_strata", None) if config.stratify_questions else None
        if config.stratify_questions and self._strata is None:
            raise ValueError("stratify_questions needs a world with question_strata (a label per question)")

    # -- state --------------------------------------------------------------------------------------------------

    def loop_state(self) -> dict[str, int]:
        return {
            "iteration": self.iteration,
            "data_position": self.data_position,
            "policy_version": self.policy_version,
            "next_sample_id": self._next_sample_id,
        }

    def restore(self) -> bool:
        """Loads the latest checkpoint, if there is one, and pushes its weights to the generators."""
        restored = self.checkpointer.restore(self.learner) if self.checkpointer else None
        if restored is None:
            return False
        step, self.rng_key, state = restored
        self.iteration = int(state["iteration"])
        self.data_position = int(state["data_position"])
        self.policy_version = int(state["policy_version"])
        self._next_sample_id = int(state["next_sample_id"])
        if self.writer is not None:
            self.writer.discard_after(step)
        self.weight_sync(self.learner.model, self.policy_version)
        log.info("resumed from checkpoint %d (data position %d, policy version %d)", step,
                 self.data_position, self.policy_version)
        return True

    def save(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(self.iteration, self.learner, self.rng_key, self.loop_state())

    # -- one iteration ----------------------------------------------------------------------------------------------

    def _sample(self, prompts: list[Sequence[int]], questions: list[int], first_group: int, n: int,
                contexts: list[Any] | None, times: dict[str, float]) -> _Sampled:
        self.rng_key, key = jax.random.split(self.rng_key)
        seed = int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))
        started = time.perf_counter()
        groups = self.sampler.generate(prompts, dataclasses.replace(self.sampling_params, seed=seed), n)
        scored = time.perf_counter()
        completions = [completion for group in groups for completion in group]
        row_questions = [q for q in questions for _ in range(n)]
        group_ids = [first_group + i for i in range(len(questions)) for _ in range(n)]
        row_contexts = None if contexts is None else [c for c in contexts for _ in range(n)]
        sample_ids = [self._next_sample_id + i for i in range(len(completions))]
        self._next_sample_id += len(completions)
        rollouts = self.world.score(row_questions, [c.completion_ids for c in completions], row_contexts, sample_ids)
        times["generate"] = times.get("generate", 0.0) + scored - started
        times["score"] = times.get("score", 0.0) + time.perf_counter() - scored
        return _Sampled(row_questions, group_ids, completions, rollouts)

    def step(self) -> dict[str, float]:
        """One iteration; returns the scalars it logged."""
        config = self.config
        times: dict[str, float] = {}
        started = time.perf_counter()

        questions = question_order(self.world.num_questions, config.seed, self.data_position,
                                   config.questions_per_step, self._strata)
        prompts = [self.world.prompt_ids(q) for q in questions]
        rounds = [self._sample(prompts, questions, 0, config.group_size, None, times)]
        rewards = [r.reward for r in rounds[0].rollouts]
        if config.recursion:
            rewards = self._recursion_round(rounds, rewards, times)

        rows = [(s, i) for s in rounds for i in range(len(s.completions))]
        completions = [s.completions[i] for s, i in rows]
        rewards_array = np.asarray(rewards, dtype=np.float32)
        group_ids = np.asarray([s.group_ids[i] for s, i in rows], dtype=np.int32)
        lengths = np.asarray([len(c.completion_ids) for c in completions], dtype=np.float32)
        advantages = advantage_estimators.compute(
            config.estimator, rewards_array, group_ids, lengths=lengths, **dict(config.estimator_options)
        )
        keep, dropped_groups = np.ones(len(rows), dtype=bool), 0
        if config.dynamic_sampling:
            keep, dropped_groups = advantage_estimators.zero_variance_groups(rewards_array, group_ids)

        scalars: dict[str, float] = {}
        times["learn"] = times["sync"] = 0.0
        if keep.any():
            learn_started = time.perf_counter()
            batch = trajectories.build(
                [c.prompt_ids for c in completions],
                [c.completion_ids for c in completions],
                [c.logprobs for c in completions],
                advantages,
                group_ids,
                pad_id=self.pad_id,
                length_buckets=config.length_buckets,
            )
            # Dropped groups leave the loss (rows without loss tokens count in no denominator); shapes stay put.
            batch = batch.replace(loss_mask=batch.loss_mask & keep[:, None])
            scalars.update({f"learner/{k}": v for k, v in self.learner.update(batch).items()})
            sync_started = time.perf_counter()
            times["learn"] = sync_started - learn_started
            self.policy_version += 1
            self.weight_sync(self.learner.model, self.policy_version)
            times["sync"] = time.perf_counter() - sync_started
        else:
            log.warning("iteration %d: every group had zero reward variance; no update", self.iteration + 1)

        self.data_position += config.questions_per_step
        self.iteration += 1
        times["iteration"] = time.perf_counter() - started
        scalars.update(self._rollout_scalars(rounds, rewards_array, advantages, dropped_groups, times))
        self._log(rounds, rewards_array, scalars)
        return scalars

    def _recursion_round(self, rounds: list[_Sampled], rewards: list[float], times: dict[str, float]) -> list[float]:
        """Samples one second-round completion per first-round completion that the world gave a follow-up prompt."""
        first = rounds[0]
        follow = [i for i, r in enumerate(first.rollouts) if r.followup_prompt_ids is not None]
        if not follow:
            return rewards
        offset = max(first.group_ids) + 1
        second = self._sample(
            [first.rollouts[i].followup_prompt_ids for i in follow],
            [first.questions[i] for i in follow],
            offset,
            1,
            [first.rollouts[i].context for i in follow],
            times,
        )
        # Each second round is a group of one, so it is grouped with the other second rounds of its question.
        second.group_ids = [offset + first.group_ids[i] for i in follow]
        rounds.append(second)
        episode = list(rewards)
        for row, second_rollout in zip(follow, second.rollouts):
            episode[row] = second_rollout.reward
        return episode + [r.reward for r in second.rollouts]

    # -- reporting ----------------------------------------------------------------------------------------------

    def _rollout_scalars(self, rounds, rewards, advantages, dropped_groups, times) -> dict[str, float]:
        first = rounds[0]
        scalars = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()),
            "reward/first_round_mean": float(np.mean([r.reward for r in first.rollouts])),
            "advantage/abs_mean": float(np.abs(advantages).mean()),
            "completion/tokens": float(np.mean([len(c.completion_ids) for c in first.completions])),
            "completion/truncated": float(np.mean([c.finish_reason == "length" for c in first.completions])),
            "dynamic_sampling/dropped_groups": float(dropped_groups),
            "policy_version": float(self.policy_version),
            "data_position": float(self.data_position),
        }
        names = sorted({name for r in first.rollouts for name in r.metrics})
        for name in names:
            values = [r.metrics[name] for r in first.rollouts if name in r.metrics]
            scalars[f"rollout/{name}"] = float(np.mean(values))
        scalars.update({f"time/{phase}": seconds for phase, seconds in times.items()})
        return scalars

    def _log(self, rounds: list[_Sampled], rewards: np.ndarray, scalars: dict[str, float]) -> None:
        elapsed = scalars["time/iteration"]
        remaining = (self.config.iterations - self.iteration) * elapsed
        headline = " ".join(
            f"{name} {scalars[f'rollout/{name}']:.3g}" for name in HEADLINE_METRICS if f"rollout/{name}" in scalars
        )
        log.info(
            "iter %d/%d reward %.3f %s | generate %.1fs score %.1fs learn %.1fs sync %.2fs | eta %.0fs",
            self.iteration, self.config.iterations, scalars["reward/mean"], headline, scalars["time/generate"],
            scalars["time/score"], scalars["time/learn"], scalars["time/sync"], remaining,
        )
        if self.writer is None:
            return
        first = rounds[0]
        samples = "\n\n".join(
            f"**reward {first.rollouts[i].reward:.2f}**\n\n```\n{self.world.decode(first.completions[i].completion_ids)}\n```"
            for i in range(min(self.config.samples_to_log, len(first.completions)))
        )
        workers = [w for r in first.rollouts for w in r.workers]
        histograms = {"rewards": rewards}
        if workers:
            histograms["workers_chosen"] = np.asarray(workers)
        self.writer.log(self.iteration, scalars, histograms=histograms, texts={"samples": samples})
        self.writer.log_rollouts(self.iteration, [
            {
                "round": round_index,
                "question": sampled.questions[i],
                "completion_ids": list(sampled.completions[i].completion_ids),
                "reward": float(sampled.rollouts[i].reward),
                "workers": list(sampled.rollouts[i].workers),
            }
            for round_index, sampled in enumerate(rounds)
            for i in range(len(sampled.completions))
        ])

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> list[dict[str, float]]:
        """Resumes if a checkpoint exists, then runs the remaining iterations; returns each iteration's scalars."""
        if not self.restore():
            self.weight_sync(self.learner.model, self.policy_version)
        history = []
        while self.iteration < self.config.iterations:
            history.append(self.step())
            every = self.config.checkpoint_every
            if every and self.iteration % every == 0:
                self.save()
        if self.checkpointer is not None and self.checkpointer.latest_step() != self.iteration:
            self.save()
        if self.writer is not None:
            self.writer.flush()
        return history
