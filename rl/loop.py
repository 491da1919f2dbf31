"""The GRPO training loop: one iteration of docs/design.md section 2, repeated, resumable.

    questions -> prompts -> generator samples G completions each -> the environment scores them -> advantages per group
    -> Trajectories from the generator's own token ids -> Learner.update -> weight sync (policy version + 1)
    -> metrics -> checkpoint

`rl` imports only `models`, so the loop talks to the environment and to the generator through the small protocols below;
`launch/` binds them to `env` and `rollout`. A killed run resumes from its last checkpoint with the same data
position, RNG key and policy version, and the metrics it had logged past that checkpoint are dropped (so nothing is
duplicated when those iterations run again).

Several processes (one per host, `jax.distributed`; `conductor/distributed.py`) split the sampling by question group:
- every process computes the iteration's questions alike (`question_order`); with P processes, process p takes
  questions [p*Q/P, (p+1)*Q/P) of the Q (`questions_per_iteration`, which P must divide), and samples and scores their
  groups with its own generator and environment. A group, and every recursion round of its episodes, stays on one
  process.
- row r of a round (rows numbered across the processes, process by process, as one process would number them)
  draws from that round's seed + r (`SamplingParams.seed`) and scores with sample id r past the round's first, so a
  row's sample and scoring draws do not depend on how many processes share the iteration.
- the processes then gather every row (`_gathered`, `jax.experimental.multihost_utils.process_allgather`), so each
  holds the iteration's whole batch, in the order one process would have it. Advantages, the learner's batch, its
  update (`rl.learner`: the same programs on every process, over a mesh of all their devices), the metrics and the
  checkpoint's loop state are then those of a one-process run on the same questions and samples.
Process 0 alone logs the progress line and writes metrics, TensorBoard events and rollouts.jsonl (launch gives the
others no writer); every process saves checkpoints (orbax's multi-host save) and syncs its own generator.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from typing import Any, Callable, Hashable, Literal, Mapping, Protocol, Sequence, get_args

import jax
import numpy as np
from jax.experimental import multihost_utils

from rl import advantages as advantage_estimators
from rl import compiles, trajectories
from rl.checkpoint import Checkpointer
from rl.learner import Learner
from rl.metrics import MetricsWriter
from rl.pipeline import Group, Pipeline, Round, round_seed

log = logging.getLogger(__name__)

# The row label (`rl.trajectories.Trajectories.row_labels`) the loop fills from the environment's question labels:
# each row's question's label, numbered in sorted order.
QUESTION_LABEL = "question"

# What becomes of a group whose rewards all agree (`LoopConfig`): it trains ("off"), it is masked out of the loss
# ("mask"), or it is masked and more questions are sampled to take its place ("backfill").
DynamicSampling = Literal["off", "mask", "backfill"]


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One scored completion, as the environment reports it.

    `metrics` are per-rollout numbers averaged into `rollout/<name>` scalars (the environment decides which).
    `labels` (hashable, by name) and `marked_tokens` (completion token indices, by name) are what advantage
    transforms read (`rl.advantages.AdvantageBatch`); a marked token's first index is also the token position an
    auxiliary loss term of that name reads (`rl.auxiliary`), and a label an int, the row label of that name. `record`
    adds fields to the rollout's line of rollouts.jsonl, `histograms` values to the iteration's histograms of that
    name (first round). `context` is what the environment needs to run a recursion round on this rollout;
    `followup_prompt_ids` is that round's prompt (None when the environment has no further round for it).
    """

    reward: float
    metrics: Mapping[str, float]
    labels: Mapping[str, Hashable] = dataclasses.field(default_factory=dict)
    marked_tokens: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    histograms: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    context: Any = None
    followup_prompt_ids: Sequence[int] | None = None


