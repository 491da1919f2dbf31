"""The asynchronous pipeline (`LoopConfig.max_staleness`): slots, policy versions, the order groups become ready,
dropping stale groups, failures; and K = 0 leaving the synchronous loop as it was.

The `Pipeline` tests are pure Python on a fake sampler and environment that block until the test lets them go, so
each checks an exact count or order; the loop tests run the tiny learner of tests/rl/test_loop.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from rl.checkpoint import Checkpointer
from rl.learner import LearnerConfig
from rl.loop import LoopConfig, Rollout, TrainingLoop, backfilled_groups, question_order
from rl.losses import LossConfig
from rl.metrics import MetricsWriter
from rl.pipeline import Pipeline, Round, round_seed
from rollout.types import Completion, SamplingParams
from tests.rl.helpers import RecordingLearner, SeededSampler
from tests.rl.test_loop import ParityWorld, SplitWorld, make_learner

WAIT_S = 120.0  # a bound on waits (a learner compiling under load included): a hang fails the test, not the suite


class VersionedSampler:
    """Completions whose first token is the prompt's question token and whose policy_version is the version of the
    weights it holds (set by `sync`); `hold` makes `generate` wait until it is set."""

    def __init__(self):
        self.version = 0
        self.calls = []
        self.hold = threading.Event()
        self.hold.set()
        self.generating = threading.Event()

    def sync(self, model, version):
        self.version = version

    def generate(self, prompt_ids, params, n, token_masks=None):
        self.generating.set()
        assert self.hold.wait(WAIT_S)
        self.calls.append((len(prompt_ids), params.seed, self.version))
        return [[Completion(tuple(p), (p[-1], 1, 2), (-1.0, -1.0, -1.0), "length", self.version) for _ in range(n)]
                for p in prompt_ids]


class GatedWorld:
    """Questions 0..; scoring question q waits until `release(q)` (every question, with `release_all`), and
    `scored` records the order of the groups scored. `fail` makes scoring question `fail` raise."""

    num_questions = 1000
    question_labels = None

    def __init__(self, fail: int | None = None):
        self.gates: dict[int, threading.Event] = {}
        self.lock = threading.Lock()
        self.scored = []
        self.fail = fail
        self.open = False

    def gate(self, question):
        with self.lock:
            return self.gates.setdefault(question, threading.Event())

    def release(self, question):
        self.gate(question).set()

    def release_all(self):
        self.open = True
        with self.lock:
            for event in self.gates.values():
                event.set()

    def prompt_ids(self, question):
        return [1, question + 3]

    def score(self, questions, completions, contexts, sample_ids):
        question = questions[0]
        if question == self.fail:
            raise ValueError(f"question {question} failed")
        if not self.open:
            assert self.gate(question).wait(WAIT_S)
        with self.lock:
            self.scored.append(question)
        return [Rollout(float(c[0] % 2), {}) for c in completions]

    def decode(self, token_ids):
        return " ".join(map(str, token_ids))


def make_pipeline(world, sampler, *, max_staleness=1, groups_per_round=2, group_size=3):
    lock = threading.Lock()
    position = {"next": 0}

    def next_round():
        first = position["next"]
        position["next"] += groups_per_round
        return Round(list(range(first, first + groups_per_round)),
                     list(range(first * group_size, (first + groups_per_round) * group_size)), seed=first)

    pipeline = Pipeline(
        environment=world, sampler=sampler, sampling_params=SamplingParams(max_new_tokens=3), group_size=group_size,
        groups_per_round=groups_per_round, max_staleness=max_staleness, next_round=next_round,
        version=lambda: sampler.version, generator_lock=lock,
    )
    return pipeline, lock


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_sampling_runs_ahead_by_max_staleness_plus_one_rounds_until_slots_are_released(max_staleness):
    world, sampler = GatedWorld(), VersionedSampler()
    pipeline, _ = make_pipeline(world, sampler, max_staleness=max_staleness)
    pipeline.start()
    try:
        wait_for(lambda: len(sampler.calls) == max_staleness + 1, "the first rounds")
        time.sleep(0.1)  # a producer that ignored the slots would sample another round by now
        assert len(sampler.calls) == max_staleness + 1
        world.release_all()
        groups = [pipeline.next_group() for _ in range(2)]
        pipeline.release(len(groups))
        wait_for(lambda: len(sampler.calls) == max_staleness + 2, "a round after the release")
        time.sleep(0.1)
        assert len(sampler.calls) == max_staleness + 2
        with pytest.raises(ValueError, match="releasing"):
            pipeline.release(100)
    finally:
        pipeline.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("pipeline")]


def test_groups_become_ready_in_the_order_their_scoring_ends_not_the_order_they_were_sampled():
    world, sampler = GatedWorld(), VersionedSampler()
    pipeline, _ = make_pipeline(world, sampler, max_staleness=1)
    pipeline.start()
    try:
        wait_for(lambda: len(sampler.calls) == 2, "two rounds")
        order = [3, 0, 2, 1]
        ready = []
        for question in order:
            world.release(question)
            ready.append(pipeline.next_group().question)
        assert ready == order
    finally:
        pipeline.close()


def test_a_sync_waits_for_the_generate_call_in_flight_and_groups_carry_the_version_that_sampled_them():
    world, sampler = GatedWorld(), VersionedSampler()
    world.release_all()
    pipeline, lock = make_pipeline(world, sampler, max_staleness=1)
    sampler.hold.clear()
    pipeline.start()
    try:
        assert sampler.generating.wait(WAIT_S)
        # The learner's sync takes the generator lock: it cannot while a generate call runs.
        assert not lock.acquire(timeout=0.1)
        sampler.hold.set()
        assert lock.acquire(timeout=WAIT_S)
        sampler.sync(None, 1)  # what TrainingLoop._sync_weights does under the lock
        lock.release()
        groups = [pipeline.next_group() for _ in range(4)]
        pipeline.release(4)
        groups += [pipeline.next_group() for _ in range(2)]
    finally:
        pipeline.close()
    # The first round was sampled at version 0; every later round at the version synced before it began.
    versions = {g.question: g.policy_version for g in groups}
    assert versions[0] == versions[1] == 0
    assert [v for _, _, v in sampler.calls[:3]] == [versions[0], versions[2], versions[4]]
    assert versions[4] == versions[5] == 1
    for group in groups:
        assert [c.policy_version for c in group.completions] == [group.policy_version] * 3


def test_scoring_that_fails_is_raised_to_the_learner():
    world, sampler = GatedWorld(fail=1), VersionedSampler()
    world.release_all()
    pipeline, _ = make_pipeline(world, sampler, max_staleness=1)
    pipeline.start()
    try:
        with pytest.raises(RuntimeError, match="scoring failed") as error:
            for _ in range(4):
                pipeline.next_group()
        assert "question 1 failed" in str(error.value.__cause__)
    finally:
        pipeline.close()


class AsyncWorld(GatedWorld):
    """Scores on the pipeline's event loop: question q's group takes `delays[q]` seconds of (simulated) worker calls."""

    def __init__(self, delays):
        super().__init__()
        self.delays = delays

    async def score_async(self, questions, completions, contexts, sample_ids):
        await asyncio.sleep(self.delays[questions[0]])
        return [Rollout(1.0, {}) for _ in completions]


def test_groups_scored_on_the_event_loop_run_concurrently_and_the_quickest_is_ready_first():
    delays = {0: 0.6, 1: 0.3, 2: 0.0, 3: 0.45}
    sampler = VersionedSampler()
    pipeline, _ = make_pipeline(AsyncWorld(delays), sampler, max_staleness=1)
    started = time.perf_counter()
    pipeline.start()
    try:
        ready = [pipeline.next_group() for _ in range(4)]
    finally:
        pipeline.close()
    # One after the other the four would take 1.35 s; side by side, the slowest's 0.6 s.
    assert time.perf_counter() - started < 1.2
    assert [g.question for g in ready] == [2, 1, 3, 0]
    assert ready[0].score_seconds < 0.2 and ready[-1].score_seconds >= 0.6


def test_a_pipeline_needs_max_staleness_of_at_least_one():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        make_pipeline(GatedWorld(), VersionedSampler(), max_staleness=0)


# -- the loop ---------------------------------------------------------------------------------------------------------

def sampler_learner(cls=RecordingLearner, seed=0):
    """tests/rl/test_loop.py's learner with the sampler as the behaviour policy, which the pipeline needs."""
    learner = make_learner(seed)
    return cls(learner.model, dataclasses.replace(learner.config, old_logprobs="sampler"))


