"""The template policies the warm-start imitates."""

import collections
import random

import pytest

from env.policies import DEFAULT_TEMPLATES, TEMPLATES, UNIFORM_SHAPE_MAX_STEPS, random_template
from env.workflow import parse_workflow, render_workflow


def test_uniform_shape_favours_no_size_worker_or_access_list():
    """12,000 draws over a pool of 3: each step count, each worker and each later step's access ("all" or nothing)
    within 4 standard errors of its uniform share."""
    rng = random.Random(0)
    draws = [random_template(3, rng, ("uniform_shape",)) for _ in range(12_000)]
    sizes = collections.Counter(len(workflow.steps) for workflow in draws)
    workers = collections.Counter(step.worker for workflow in draws for step in workflow.steps)
    later = [step.access for workflow in draws for step in workflow.steps[1:]]

    def assert_uniform(counts, values):
        total = sum(counts.values())
        share = 1 / len(values)
        assert set(counts) == set(values)
        for value in values:
            assert counts[value] / total == pytest.approx(share, abs=4 * (share * (1 - share) / total) ** 0.5)

    assert_uniform(sizes, range(1, UNIFORM_SHAPE_MAX_STEPS + 1))
    assert_uniform(workers, range(3))
    assert_uniform(collections.Counter(later), ["all", ()])
    assert all(workflow.steps[0].access == () for workflow in draws)


def test_uniform_shape_workflows_render_and_parse_back():
    rng = random.Random(1)
    for _ in range(200):
        workflow = random_template(4, rng, ("uniform_shape",))
        parsed = parse_workflow(render_workflow(workflow), pool=4, max_steps=UNIFORM_SHAPE_MAX_STEPS)
        assert [(s.worker, s.visible_steps(i)) for i, s in enumerate(parsed.steps)] == [
            (s.worker, s.visible_steps(i)) for i, s in enumerate(workflow.steps)
        ]


def test_the_default_mix_is_the_references_workflow_kinds():
    assert set(DEFAULT_TEMPLATES) < set(TEMPLATES) and "uniform_shape" not in DEFAULT_TEMPLATES
    rng = random.Random(2)
    sizes = {len(random_template(3, rng).steps) for _ in range(300)}
    assert sizes == {1, 3, 4}  # single, plan-solve-verify and fan-out of 2 or 3 plus an aggregator


def test_an_unknown_template_is_refused():
    with pytest.raises(ValueError, match="unknown templates"):
        random_template(3, random.Random(0), ("uniform",))
