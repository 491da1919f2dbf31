"""The evaluation baselines of env.policies, written as workflows in the Conductor's format."""

import random

import pytest

from env import policies
from env.tasks.base import Task
from env.workflow import parse_workflow, render_workflow


def scored_task(scores):
    return Task(id="q", task_label="d", question="?", gold="g", grader=lambda text, gold: 0.0, metadata={"scores": scores})


def test_mixture_of_agents_layers_read_only_the_previous_layer_and_aggregate_last():
    workflow = policies.mixture_of_agents([0, 1, 2], aggregator=1, layers=2)
    assert [step.worker for step in workflow.steps] == [0, 1, 2, 0, 1, 2, 1]
    assert [step.visible_steps(i) for i, step in enumerate(workflow.steps)] == [
        (), (), (), (0, 1, 2), (0, 1, 2), (0, 1, 2), (3, 4, 5)
    ]
    assert workflow.steps[-1].instruction == policies.AGGREGATE
    # The fine-grained rendering parses back to the same steps once the step limit admits it.
    parsed = parse_workflow(render_workflow(workflow, "fine"), pool=3, max_steps=7, access_mode="fine")
    assert parsed.steps == workflow.steps


def test_one_layer_moa_is_proposers_then_an_aggregator_reading_them_all():
    workflow = policies.mixture_of_agents([2, 0], aggregator=0)
    assert [(s.worker, s.visible_steps(i)) for i, s in enumerate(workflow.steps)] == [(2, ()), (0, ()), (0, (0, 1))]


def test_self_reflection_revises_with_every_earlier_attempt_visible():
    workflow = policies.self_reflection(3, revisions=2)
    assert [step.worker for step in workflow.steps] == [3, 3, 3]
    assert [step.visible_steps(i) for i, step in enumerate(workflow.steps)] == [(), (0,), (0, 1)]
    assert policies.self_reflection(1, revisions=0).steps == policies.single(1).steps


def test_consensus_has_independent_samples_and_a_judge_reading_them_all():
    workflow = policies.consensus(1, samples=3, judge=0)
    assert [(s.worker, s.visible_steps(i)) for i, s in enumerate(workflow.steps)] == [
        (1, ()), (1, ()), (1, ()), (0, (0, 1, 2))
    ]
    assert workflow.steps[-1].instruction == policies.CONSENSUS


def test_random_routing_is_a_single_step_with_uniformly_drawn_workers():
    rng = random.Random(0)
    workers = [policies.random_routing(4, rng).steps for _ in range(4000)]
    assert all(len(steps) == 1 for steps in workers)
    counts = [sum(steps[0].worker == w for steps in workers) for w in range(4)]
    assert all(abs(count - 1000) < 4 * (4000 * 0.25 * 0.75) ** 0.5 for count in counts)


def test_oracle_routing_takes_the_best_recorded_model_and_breaks_ties_by_lowest_id():
    models = ["a", "b", "c"]
    assert policies.oracle_routing(scored_task({"a": 0.2, "b": 0.9, "c": 0.5}), models).steps[0].worker == 1
    assert policies.oracle_routing(scored_task({"a": 0.5, "b": 0.1, "c": 0.5}), models).steps[0].worker == 0


def test_bad_baseline_arguments_are_rejected():
    with pytest.raises(ValueError, match="proposer"):
        policies.mixture_of_agents([], 0)
    with pytest.raises(ValueError, match="layers"):
        policies.mixture_of_agents([0], 0, layers=0)
    with pytest.raises(ValueError, match="revisions"):
        policies.self_reflection(0, -1)
    with pytest.raises(ValueError, match="samples"):
        policies.consensus(0, 0)
    with pytest.raises(ValueError, match="pool_size"):
        policies.random_routing(0, random.Random(0))
    with pytest.raises(ValueError, match="no per-model scores"):
        policies.oracle_routing(Task("q", "d", "?", "g", lambda t, g: 0.0), ["a"])
    with pytest.raises(ValueError, match=r"no score for \['z'\]"):
        policies.oracle_routing(scored_task({"a": 1.0}), ["a", "z"])
