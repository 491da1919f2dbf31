"""The Conductor's transforms and terms as the training loop runs them (`launch` binds them to flags), on the fake
world and sampler of tests/rl/test_loop.py with its choices named `ROUTE`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flax import nnx

import conductor.losses  # noqa: F401  (registers the terms; conductor.advantages, below, the transforms)
from conductor.advantages import ROUTE
from models.config import ModelConfig
from models.transformer import Transformer
from rl.advantages import TransformConfig
from rl.auxiliary import TermConfig
from rl.learner import LearnerConfig
from rl.loop import QUESTION_LABEL
from rl.losses import LossConfig
from tests.rl.helpers import RecordingLearner, SeededSampler
from tests.rl.test_loop import ParityWorld, first_completion_tokens, make_loop
from tests.tiny_models import tiny_config


def test_balanced_routes_leave_every_route_a_zero_advantage_sum_in_each_batch():
    world = ParityWorld(choices=3, choice_name=ROUTE)
    balance = (TransformConfig("balance_routes", {"fraction": 1.0}),)
    loop, _ = make_loop(world, iterations=4, advantage_transforms=balance)
    loop.run()
    moved = 0
    for batch in loop.learner.batches:
        values = np.asarray(batch.advantages)[:, batch.completion_start]
        routes = first_completion_tokens(batch) % 3
        moved += int(np.any(values != 0))
        for route in np.unique(routes):
            assert values[routes == route].sum() == pytest.approx(0.0, abs=1e-5)
    assert moved > 0, "balancing left no advantage at all"


def test_pooled_routes_give_every_completion_of_a_task_and_route_one_advantage():
    world = ParityWorld(num_questions=6, choices=3, choice_name=ROUTE, question_labels=("x", "x", "x", "y", "y", "y"))
    pool = (TransformConfig("pool_routes", {"fraction": 1.0}),)
    loop, _ = make_loop(world, iterations=4, stratify_questions=True, advantage_transforms=pool)
    loop.run()
    pooled = 0
    for batch in loop.learner.batches:
        values = np.asarray(batch.advantages)[:, batch.completion_start]
        routes = first_completion_tokens(batch) % 3
        questions = np.asarray(batch.tokens)[:, batch.completion_start - 1] - 3
        row_tasks = np.asarray([world.question_labels[q] for q in questions])
        for label in ("x", "y"):
            for route in np.unique(routes[row_tasks == label]):
                shared = values[(row_tasks == label) & (routes == route)]
                np.testing.assert_allclose(shared, shared[0], atol=1e-6)
                pooled += int(shared.size > 1 and shared[0] != 0)
    assert pooled > 0, "no task had a route taken twice with a non-zero advantage"
    unlabelled, _ = make_loop(ParityWorld(choice_name=ROUTE), advantage_transforms=pool)
    with pytest.raises(ValueError, match="pool_routes needs an environment with question labels"):
        unlabelled.run()


def test_inverse_propensity_route_weighting_scales_the_route_tokens_advantage_alone():
    loop, _ = make_loop(ParityWorld(choices=3, choice_name=ROUTE), iterations=3,
                        sampler=SeededSampler(varied_logprobs=True),
                        advantage_transforms=(TransformConfig("route_propensity", {"cap": 2.0}),))
    history = loop.run()
    reweighted = 0
    for batch in loop.learner.batches:
        values, start = np.asarray(batch.advantages), batch.completion_start
        # The route is decided by the first completion token; the later ones keep the sequence's advantage.
        sequence = values[:, start + 1]
        np.testing.assert_array_equal(values[:, start + 2], sequence)
        inverse = np.exp(-np.asarray(batch.sampler_logprobs, dtype=np.float64)[:, start])
        np.testing.assert_allclose(values[:, start], sequence * np.minimum(2.0, inverse / inverse.mean()), rtol=1e-5)
        reweighted += int(np.any(np.abs(values[:, start] - sequence) > 1e-6))
    assert reweighted > 0, "no route token's advantage moved"
    assert all(0.0 < h["advantage/route_weight_max"] <= 2.0 for h in history)


class RoutedAtTheSecondToken(ParityWorld):
    """The route is written by the second completion token, when it is not a multiple of 3 (else no route)."""

    def score(self, questions, completions, contexts, sample_ids):
        rollouts = super().score(questions, completions, contexts, sample_ids)
        return [
            dataclasses.replace(
                rollout, marked_tokens={ROUTE: (1,) if len(completion) > 1 and completion[1] % 3 else ()}
            )
            for rollout, completion in zip(rollouts, completions)
        ]


def test_with_the_decorrelation_term_each_row_reaches_the_learner_with_its_task_and_route_token():
    world = RoutedAtTheSecondToken(num_questions=6, question_labels=("y", "x", "z", "x", "y", "z"))
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))
    loss = LossConfig(auxiliary_terms=(TermConfig("decorrelation", 0.5),))
    learner = RecordingLearner(model, LearnerConfig(loss=loss))
    loop, _ = make_loop(world, iterations=3, learner=learner, stratify_questions=True)
    history = loop.run()
    routed = unrouted = 0
    for batch in learner.batches:
        questions = np.asarray(batch.tokens)[:, batch.completion_start - 1] - 3
        second = np.asarray(batch.tokens)[:, batch.completion_start + 1]
        has_route = np.asarray(batch.loss_mask).sum(axis=1) > 1
        has_route &= second % 3 != 0
        np.testing.assert_array_equal(
            batch.row_labels[QUESTION_LABEL], ["xyz".index(world.question_labels[q]) for q in questions]
        )
        np.testing.assert_array_equal(batch.token_positions[ROUTE], np.where(has_route, 1, -1))
        routed, unrouted = routed + int(has_route.sum()), unrouted + int((~has_route).sum())
    assert routed > 0 and unrouted > 0
    assert all(np.isfinite(h["learner/state_overlap"]) for h in history)
    with pytest.raises(ValueError, match="row label 'question' needs an environment with question_labels"):
        make_loop(RoutedAtTheSecondToken(), learner=learner)


def test_the_route_entropy_bonus_reads_each_routed_rows_route_token_without_question_labels():
    model = Transformer(ModelConfig.from_hf(tiny_config("llama")), rngs=nnx.Rngs(0))
    term = TermConfig("route_entropy", 0.1, options={"token_ids": (3, 4, 5)})
    learner = RecordingLearner(model, LearnerConfig(loss=LossConfig(auxiliary_terms=(term,))))
    loop, _ = make_loop(RoutedAtTheSecondToken(num_questions=6), iterations=2, learner=learner)
    history = loop.run()
    for batch in learner.batches:
        second = np.asarray(batch.tokens)[:, batch.completion_start + 1]
        has_route = (np.asarray(batch.loss_mask).sum(axis=1) > 1) & (second % 3 != 0)
        assert batch.row_labels == {}
        np.testing.assert_array_equal(batch.token_positions[ROUTE], np.where(has_route, 1, -1))
    assert all(0.0 < h["learner/route_entropy"] for h in history)