class FlagRecordingLearner(RecordingLearner):
    """Also records each update's `sampled_by_current_weights`."""

    def update(self, batch, **options):
        self.flags = getattr(self, "flags", []) + [options["sampled_by_current_weights"]]
        return super().update(batch, **options)


class HoldFirstGroup(GatedWorld):
    """Every group is scored at once but the first one sampled (sample ids 0..), which waits for `first`."""

    def __init__(self):
        super().__init__()
        self.first = threading.Event()
        self.held_question = None
        self.open = True

    def score(self, questions, completions, contexts, sample_ids):
        if 0 in sample_ids:
            self.held_question = questions[0]
            assert self.first.wait(WAIT_S)
        return super().score(questions, completions, contexts, sample_ids)


def run_loop(world, *, iterations, max_staleness, sampler, learner, tmp_path=None, on_sync=None, checkpointer=None):
    syncs = []

    def weight_sync(model, version):
        syncs.append(version)
        sampler.sync(model, version)
        if on_sync is not None:
            on_sync(version)

    loop = TrainingLoop(
        LoopConfig(iterations=iterations, questions_per_iteration=2, group_size=4, length_buckets=(16,),
                   max_staleness=max_staleness, checkpoint_every=0),
        learner=learner, sampler=sampler, sampling_params=SamplingParams(max_new_tokens=3), weight_sync=weight_sync,
        environment=world, pad_id=0, writer=MetricsWriter(tmp_path) if tmp_path else None, checkpointer=checkpointer,
    )
    return loop, loop.run(), syncs