class Environment(Protocol):
    """The environment as the loop sees it: questions by index, prompts as token ids, scored completions.
    `question_labels` (a label per question, e.g. its task) is needed only by `LoopConfig.stratify_questions`, by
    estimators that take labels (grpo's `std_scaling="label"`), by transforms that read them and by auxiliary terms
    that read the row label `QUESTION_LABEL`. The asynchronous pipeline (`LoopConfig.max_staleness`) scores each
    group on its event loop with `score_async(questions, completions, contexts, sample_ids)`, a coroutine taking and
    returning what `score` does, where the environment has one (else `score`, from several threads at once).
    `LoopConfig.mask_tokens` samples each question under `token_mask(question)` (a `rollout.types.TokenMask` or
    None), which only then is needed."""

    num_questions: int
    question_labels: Sequence[str] | None

    def prompt_ids(self, question: int) -> list[int]: ...

    def score(
        self,
        questions: Sequence[int],
        completions: Sequence[Sequence[int]],
        contexts: Sequence[Any] | None,
        sample_ids: Sequence[int],
    ) -> list[Rollout]:
        """Scores completion i for question i. `sample_ids` are unique across the run and reproducible on resume
        (the environment's seeds and cache keys come from them, so a question asked again draws afresh)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class Sampler(Protocol):
    """A `rollout.types.Generator`: completions carry completion_ids, logprobs, finish_reason, policy_version, and,
    sampled under `token_masks`, the constraint of each token."""

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: Any, n: int, token_masks: Sequence[Any] | None = None
    ) -> list[list[Any]]: ...


WeightSync = Callable[[Any, int], None]  # (live nnx model, new policy version) -> pushes weights to generators


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What one run of the loop does.

    questions_per_iteration x group_size completions are sampled per iteration. `estimator` names an entry of
    `rl.advantages.ESTIMATORS`, and `estimator_options` are its options (`rl.advantages.check_options`). With
    `dynamic_sampling` "mask", groups whose rewards all agree carry no learning signal and are masked out of the loss,
    so they leave its denominators too (the learner does not run rows without loss tokens,
    `LearnerConfig.skip_zero_gradient_rows`). With "backfill" they are masked too, and the iteration samples the next
    `questions_per_iteration` questions of the stream again, up to `max_sampling_rounds` sampling rounds in all, until
    that many groups' rewards differ; the batch takes those groups in the order they were sampled (later ones are
    dropped), and when the rounds run out, the earliest agreeing groups, masked, fill it up to `questions_per_iteration`
    groups (`backfilled_groups`), so the batch's row count never changes. With `recursion_rounds` N > 0, each completion
    the environment gives a follow-up prompt gets another Conductor round on its result, up to N more rounds: an episode
    is a first-round completion and the rounds that follow it. The environment's reward of an episode's last round is
    the episode's (the environment blends in the earlier rounds' rewards, discounted, so the reward is defined once, in
    `env.rewards`, and the env and the evaluation credit an episode the same), and every round of the episode trains on
    it. A round is grouped with the same round of its question's other episodes; one alone in its group takes its
    episode's first-round advantage (`rl.advantages.credit_lone_later_rounds`). With `stratify_questions`, each
    iteration's questions take the environment's `question_labels` in turn. Where the environment has those labels, each
    completion's (its question's) reaches the estimator as its label. `advantage_transforms` then run in order
    (`rl.advantages.apply_transforms`), on every row with the rollouts' labels and marked tokens. When the learner's
    loss has auxiliary terms, each row goes to it with the token positions and row labels they read: a position is the
    first of the rollout's marked tokens of that name (-1 without one), the row label `QUESTION_LABEL` its question's
    label (numbered in sorted order), any other the rollout's label of that name (-1 without one). `headline_metrics`
    are the per-rollout metrics the one-line progress report shows, when the environment reports them.

    `max_staleness` K: 0 runs sample -> execute -> score -> learn -> sync strictly in turn. K >= 1 runs the
    asynchronous pipeline (`rl.pipeline`): the next batches are sampled, executed and scored while the learner updates;
    a batch takes groups in the order their workflows finish; a group sampled more than K policy versions before the
    weights it would train is dropped, not trained (`async/rows_dropped`); the learner must take the sampler as the
    behaviour policy (`TrainingLoop`). It needs one round per episode (`recursion_rounds` 0). With "backfill" a batch
    takes the groups whose rewards differ as they become ready, keeping the agreeing ones aside, until it holds
    `questions_per_iteration` of them or has taken `max_sampling_rounds` x that many groups; then the agreeing ones
    kept aside, earliest ready first, and past them any group, fill it. Each process fills its own share.

    `mask_tokens`: every completion is sampled under its question's `Environment.token_mask` (invalid-action masking),
    and the learner computes each token's log-prob under the constraint it was sampled with, so the sampler and the
    learner score one policy, the masked one (`rl.trajectories.Trajectories.constraint_ids`).
    """

    iterations: int
    questions_per_iteration: int = 4
    group_size: int = 8
    estimator: str = "grpo"
    estimator_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dynamic_sampling: DynamicSampling = "off"
    max_sampling_rounds: int = 4
    advantage_transforms: tuple[advantage_estimators.TransformConfig, ...] = ()
    recursion_rounds: int = 0
    stratify_questions: bool = False
    checkpoint_every: int = 10
    samples_to_log: int = 4
    seed: int = 0
    length_buckets: tuple[int, ...] = trajectories.DEFAULT_LENGTH_BUCKETS
    headline_metrics: tuple[str, ...] = ()
    max_staleness: int = 0
    mask_tokens: bool = False

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"LoopConfig.iterations must be >= 1, got {self.iterations}")
        if self.questions_per_iteration < 1 or self.group_size < 2:
            raise ValueError(
                f"need questions_per_iteration >= 1 and group_size >= 2 (a group is compared with itself), got "
                f"{self.questions_per_iteration} and {self.group_size}"
            )
        if self.estimator not in advantage_estimators.ESTIMATORS:
            raise ValueError(
                f"unknown estimator {self.estimator!r}; choose one of {sorted(advantage_estimators.ESTIMATORS)}"
            )
        advantage_estimators.check_options(self.estimator, self.estimator_options)
        if self.dynamic_sampling not in get_args(DynamicSampling):
            raise ValueError(
                f"LoopConfig.dynamic_sampling must be one of {get_args(DynamicSampling)}, got {self.dynamic_sampling!r}"
            )
        if self.max_sampling_rounds < 1:
            raise ValueError(f"LoopConfig.max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}")
        if self.checkpoint_every < 0:
            raise ValueError(f"LoopConfig.checkpoint_every must be >= 0 (0: only at the end), got {self.checkpoint_every}")
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"LoopConfig.max_staleness must be an int >= 0, got {self.max_staleness!r}")
        if self.max_staleness and self.recursion_rounds:
            raise ValueError(
                "max_staleness >= 1 (the asynchronous pipeline) samples one round per episode: it does not take "
                "recursion_rounds"
            )
        if self.recursion_rounds < 0:
            raise ValueError(f"LoopConfig.recursion_rounds must be >= 0, got {self.recursion_rounds}")
        if not all(isinstance(t, advantage_estimators.TransformConfig) for t in self.advantage_transforms):
            raise ValueError(
                f"LoopConfig.advantage_transforms must be TransformConfigs, got {self.advantage_transforms!r}"
            )

    @property
    def max_rows(self) -> int:
        """The most rows an iteration's batch holds: every episode runs every round."""
        return self.questions_per_iteration * self.group_size * (1 + self.recursion_rounds)


