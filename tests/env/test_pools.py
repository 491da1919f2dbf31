"""Offered pools (`env.pools`): the prompt lists the offered model ids alone, an id means the same worker in every
pool, a workflow naming an id not offered is malformed, and the zeroeval world's training pools never include a
held-out one."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from env import frontier, pools
from env.gym_env import ConductorEnv, EnvConfig
from env.tasks import data_files
from env.tasks.base import Task
from env.tasks.graders import grade_exact
from env.workers.base import WorkerReply
from env.workflow import Step, Workflow
from env.worlds import World, ZeroEvalWorldConfig, build_world, zeroeval_heldout_pools
from tests.env.helpers import ScriptedWorker, exact_task

TEAM = data_files.team_root() / "zeroeval"


def test_an_offer_records_the_pool_sorted_and_keeps_the_question():
    task = pools.offer(exact_task(), (3, 0, 7), "p")
    assert task.question == exact_task().question == "What is 6 * 7?"
    assert pools.offered_pool(task) == (0, 3, 7) and task.metadata["pool_name"] == "p"
    assert (task.gold, task.task_label) == ("42", "math")
    assert pools.offered_ids(task, 16) == (0, 3, 7) and pools.offered_ids(exact_task(), 4) == (0, 1, 2, 3)
    for bad in ((), (1, 1), (-1, 2)):
        with pytest.raises(ValueError, match="distinct ints >= 0"):
            pools.offer(exact_task(), bad)


def test_a_workflow_over_a_pools_positions_names_its_model_ids_and_back():
    flow = Workflow(steps=(Step(0, "Solve.", ()), Step(2, "Check.", "all"), Step(1, "Answer.", (0, 1))), reasoning="r")
    ids = pools.named(flow, (3, 7, 12))
    assert [step.worker for step in ids.steps] == [3, 12, 7]
    assert [(s.instruction, s.access) for s in ids.steps] == [(s.instruction, s.access) for s in flow.steps]
    assert ids.reasoning == "r" and pools.positions(ids, (3, 7, 12)) == flow
    with pytest.raises(ValueError, match=r"model ids \[12\] are not in the pool \(3, 7\)"):
        pools.positions(ids, (3, 7))


def test_random_pools_are_distinct_sized_within_the_range_avoid_the_excluded_and_repeat_from_their_seed():
    excluded = [(0, 1, 2)]
    drawn = pools.random_pools(6, (2, 4), 30, "s", exclude=excluded)
    assert len(set(drawn)) == 30 and all(2 <= len(p) <= 4 and p == tuple(sorted(p)) for p in drawn)
    assert (0, 1, 2) not in drawn
    assert drawn == pools.random_pools(6, (2, 4), 30, "s", exclude=excluded)
    assert drawn != pools.random_pools(6, (2, 4), 30, "t", exclude=excluded)
    every = [c for k in (2, 3) for c in itertools.combinations(range(4), k)]  # all 10 pools of 2-3 of 4 workers
    assert len(pools.random_pools(4, (2, 3), 2, "s", exclude=every[:8])) == 2  # the last two left
    with pytest.raises(ValueError, match="every pool"):
        pools.random_pools(4, (2, 3), 3, "s", exclude=every[:8])
    with pytest.raises(ValueError, match="every pool"):
        pools.draw_pool(4, (2, 3), __import__("random").Random(0), exclude=every)
    with pytest.raises(ValueError, match="pool sizes"):
        pools.random_pools(4, (3, 5), 1, "s")


def test_an_offered_id_means_the_same_worker_in_every_pool_and_an_id_not_offered_is_malformed():
    workers = [ScriptedWorker(f"w{i}", answer="42") for i in range(5)]
    tasks = [pools.offer(exact_task(), (4, 1)), pools.offer(exact_task(), (1, 2, 3))]
    world = World("offered", workers, tasks)
    env = ConductorEnv(world, EnvConfig(max_steps=2))
    prompt = env.observation(tasks[0])["messages"][1]["content"]
    listed = [line for line in prompt.splitlines() if line.startswith("- Model id ")]
    assert listed == ["- Model id 1", "- Model id 4"] and "(one of 1, 4)" in prompt

    def workflow(worker: int) -> str:
        return f'Answer it.\nmodel_id = [{worker}]\nsubtasks = ["Answer."]\naccess_list = [[]]\n'

    for task in tasks:  # id 1 is worker 1 in both pools
        right = asyncio.run(env.score(task, workflow(1)))
        assert right.parse_error is None and right.grade == 1.0
    assert [len(w.calls) for w in workers] == [0, 2, 0, 0, 0]
    wrong = asyncio.run(env.score(tasks[0], workflow(2)))
    assert wrong.workflow is None and wrong.parse_error == "model_id[0] is 2, not one of the offered ids 1, 4"
    assert asyncio.run(env.score(tasks[1], workflow(2))).grade == 1.0
    env.close()


class _Recorded:
    def __init__(self, name: str, answers: dict[str, str], cost: float) -> None:
        self.name, self.model, self.answers, self.cost = name, name, answers, cost

    def reply(self, task):
        return WorkerReply(f"<answer>{self.answers[task.id.split('@')[0]]}</answer>", 1, 1, self.cost, 0.0)


def test_pool_figures_give_each_pool_its_own_baselines_against_numpy():
    # Three models: m0 right on every question, m1 on the a-questions, m2 on none; costs 3, 1 and 0.5.
    questions = [Task(f"q{i}", label, "?", "right", grade_exact) for i, label in enumerate("aabb")]
    answers = [{"q0": "right", "q1": "right", "q2": "right", "q3": "right"},
               {"q0": "right", "q1": "right", "q2": "no", "q3": "no"}, dict.fromkeys(["q0", "q1", "q2", "q3"], "no")]
    workers = [_Recorded(f"m{m}", answers[m], cost) for m, cost in enumerate((3.0, 1.0, 0.5))]
    offered = [pools.offer(q, (1, 2), "cheap") for q in questions] + [
        pools.offer(Task(f"{q.id}@x", q.task_label, q.question, q.gold, q.grader), (0, 1), "mixed") for q in questions
    ]
    correct = [1.0, 1.0, 0.0, 0.0] + [1.0, 0.0, 1.0, 1.0]
    cost = [1.0, 1.0, 0.5, 0.5] + [1.0, 1.0, 3.0, 3.0]
    figures = frontier.offered_pool_figures(offered, workers, correct, cost)
    assert figures["accuracy"] == np.mean(correct) and figures["cost_usd_per_question"] == np.mean(cost)
    cheap, mixed = figures["pools"]["cheap"], figures["pools"]["mixed"]
    assert (cheap["models"], cheap["questions"], mixed["models"]) == (["m1", "m2"], 4, ["m0", "m1"])
    # cheap pool: a to m1 (2 right at 1), b: neither right, the cheaper m2: 2 of 4 at (1 + 1 + 0.5 + 0.5) / 4
    assert cheap["baselines"]["per_task_best"] == {"route": "a: m1, b: m2", "accuracy": 0.5,
                                                   "cost_usd_per_question": 0.75}
    assert cheap["to_per_task_best"] == 1.0
    # mixed pool: a to m1 (right, cheaper), b to m0: every question right; the method got 3 of 4
    assert mixed["baselines"]["per_task_best"]["accuracy"] == 1.0 and mixed["to_per_task_best"] == 0.75
    assert figures["pools_at_share"] == 1
    with pytest.raises(ValueError, match="2 questions but 1 answers"):
        frontier.offered_pool_figures(offered[:2], workers, [1.0], [1.0])


def test_the_zeroeval_held_out_pools_are_open_closed_and_random_ones_fixed_by_the_split_seed():
    config = ZeroEvalWorldConfig()
    heldout = zeroeval_heldout_pools(config)
    assert heldout["open"] == tuple(range(9, 16)) and heldout["closed"] == tuple(range(9))
    random_ones = [heldout[f"random-{i}"] for i in range(20)]
    assert len(heldout) == 22 and len(set(random_ones)) == 20 and all(3 <= len(p) <= 9 for p in random_ones)
    assert zeroeval_heldout_pools(ZeroEvalWorldConfig(seed=5)) == heldout
    assert zeroeval_heldout_pools(ZeroEvalWorldConfig(split_seed=1)) != heldout
    with pytest.raises(ValueError, match="zeroeval pools must be"):
        ZeroEvalWorldConfig(pools="random-20")
    with pytest.raises(ValueError, match="pool_sizes"):
        ZeroEvalWorldConfig(pools="train", pool_sizes=(3, 17))


@pytest.mark.skipif(not TEAM.is_dir(), reason="no team copy of the zeroeval files on this machine")
def test_zeroeval_training_questions_are_never_offered_a_held_out_pool_and_evaluation_rotates_through_them():
    config = ZeroEvalWorldConfig(pools="train", limit_per_task=60, data_dir=str(TEAM))
    heldout = set(zeroeval_heldout_pools(config).values())
    train = build_world(config)
    offered = [pools.offered_pool(task) for task in train.tasks]
    assert len(train.pool) == 16 and not heldout & set(offered)
    assert {len(p) for p in offered} == set(range(3, 10)) and len(set(offered)) > 150
    assert all(p == tuple(sorted(p)) for p in offered)
    first = train.tasks[0]
    assert not first.question.startswith("Models offered") and first.metadata["records"]
    evaluation = build_world(ZeroEvalWorldConfig(split="test", pools="heldout", limit_per_task=60, data_dir=str(TEAM)))
    names = [task.metadata["pool_name"] for task in evaluation.tasks]
    assert names[:3] == ["open", "closed", "random-0"] and set(names) == set(zeroeval_heldout_pools(config))
    closed = build_world(ZeroEvalWorldConfig(split="test", pools="closed", limit_per_task=5, data_dir=str(TEAM)))
    assert len(closed.pool) == 16 and {pools.offered_pool(t) for t in closed.tasks} == {tuple(range(9))}
    # Model id m is the world's model m in every pool: its recorded reply.
    first = closed.tasks[0]
    assert closed.pool[3].reply(first) == build_world(ZeroEvalWorldConfig(split="test", limit_per_task=5,
                                                                          data_dir=str(TEAM))).pool[3].reply(first)