def without_times(history):
    """The scalars but wall times and compilation counts (the first run compiles what the second reuses)."""
    return [{k: v for k, v in scalars.items() if not k.startswith(("time/", "compile/"))} for scalars in history]


class SyncedSampler(SeededSampler):
    def sync(self, model, version):
        pass


def test_max_staleness_zero_is_the_synchronous_loop_with_its_figures():
    _, history, syncs = run_loop(ParityWorld(), iterations=3, max_staleness=0, sampler=SyncedSampler(),
                                 learner=sampler_learner())
    assert syncs == [0, 1, 2, 3]
    assert not any(name.startswith("async/") for scalars in history for name in scalars)
    assert not [t for t in threading.enumerate() if t.name.startswith("pipeline")]
    # The same iterations, run one by one as before the pipeline existed.
    reference = TrainingLoop(
        LoopConfig(iterations=3, questions_per_iteration=2, group_size=4, length_buckets=(16,), checkpoint_every=0),
        learner=sampler_learner(), sampler=SeededSampler(), sampling_params=SamplingParams(max_new_tokens=3),
        weight_sync=lambda model, version: None, environment=ParityWorld(), pad_id=0,
    )
    expected = [reference.run_iteration() for _ in range(3)]
    assert without_times(history) == without_times(expected)