def question_order(
    num_questions: int, seed: int, position: int, count: int, labels: Sequence[str] | None = None
) -> list[int]:
    """Questions `position .. position + count` of an endless stream of per-epoch shuffles (a pure function, so the
    data position alone restores the stream).

    With `labels` (one per question, e.g. its task), the stream takes the labels in turn, each label's questions in
    their own per-epoch shuffle, so every run of as many questions as there are labels holds one of each: no
    iteration's batch leaves a label out or doubles one up.
    """
    if num_questions < 1:
        raise ValueError("the environment has no questions")
    if labels is None:
        pools = [list(range(num_questions))]
    else:
        if len(labels) != num_questions:
            raise ValueError(f"{len(labels)} question labels for {num_questions} questions")
        pools = [[q for q in range(num_questions) if labels[q] == label] for label in sorted(set(labels))]
    order = []
    for index in range(position, position + count):
        pool_index, turn = index % len(pools), index // len(pools)
        pool = pools[pool_index]
        epoch, offset = divmod(turn, len(pool))
        # The unstratified stream keeps its original seeding, so earlier runs' question orders stay reproducible.
        rng_seed = [seed, epoch] if labels is None else [seed, epoch, pool_index]
        order.append(pool[int(np.random.default_rng(rng_seed).permutation(len(pool))[offset])])
    return order


def backfilled_groups(rewards_differ: Sequence[Sequence[bool]], groups: int) -> list[tuple[int, int]]:
    """The groups of a backfilled batch (`LoopConfig.dynamic_sampling`), as (sampling round, group of that round):
    the first `groups` groups whose rewards differ, in sampling order, then, while the batch is short, the earliest
    groups whose rewards agree. `rewards_differ[r][g]`: whether group g of sampling round r has rewards that differ."""
    differ = [(r, g) for r, flags in enumerate(rewards_differ) for g, flag in enumerate(flags) if flag]
    agree = [(r, g) for r, flags in enumerate(rewards_differ) for g, flag in enumerate(flags) if not flag]
    if len(differ) + len(agree) < groups:
        raise ValueError(f"{len(differ) + len(agree)} groups sampled cannot fill a batch of {groups}")
    return (differ + agree)[:groups]


