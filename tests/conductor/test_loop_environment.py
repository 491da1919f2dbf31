"""`conductor.loop_environment.TokenizedConductorEnv` scores Conductor completions through the env and reports per-rollout metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from conductor.advantages import ROUTE
from conductor.loop_environment import TokenizedConductorEnv, completion_text, worker_id_tokens
from env.executor import ExecutorConfig
from env.gym_env import ConductorEnv, EnvConfig
from env.workflow import Step, Workflow
from env.worlds import SyntheticWorldConfig, build_world
from models import zoo
from models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def world():
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    return TokenizedConductorEnv(ConductorEnv(build_world(SyntheticWorldConfig(num_workers=4, num_tasks=8))), tokenizer)


def _completion(world, worker: int) -> list[int]:
    workflow = Workflow(steps=(Step(worker, "Solve the question."),), reasoning="One step.")
    return world.tokenizer.encode(completion_text(workflow), add_special_tokens=False)


def test_oracle_route_says_whether_the_final_worker_is_the_optimal_plans(world):
    question = 2
    best = world.env.world.oracle.plans[world.tasks[question].task_label].final
    other = (best + 1) % 4
    completions = [_completion(world, best), _completion(world, other), world.tokenizer.encode("no workflow")]
    rollouts = world.score([question] * 3, completions, [None] * 3, [0, 1, 2])
    assert [r.metrics["oracle_route"] for r in rollouts] == [1.0, 0.0, 0.0]
    assert [r.metrics["valid_format"] for r in rollouts] == [1.0, 1.0, 0.0]
    assert rollouts[0].labels[ROUTE] == (best,) and rollouts[1].labels[ROUTE] == (other,)
    assert rollouts[0].record == {"workers": [best]} and rollouts[1].histograms == {"workers_chosen": (other,)}


def test_scoring_on_an_event_loop_gives_score_s_rollouts_and_runs_groups_side_by_side(world):
    # A seeded executor fixes each call's outcome by its content, so the two scorings must agree whatever order the
    # event loop runs the calls in (unseeded, each draw is fresh and they agree only by chance).
    slow = TokenizedConductorEnv(
        ConductorEnv(build_world(SyntheticWorldConfig(num_workers=4, num_tasks=8, latency_s=0.3)),
                     EnvConfig(executor=ExecutorConfig(seed=0))),
        world.tokenizer,
    )
    completions = [_completion(slow, worker) for worker in range(4)] + [slow.tokenizer.encode("no workflow")]
    expected = slow.score([2] * 5, completions, None, range(5))

    async def two_groups():
        return await asyncio.gather(slow.score_async([2] * 5, completions, None, range(5)),
                                    slow.score_async([3] * 5, completions, None, range(5, 10)))

    started = time.perf_counter()
    same, other = asyncio.run(two_groups())
    assert time.perf_counter() - started < 0.55  # each group's calls take 0.3 s; one after the other, 0.6 s
    assert [(r.reward, r.metrics, r.labels, r.record) for r in same] == [
        (r.reward, r.metrics, r.labels, r.record) for r in expected
    ]
    assert len(other) == 5 and other[4].metrics["valid_format"] == 0.0


def test_a_recursion_round_that_keeps_its_answer_is_routed_as_the_round_that_gave_it(world):
    question = 2
    best = world.env.world.oracle.plans[world.tasks[question].task_label].final
    other = (best + 1) % 4
    first = world.score([question] * 2, [_completion(world, best), _completion(world, other)], [None] * 2, [0, 1])
    keep = world.tokenizer.encode(completion_text(Workflow(steps=())), add_special_tokens=False)
    kept = world.score([question] * 2, [keep, keep], [r.context for r in first], [2, 3])
    assert [r.metrics["valid_format"] for r in kept] == [1.0, 1.0] and [r.labels[ROUTE] for r in kept] == [None, None]
    assert [r.metrics["oracle_route"] for r in kept] == [1.0, 0.0]


@pytest.mark.parametrize(
    "accesses, multi_step_reading",
    [(((),), 0.0), (((), ()), 0.0), (((), "all"), 1.0), (((), (), "all"), 1.0), (((), "all", ()), 0.0)],
)
def test_multi_step_reading_marks_several_steps_whose_last_reads_every_earlier_one(world, accesses, multi_step_reading):
    workflow = Workflow(steps=tuple(Step(0, "Solve the question.", access) for access in accesses))
    completion = world.tokenizer.encode(completion_text(workflow), add_special_tokens=False)
    [rollout] = world.score([0], [completion], [None], [0])
    assert rollout.metrics["multi_step_reading"] == multi_step_reading


def test_an_unparsed_completion_is_not_multi_step_reading(world):
    [rollout] = world.score([0], [world.tokenizer.encode("no workflow")], [None], [0])
    assert rollout.metrics["multi_step_reading"] == 0.0


@pytest.mark.parametrize(
    "text, ids",
    [
        ('Plan first.\n\nmodel_id = [3, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], "all"]', ("3", "1")),
        ('{"model_id": [2], "subtasks": ["a"], "access_list": [[]]}', ("2",)),
        ("model_id = [10, 0, 7]\nsubtasks = ['a', 'b', 'c']", ("10", "0", "7")),
    ],
)
def test_worker_id_tokens_are_the_tokens_that_write_each_id(world, text, ids):
    tokenizer = world.tokenizer
    tokens = tokenizer.encode(text, add_special_tokens=False)
    indices = worker_id_tokens(tokenizer, tokens)
    assert len(indices) == len(ids)
    offset = text.index("[")
    for index, worker_id in zip(indices, ids):
        offset = text.index(worker_id, offset)  # where the id's first digit is in the text
        # The text before the token ends before the id; the token writes its first digit.
        assert len(tokenizer.decode(tokens[:index])) <= offset < len(tokenizer.decode(tokens[: index + 1]))
        offset += len(worker_id)


def test_worker_id_tokens_are_empty_without_a_model_id_list(world):
    tokenizer = world.tokenizer
    assert worker_id_tokens(tokenizer, tokenizer.encode("no workflow here", add_special_tokens=False)) == ()
    assert worker_id_tokens(tokenizer, tokenizer.encode("model_id = [3, 1", add_special_tokens=False)) == ()


def test_scored_rollouts_name_the_token_of_each_worker_id(world):
    workflow = Workflow(steps=(Step(2, "Solve it."), Step(0, "Check it.", "all")), reasoning="Two steps.")
    completion = world.tokenizer.encode(completion_text(workflow), add_special_tokens=False)
    rollout, unparsed = world.score([0, 0], [completion, world.tokenizer.encode("no workflow")], [None] * 2, [0, 1])
    assert rollout.labels[ROUTE] == (2, 0) and len(rollout.marked_tokens[ROUTE]) == 2
    assert [world.tokenizer.decode([completion[i]]).strip() for i in rollout.marked_tokens[ROUTE]] == ["2", "0"]
    assert unparsed.labels[ROUTE] is None and tuple(unparsed.marked_tokens[ROUTE]) == ()


def test_route_token_ids_are_the_tokens_that_write_each_workers_id_where_a_workflow_names_it(world):
    assert [world.tokenizer.decode([token]) for token in world.route_token_ids] == ["0", "1", "2", "3"]
    for worker in range(4):
        completion = _completion(world, worker)
        [route] = worker_id_tokens(world.tokenizer, completion)
        assert completion[route] == world.route_token_ids[worker]


def test_route_token_ids_of_a_pool_past_ten_are_the_distinct_first_digits():
    tokenizer = load_tokenizer(zoo.smollm2_135m_instruct())
    env = TokenizedConductorEnv(ConductorEnv(build_world(SyntheticWorldConfig(num_workers=12, num_tasks=8))), tokenizer)
    assert [tokenizer.decode([token]) for token in env.route_token_ids] == [str(d) for d in range(10)]