def test_a_group_staler_than_max_staleness_is_dropped_and_every_trained_row_is_within_it(tmp_path):
    world, sampler = HoldFirstGroup(), VersionedSampler()
    learner = sampler_learner(FlagRecordingLearner)
    # The first group sampled (at version 0) is scored only once the learner has reached version 3.
    _, history, syncs = run_loop(world, iterations=6, max_staleness=1, sampler=sampler, learner=learner,
                                 tmp_path=tmp_path, on_sync=lambda version: version == 3 and world.first.set())
    assert syncs == list(range(7))
    assert [h["async/rows_dropped"] for h in history].count(4.0) == 1  # that group's 4 rows, once
    assert sum(h["async/rows_dropped"] for h in history) == 4
    for scalars in history:
        assert scalars["async/staleness_0"] + scalars["async/staleness_1"] == 8
        assert 0.0 <= scalars["async/learner_idle_share"] <= 1.0
        assert 0.0 <= scalars["async/generator_idle_share"] <= 1.0
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 6 * 8 and world.held_question not in {row["question"] for row in rows}
    for row in rows:
        # Trained at step i by the update from version i - 1, so sampled at version i - 2 or i - 1.
        assert row["step"] - 2 <= row["policy_version"] <= row["step"] - 1
    stale_batches = [scalars["async/staleness_1"] > 0 for scalars in history]
    assert learner.flags == [not stale for stale in stale_batches] and any(stale_batches)


def test_the_pipeline_samples_the_stream_of_questions_with_the_synchronous_loops_sample_ids():
    world, sampler = GatedWorld(), VersionedSampler()
    world.open = True
    loop, history, _ = run_loop(world, iterations=4, max_staleness=2, sampler=sampler, learner=sampler_learner())
    rounds = len(sampler.calls)
    # 4 rounds trained, up to 3 more sampled ahead; each took the next 2 questions of the stream and 8 sample ids.
    assert 4 <= rounds <= 7
    assert loop.data_position == 2 * rounds and loop.loop_state()["next_sample_id"] == 8 * rounds
    assert [seed for _, seed, _ in sampler.calls] == [round_seed(0, 2 * r) for r in range(rounds)]
    asked = question_order(world.num_questions, 0, 0, 2 * rounds)
    assert sorted(world.scored) == sorted(asked)
    assert [h["policy_version"] for h in history] == [1.0, 2.0, 3.0, 4.0]


def test_bad_max_staleness_settings_are_rejected():
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="max_staleness"):
            LoopConfig(iterations=1, max_staleness=bad)
    with pytest.raises(ValueError, match="recursion_rounds"):
        LoopConfig(iterations=1, max_staleness=1, recursion_rounds=1)
    LoopConfig(iterations=1, max_staleness=1, dynamic_sampling="backfill")

    def loop(learner_config):
        learner = RecordingLearner(make_learner().model, learner_config)
        return TrainingLoop(LoopConfig(iterations=1, max_staleness=1), learner=learner, sampler=SeededSampler(),
                            sampling_params=SamplingParams(), weight_sync=lambda m, v: None,
                            environment=ParityWorld(), pad_id=0)

    with pytest.raises(ValueError, match="behaviour policy"):
        loop(LearnerConfig())  # recompute, no mismatch correction: stale rows would pass for the learner's own
    loop(LearnerConfig(loss=LossConfig(mismatch_correction="tis-token")))
    loop(LearnerConfig(old_logprobs="sampler"))


def test_a_resumed_pipeline_samples_on_from_the_checkpoints_data_position(tmp_path):
    world = GatedWorld()
    world.open = True
    checkpointer = Checkpointer(tmp_path / "ckpt", keep=2)
    first, _, _ = run_loop(world, iterations=2, max_staleness=1, sampler=VersionedSampler(),
                           learner=sampler_learner(), checkpointer=checkpointer)
    saved = first.loop_state()
    # Rounds sampled ahead of the last update were never trained; the resumed run does not sample them again.
    assert saved["data_position"] >= 2 * 2 and saved["next_sample_id"] == 4 * saved["data_position"]
    sampler = VersionedSampler()
    resumed, history, syncs = run_loop(world, iterations=4, max_staleness=1, sampler=sampler,
                                       learner=sampler_learner(seed=1), checkpointer=checkpointer)
    assert syncs[:3] == [2, 3, 4] and resumed.iteration == 4 and len(history) == 2
    assert [seed for _, seed, _ in sampler.calls][:2] == [
        round_seed(0, saved["data_position"]), round_seed(0, saved["data_position"] + 2)
    ]