@dataclasses.dataclass
class _Sampled:
    """The rows of one round: who asked, what was sampled, how it scored, and each row's episode (the index of the
    first-round row it follows)."""

    questions: list[int]
    group_ids: list[int]
    completions: list[Any]
    rollouts: list[Rollout]
    episodes: list[int] = dataclasses.field(default_factory=list)


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
        environment: Environment,
        pad_id: int,
        writer: MetricsWriter | None = None,
        checkpointer: Checkpointer | None = None,
        after_checkpoint: Callable[[int], None] | None = None,
    ):
        """`after_checkpoint(iteration)` runs after each checkpoint the run saves (a validation pass, say), while
        no sample is drawn and the generators hold that iteration's weights."""
        self.config = config
        self.learner = learner
        self.sampler = sampler
        self.sampling_params = sampling_params
        self.weight_sync = weight_sync
        self.environment = environment
        self.pad_id = pad_id
        self.writer = writer
        self.checkpointer = checkpointer
        self.after_checkpoint = after_checkpoint
        self.iteration = 0
        self._saved_iteration: int | None = None  # the last iteration save() ran at, or a resumed run's checkpoint
        self.data_position = 0
        self.policy_version = 0
        self.rng_key = jax.random.key(config.seed)
        self._next_sample_id = 0
        # Held while the generator samples or takes new weights: a sync waits for the `generate` call in flight.
        self._generator_lock = threading.Lock()
        self._generator_version = 0
        self._stream_lock = threading.Lock()  # data_position and _next_sample_id, which the pipeline advances
        self._compiles = compiles.totals()  # at the end of the last iteration: each logs what it compiled since
        if config.questions_per_iteration % jax.process_count():
            raise ValueError(
                f"questions_per_iteration {config.questions_per_iteration} does not split over {jax.process_count()} "
                "processes: each process samples an equal share of every iteration's questions; choose a multiple"
            )
        behaviour = learner.config
        if (config.max_staleness and behaviour.old_logprobs == "recompute"
                and behaviour.loss.mismatch_correction == "none"):
            raise ValueError(
                "max_staleness >= 1 trains rows sampled under earlier weights, so the sampler must be the behaviour "
                "policy: old_logprobs='sampler', or a mismatch_correction (e.g. 'tis-token') with 'recompute'"
            )
        self._question_labels = getattr(environment, "question_labels", None)
        uses_labels = {
            "stratify_questions": config.stratify_questions,
            "std_scaling='label'": config.estimator_options.get("std_scaling") == "label",
            f"an auxiliary term reading the row label {QUESTION_LABEL!r}":
                QUESTION_LABEL in learner.config.loss.row_labels_read,
        }
        for option, used in uses_labels.items():
            if used and self._question_labels is None:
                raise ValueError(f"{option} needs an environment with question_labels (a label per question)")

    # -- state --------------------------------------------------------------------------------------------------

    def loop_state(self) -> dict[str, int]:
        with self._stream_lock:
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
        self.iteration = self._saved_iteration = int(state["iteration"])
        self.data_position = int(state["data_position"])
        self.policy_version = int(state["policy_version"])
        self._next_sample_id = int(state["next_sample_id"])
        if self.writer is not None:
            self.writer.discard_after(step)
        self._sync_weights()
        log.info("resumed from checkpoint %d (data position %d, policy version %d)", step,
                 self.data_position, self.policy_version)
        return True

    def _sync_weights(self) -> None:
        """Pushes the learner's weights to the generators as `policy_version`, between two samples."""
        with self._generator_lock:
            self.weight_sync(self.learner.model, self.policy_version)
            self._generator_version = self.policy_version

    def save(self) -> None:
        self._saved_iteration = self.iteration
        if self.checkpointer is not None:
            self.checkpointer.save(self.iteration, self.learner, self.rng_key, self.loop_state())
        if self.after_checkpoint is not None:
            with self._generator_lock:  # an asynchronous pipeline's sampler waits
                self.after_checkpoint(self.iteration)

    # -- one iteration ----------------------------------------------------------------------------------------------

    def _sample(self, prompts: list[Sequence[int]], questions: list[int], first_group: int, n: int,
                contexts: list[Any] | None, times: dict[str, float], *, first_row: int, rows: int) -> _Sampled:
        """This process's rows of a round of `rows` rows (over all processes), the round's rows `first_row` on: `n`
        completions of each prompt, scored. Row r of the round draws from the round's seed + r and has sample id r
        past the round's first (see the module docstring)."""
        self.rng_key, key = jax.random.split(self.rng_key)
        seed = int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))
        sample_ids = [self._next_sample_id + first_row + i for i in range(len(prompts) * n)]
        self._next_sample_id += rows
        if not prompts:
            return _Sampled([], [], [], [])
        started = time.perf_counter()
        groups = self.sampler.generate(prompts, dataclasses.replace(self.sampling_params, seed=seed + first_row), n,
                                       token_masks=self._token_masks(questions))
        scored = time.perf_counter()
        completions = [completion for group in groups for completion in group]
        row_questions = [q for q in questions for _ in range(n)]
        group_ids = [first_group + i for i in range(len(questions)) for _ in range(n)]
        row_contexts = None if contexts is None else [c for c in contexts for _ in range(n)]
        completion_ids = [c.completion_ids for c in completions]
        rollouts = self.environment.score(row_questions, completion_ids, row_contexts, sample_ids)
        times["generate"] = times.get("generate", 0.0) + scored - started
        times["score"] = times.get("score", 0.0) + time.perf_counter() - scored
        return _Sampled(row_questions, group_ids, completions, rollouts)

    def _token_masks(self, questions: Sequence[int]) -> list[Any] | None:
        return [self.environment.token_mask(q) for q in questions] if self.config.mask_tokens else None

    def _sample_groups(self, position: int, times: dict[str, float]) -> list[_Sampled]:
        """Every round of the episodes of questions `position ..` of the stream, one group per question, sampled,
        scored and gathered from every process."""
        config = self.config
        questions = question_order(self.environment.num_questions, config.seed, position,
                                   config.questions_per_iteration,
                                   self._question_labels if config.stratify_questions else None)
        share = config.questions_per_iteration // jax.process_count()
        first_group = jax.process_index() * share
        mine = questions[first_group : first_group + share]
        first_row = first_group * config.group_size
        prompts = [self.environment.prompt_ids(q) for q in mine]
        rounds = [self._sample(prompts, mine, first_group, config.group_size, None, times, first_row=first_row,
                               rows=config.questions_per_iteration * config.group_size)]
        rounds[0].episodes = [first_row + i for i in range(len(rounds[0].completions))]
        for _ in range(config.recursion_rounds):
            if not self._recursion_round(rounds, times):
                break
        return _gathered(rounds)

    def run_iteration(self) -> dict[str, float]:
        """One iteration; returns the scalars it logged."""
        config = self.config
        times: dict[str, float] = {}
        started = time.perf_counter()
        sampled = [self._sample_groups(self.data_position, times)]
        rounds = sampled[0]
        if config.dynamic_sampling == "backfill":
            rewards_differ = [_rewards_differ(rounds, config.group_size)]
            while (sum(map(np.sum, rewards_differ)) < config.questions_per_iteration
                   and len(sampled) < config.max_sampling_rounds):
                position = self.data_position + len(sampled) * config.questions_per_iteration
                sampled.append(self._sample_groups(position, times))
                rewards_differ.append(_rewards_differ(sampled[-1], config.group_size))
            chosen = backfilled_groups(rewards_differ, config.questions_per_iteration)
            rounds = _regrouped(sampled, chosen, config.group_size, config.questions_per_iteration)
        self.data_position += config.questions_per_iteration * len(sampled)
        return self._learn(rounds, times, started,
                           sampled_rewards=np.concatenate([_episode_rewards(s) for s in sampled]),
                           oversampling=float(len(sampled)))

    def _learn(self, rounds: list[_Sampled], times: dict[str, float], started: float, *, sampled_rewards: np.ndarray,
               oversampling: float, sampled_by_current_weights: bool = True,
               pipeline_scalars: Mapping[str, float] | None = None) -> dict[str, float]:
        """Trains on an iteration's rows (every process's, round by round), syncs the new weights, logs; returns the
        scalars it logged. `started` is when the iteration began (`time.perf_counter()`). `sampled_by_current_weights`
        goes to `Learner.update`; `pipeline_scalars` (`async/*`) join the logged scalars. `sampled_rewards`: one per
        episode the batch was chosen from (with backfill, `LoopConfig.dynamic_sampling`, the groups left out too), and
        `oversampling` how many groups were taken per group of the batch."""
        config = self.config
        rows = [(s, i) for s in rounds for i in range(len(s.completions))]
        completions = [s.completions[i] for s, i in rows]
        episodes = np.asarray([s.episodes[i] for s, i in rows])
        episode_rewards = _episode_rewards(rounds)
        rewards_array = episode_rewards[episodes]
        group_ids = np.asarray([s.group_ids[i] for s, i in rows], dtype=np.int32)
        lengths = np.asarray([len(c.completion_ids) for c in completions], dtype=np.float32)
        question_labels = None
        if self._question_labels is not None:
            question_labels = np.asarray([self._question_labels[s.questions[i]] for s, i in rows])
        advantages = advantage_estimators.compute(
            config.estimator, rewards_array, group_ids, lengths=lengths, labels=question_labels,
            options=config.estimator_options,
        )
        advantages = advantage_estimators.credit_lone_later_rounds(advantages, group_ids, episodes)
        row_rollouts = [s.rollouts[i] for s, i in rows]
        label_names = sorted({name for r in row_rollouts for name in r.labels})
        marked_names = sorted({name for r in row_rollouts for name in r.marked_tokens})
        marked_tokens = {name: [tuple(r.marked_tokens.get(name, ())) for r in row_rollouts] for name in marked_names}
        token_scalings, transform_metrics = [], {}
        if config.advantage_transforms:
            advantages, token_scalings, transform_metrics = advantage_estimators.apply_transforms(
                config.advantage_transforms,
                advantage_estimators.AdvantageBatch(
                    advantages=advantages,
                    rewards=rewards_array,
                    group_ids=group_ids,
                    question_labels=question_labels,
                    labels={name: [r.labels.get(name) for r in row_rollouts] for name in label_names},
                    marked_tokens=marked_tokens,
                    sampler_logprobs=[c.logprobs for c in completions],
                ),
            )
        keep, dropped_groups = np.ones(len(rows), dtype=bool), 0
        if config.dynamic_sampling != "off":
            keep, dropped_groups = advantage_estimators.zero_variance_groups(rewards_array, group_ids)
            keep = advantage_estimators.credit_lone_later_rounds(keep, group_ids, episodes)

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
                token_constraints=[c.constraints for c in completions] if config.mask_tokens else None,
                **self._term_extras(row_rollouts, question_labels),
            )
            for token_indices, token_factors in token_scalings:
                batch = batch.scaled_token_advantages(token_indices, token_factors)
            scalars.update({f"advantage/{name}": value for name, value in transform_metrics.items()})
            # Dropped groups leave the loss (rows without loss tokens count in no denominator); shapes stay put.
            batch = batch.replace(loss_mask=batch.loss_mask & keep[:, None])
            scalars.update({f"learner/{k}": v for k, v in self.learner.update(
                batch, sampled_by_current_weights=sampled_by_current_weights).items()})
            sync_started = time.perf_counter()
            times["learn"] = sync_started - learn_started
            self.policy_version += 1
            self._sync_weights()
            times["sync"] = time.perf_counter() - sync_started
        else:
            log.warning("iteration %d: every group had zero reward variance; no update", self.iteration + 1)

        self.iteration += 1
        times["iteration"] = time.perf_counter() - started
        trained = keep & (advantages != 0)
        scalars.update(
            self._rollout_scalars(rounds, sampled_rewards, advantages, trained, dropped_groups, times)
        )
        scalars["dynamic_sampling/oversampling"] = oversampling
        compiled_by_now = compiles.totals()
        compiled, self._compiles = compiled_by_now - self._compiles, compiled_by_now
        scalars.update({"compile/programs": float(compiled.programs), "compile/cache_hits": float(compiled.cache_hits),
                        "compile/seconds": compiled.seconds})
        scalars.update(pipeline_scalars or {})
        self._log(rounds, rewards_array, advantages, scalars)
        return scalars

    def _term_extras(self, row_rollouts: list[Rollout], question_labels: np.ndarray | None) -> dict[str, dict]:
        """The token positions and row labels the loss's auxiliary terms read (`LoopConfig`), as
        `rl.trajectories.build` takes them."""
        loss = self.learner.config.loss
        positions = {
            name: [(r.marked_tokens.get(name) or (-1,))[0] for r in row_rollouts]
            for name in loss.token_positions_read
        }
        labels = {}
        for name in loss.row_labels_read:
            if name == QUESTION_LABEL:
                numbers = {label: index for index, label in enumerate(sorted(set(self._question_labels)))}
                labels[name] = [numbers[label] for label in question_labels]
            else:
                labels[name] = [-1 if r.labels.get(name) is None else r.labels[name] for r in row_rollouts]
        return {"token_positions": positions, "row_labels": labels}

    def _recursion_round(self, rounds: list[_Sampled], times: dict[str, float]) -> bool:
        """Samples the next round: one completion for each row of the last round that the environment gave a follow-up
        prompt. False when there was none."""
        last = rounds[-1]
        follow = [i for i, r in enumerate(last.rollouts) if r.followup_prompt_ids is not None]
        # Every process takes the same decision (and the same RNG split): a process with no follow-up of its own
        # still takes part in a round that another process's episodes continue.
        counts = _from_every_process(len(follow))
        if not sum(counts):
            return False
        sampled = self._sample(
            [last.rollouts[i].followup_prompt_ids for i in follow],
            [last.questions[i] for i in follow],
            0,
            1,
            [last.rollouts[i].context for i in follow],
            times,
            first_row=sum(counts[: jax.process_index()]),
            rows=sum(counts),
        )
        # Each row of a later round is a group of one, so it is grouped with its question's other rows of this
        # round: round k of the question of first-round group g (episodes g * group_size ..) is group
        # k * questions_per_iteration + g.
        sampled.episodes = [last.episodes[i] for i in follow]
        sampled.group_ids = [
            len(rounds) * self.config.questions_per_iteration + episode // self.config.group_size
            for episode in sampled.episodes
        ]
        rounds.append(sampled)
        return True

    # -- reporting ----------------------------------------------------------------------------------------------

    def _rollout_scalars(self, rounds, sampled_rewards, advantages, trained, dropped_groups, times) -> dict[str, float]:
        """`sampled_rewards`: one per episode the iteration sampled (with backfill, those of the groups left out of
        the batch too, so the reward stays the policy's on the question stream); `advantages` and `trained` (the row
        has a loss with a gradient): one per row of the batch, round by round."""
        first = rounds[0]
        scalars = {
            "reward/mean": float(sampled_rewards.mean()),
            "reward/std": float(sampled_rewards.std()),
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
        if self.config.recursion_rounds:
            # Round k's rows, those of them that train (loss tokens and a non-zero advantage), and the environment's
            # reward of that round.
            end = 0
            for index in range(self.config.recursion_rounds + 1):
                sampled = rounds[index] if index < len(rounds) else None
                start, end = end, end + (len(sampled.completions) if sampled else 0)
                scalars[f"recursion/round{index}_rows"] = float(end - start)
                scalars[f"recursion/round{index}_trained_rows"] = float(trained[start:end].sum())
                if sampled:
                    scalars[f"recursion/round{index}_reward"] = float(np.mean([r.reward for r in sampled.rollouts]))
        scalars.update({f"time/{phase}": seconds for phase, seconds in times.items()})
        return scalars

    def _log(self, rounds: list[_Sampled], rewards: np.ndarray, advantages: np.ndarray, scalars: dict[str, float]
             ) -> None:
        """`rewards` (each row's episode reward, what it trains on) and `advantages`: one per row, round by round."""
        elapsed = scalars["time/iteration"]
        remaining = (self.config.iterations - self.iteration) * elapsed
        headline = " ".join(
            f"{name} {scalars[f'rollout/{name}']:.3g}" for name in self.config.headline_metrics
            if f"rollout/{name}" in scalars
        )
        if jax.process_index() == 0:
            log.info(
                "iter %d/%d reward %.3f %s | generate %.1fs score %.1fs learn %.1fs sync %.2fs | eta %.0fs",
                self.iteration, self.config.iterations, scalars["reward/mean"], headline, scalars["time/generate"],
                scalars["time/score"], scalars["time/learn"], scalars["time/sync"], remaining,
            )
        if self.writer is None:
            return
        first = rounds[0]
        samples = "\n\n".join(
            f"**reward {first.rollouts[i].reward:.2f}**\n\n```\n{self.environment.decode(first.completions[i].completion_ids)}\n```"
            for i in range(min(self.config.samples_to_log, len(first.completions)))
        )
        histograms = {"rewards": rewards}
        for name in sorted({name for r in first.rollouts for name in r.histograms}):
            values = [value for r in first.rollouts for value in r.histograms.get(name, ())]
            if values:
                histograms[name] = np.asarray(values)
        self.writer.log(self.iteration, scalars, histograms=histograms, texts={"samples": samples})
        rows = [(round_index, sampled, i) for round_index, sampled in enumerate(rounds)
                for i in range(len(sampled.completions))]
        self.writer.log_rollouts(self.iteration, [
            {
                "round": round_index,
                "episode": sampled.episodes[i],
                "question": sampled.questions[i],
                "completion_ids": list(sampled.completions[i].completion_ids),
                "reward": float(sampled.rollouts[i].reward),
                "episode_reward": float(rewards[row]),
                "advantage": float(advantages[row]),
                **sampled.rollouts[i].record,
            }
            for row, (round_index, sampled, i) in enumerate(rows)
        ])

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> list[dict[str, float]]:
        """Resumes if a checkpoint exists, then runs the remaining iterations; returns each iteration's scalars."""
        if not self.restore():
            self._sync_weights()
        history = []
        pipeline = self._start_pipeline() if self.config.max_staleness else None
        try:
            while self.iteration < self.config.iterations:
                history.append(self.run_iteration() if pipeline is None else self._pipelined_iteration(pipeline))
                every = self.config.checkpoint_every
                if every and self.iteration % every == 0:
                    self.save()
        finally:
            if pipeline is not None:
                pipeline.close()
        if self._saved_iteration != self.iteration:
            self.save()
        if self.writer is not None:
            self.writer.flush()
        return history

    # -- the asynchronous pipeline (max_staleness >= 1) -------------------------------------------------------------

    def _start_pipeline(self) -> Pipeline:
        """Starts sampling at the current data position. A resumed run starts at the checkpoint's data position,
        past the questions sampled before it (groups in flight when it was saved are not trained)."""
        config = self.config
        share = config.questions_per_iteration // jax.process_count()
        first_group = jax.process_index() * share
        first_row = first_group * config.group_size
        labels = self._question_labels if config.stratify_questions else None

        def next_round() -> Round:  # on the producer thread
            with self._stream_lock:
                position, first_id = self.data_position, self._next_sample_id
                self.data_position += config.questions_per_iteration
                self._next_sample_id += config.questions_per_iteration * config.group_size
            questions = question_order(self.environment.num_questions, config.seed, position,
                                       config.questions_per_iteration, labels)
            return Round(
                questions=questions[first_group : first_group + share],
                sample_ids=[first_id + first_row + i for i in range(share * config.group_size)],
                seed=round_seed(config.seed, position) + first_row,
            )

        self._pipeline_started = time.perf_counter()
        self._learner_idle = 0.0
        self._generated = 0.0  # the pipeline's generate seconds when the last batch was assembled
        return Pipeline(
            environment=self.environment, sampler=self.sampler, sampling_params=self.sampling_params,
            group_size=config.group_size, groups_per_round=share, max_staleness=config.max_staleness,
            next_round=next_round, version=lambda: self._generator_version, generator_lock=self._generator_lock,
            token_masks=self._token_masks,
        ).start()

    def _pipelined_iteration(self, pipeline: Pipeline) -> dict[str, float]:
        """One iteration of the pipeline: this process's share of the batch from the groups in the order they become
        ready (a group sampled more than `max_staleness` versions ago is dropped), gathered from every process,
        trained; returns the scalars it logged."""
        config = self.config
        started = time.perf_counter()
        share = config.questions_per_iteration // jax.process_count()
        backfill = config.dynamic_sampling == "backfill"
        limit = config.max_sampling_rounds * share  # groups a backfilled batch may take before it fills up
        groups, agreeing, dropped, taken = [], [], 0, 0
        while len(groups) < share:
            if backfill and taken >= limit and agreeing:
                groups.append(agreeing.pop(0))
                continue
            group = pipeline.next_group()
            taken += 1
            if self.policy_version - group.policy_version > config.max_staleness:
                dropped += 1
                pipeline.release(1)
            elif backfill and taken <= limit and not _group_rewards_differ(group):
                agreeing.append(group)
            else:
                groups.append(group)
        left_out = [rollout.reward for group in agreeing for rollout in group.rollouts]
        pipeline.release(len(agreeing))
        first_group = jax.process_index() * share
        first_row = first_group * config.group_size
        sampled = _Sampled(
            questions=[g.question for g in groups for _ in g.completions],
            group_ids=[first_group + i for i, g in enumerate(groups) for _ in g.completions],
            completions=[c for g in groups for c in g.completions],
            rollouts=[dataclasses.replace(r, record={**r.record, "policy_version": g.policy_version})
                      for g in groups for r in g.rollouts],
            episodes=[first_row + i for i in range(share * config.group_size)],
        )
        staleness = [self.policy_version - g.policy_version for g in groups]
        every = _from_every_process((staleness, dropped, [g.score_seconds for g in groups], taken, left_out))
        rounds = _gathered([sampled])
        waited = time.perf_counter() - started
        self._learner_idle += waited
        elapsed = time.perf_counter() - self._pipeline_started
        staleness = [s for process in every for s in process[0]]
        scalars = {f"async/staleness_{k}": float(config.group_size * staleness.count(k))
                   for k in range(config.max_staleness + 1)}
        scalars["async/rows_dropped"] = float(config.group_size * sum(process[1] for process in every))
        scalars["async/learner_idle_share"] = self._learner_idle / elapsed
        scalars["async/generator_idle_share"] = 1.0 - pipeline.generate_seconds / elapsed
        generated = pipeline.generate_seconds
        times = {
            # Generation since the last batch was assembled, most of it while the learner learnt.
            "generate": generated - self._generated,
            "score": float(np.mean([s for process in every for s in process[2]])),
            "wait": waited,
        }
        self._generated = generated
        left_out = np.asarray([reward for process in every for reward in process[4]], dtype=np.float64)
        result = self._learn(rounds, times, started, sampled_by_current_weights=not any(staleness),
                             sampled_rewards=np.concatenate([_episode_rewards(rounds), left_out]),
                             oversampling=sum(process[3] for process in every) / config.questions_per_iteration,
                             pipeline_scalars=scalars)
        pipeline.release(len(groups))
        return result


def _episode_rewards(rounds: list[_Sampled]) -> np.ndarray:
    """One reward per episode: its last round's (the environment blends the earlier rounds' into it)."""
    rewards = np.zeros(len(rounds[0].completions))
    for sampled in rounds:  # in round order, so a later round's reward replaces an earlier one's
        for rollout, episode in zip(sampled.rollouts, sampled.episodes):
            rewards[episode] = rollout.reward
    return rewards


def _rewards_differ(rounds: list[_Sampled], group_size: int) -> np.ndarray:
    """[groups] bool: whether the episode rewards of each first-round group (`group_size` consecutive episodes)
    differ."""
    rewards = _episode_rewards(rounds).reshape(-1, group_size)
    return rewards.max(axis=1) != rewards.min(axis=1)


def _group_rewards_differ(group: Group) -> bool:
    """Whether a pipeline group's rewards differ (one round per episode, so its rollouts' rewards are its episodes')."""
    rewards = [rollout.reward for rollout in group.rollouts]
    return max(rewards) != min(rewards)


def _regrouped(sampled: list[list[_Sampled]], chosen: list[tuple[int, int]], group_size: int, groups: int
               ) -> list[_Sampled]:
    """The rounds of a batch of the `chosen` groups, each (sampling round, group of it), of several sampling rounds
    (each `_sample_groups`'s rounds), numbered as if sampled together: the batch's group i is chosen[i], its
    episodes are i * group_size .. and its round-k rows are in group k * groups + i."""
    rounds = []
    for index in range(max(len(rounds_of_one) for rounds_of_one in sampled)):
        merged = _Sampled([], [], [], [], [])
        for group, (sampling_round, old_group) in enumerate(chosen):
            if index >= len(sampled[sampling_round]):
                continue
            old = sampled[sampling_round][index]
            for row, episode in enumerate(old.episodes):
                if episode // group_size == old_group:
                    merged.questions.append(old.questions[row])
                    merged.group_ids.append(index * groups + group)
                    merged.completions.append(old.completions[row])
                    merged.rollouts.append(old.rollouts[row])
                    merged.episodes.append(group * group_size + episode % group_size)
        if not merged.completions:
            break
        rounds.append(merged)
    return rounds


def _from_every_process(value: Any) -> list[Any]:
    """Every process's `value` (anything picklable), in process order; `[value]` in a one-process run. A collective:
    every process calls it at the same point."""
    if jax.process_count() == 1:
        return [value]
    payload = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
    sizes = multihost_utils.process_allgather(np.int64(payload.size))
    # Padded to a power of two, so a run compiles a handful of gather programs, not one per payload size.
    padded = np.zeros(1 << int(sizes.max() - 1).bit_length(), dtype=np.uint8)
    padded[: payload.size] = payload
    gathered = multihost_utils.process_allgather(padded)
    return [pickle.loads(gathered[index, :size].tobytes()) for index, size in enumerate(sizes)]


def _gathered(rounds: list[_Sampled]) -> list[_Sampled]:
    """Every process's rows of each round, process after process: as one process sampling all the groups would hold
    them (a process's episodes follow those of the processes before it). Contexts stay with the process that ran
    them (they matter only to its next round)."""
    if jax.process_count() == 1:
        return rounds
    mine = [
        (s.questions, s.group_ids, s.completions, [dataclasses.replace(r, context=None) for r in s.rollouts],
         s.episodes)
        for s in rounds
    ]
    every = _from_every_process(mine)
    return [
        _Sampled(*(sum((process[index][field] for process in every), []) for field in range(5)))
        for index in range(len(rounds))
    ]