class ReadyInOrderSplitWorld(SplitWorld):
    """tests/rl/test_loop.py's SplitWorld scored as asyncio tasks that never wait, so the pipeline's groups become
    ready in the order they were sampled."""

    async def score_async(self, questions, completions, contexts, sample_ids):
        return self.score(questions, completions, contexts, sample_ids)


def pipelined_backfill(world, groups: int, max_rounds: int, iterations: int):
    """A model of the batches a pipelined backfill builds from groups that become ready in sampling order and are
    never stale: each iteration takes the stream's next groups until `groups` of them differ or it has taken
    `groups * max_rounds`; its batch is the first differing ones, then the earliest agreeing ones
    (`backfilled_groups`); the groups it takes but leaves out are gone. Per iteration: the batch's questions, whether
    each group trains, the groups taken per batch group and the mean reward of every group taken."""
    stream = np.asarray(question_order(world.num_questions, 0, 0, groups * max_rounds * iterations))
    position, batches = 0, []
    for _ in range(iterations):
        window = stream[position : position + groups * max_rounds]
        differ = np.asarray([q not in world.agreeing for q in window])
        enough = np.flatnonzero(np.cumsum(differ) == groups)
        taken = int(enough[0]) + 1 if enough.size else len(window)
        chosen = [index for _, index in backfilled_groups([differ[:taken].tolist()], groups)]
        batches.append((window[chosen], differ[chosen], taken / groups,
                        float(np.where(differ[:taken], 0.5, 1.0).mean())))
        position += taken
    return batches


def test_pipelined_backfill_builds_the_batches_its_model_predicts():
    world, learner, sampler = ReadyInOrderSplitWorld(), sampler_learner(), VersionedSampler()
    loop = TrainingLoop(
        # Slots for far more groups than an iteration takes, so that none is ever stale.
        LoopConfig(iterations=6, questions_per_iteration=2, group_size=4, length_buckets=(16,), max_staleness=20,
                   dynamic_sampling="backfill", max_sampling_rounds=3, checkpoint_every=0),
        learner=learner, sampler=sampler, sampling_params=SamplingParams(max_new_tokens=3),
        weight_sync=lambda model, version: sampler.sync(model, version), environment=world, pad_id=0,
    )
    history = loop.run()
    expected = pipelined_backfill(world, groups=2, max_rounds=3, iterations=6)
    assert any(ratio == 3 for _, _, ratio, _ in expected) and any(ratio < 3 for _, _, ratio, _ in expected)
    assert any(not trains.all() for _, trains, _, _ in expected), "the model should cover a batch filled up"
    for batch, scalars, (questions, trains, oversampling, reward) in zip(learner.batches, history, expected,
                                                                          strict=True):
        assert batch.batch_size == 8, "the batch keeps its row count"
        np.testing.assert_array_equal(np.asarray(batch.tokens)[::4, batch.completion_start - 1] - 3, questions)
        np.testing.assert_array_equal(np.asarray(batch.loss_mask)[::4].any(axis=1), trains)
        assert scalars["dynamic_sampling/oversampling"] == oversampling
        assert scalars["dynamic_sampling/dropped_groups"] == (~trains).sum()
        assert scalars["reward/mean"] == pytest.approx(reward), "every group taken, the ones left out too"
        assert scalars["async/rows_dropped"] == 0
