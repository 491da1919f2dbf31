"""Invalid-action masking end to end: a batch sampled under token masks trains on the log-probs of the masked policy,
the ones the sampler reported (`LoopConfig.mask_tokens`, `Trajectories.constraint_ids`)."""

from __future__ import annotations

import numpy as np
import pytest

from models import hf_io
from models.logprobs import ALL_BUT, ONLY, UNCONSTRAINED
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.trajectories import MIN_CONSTRAINT_WIDTH, build
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams, TokenConstraint
from tests.tiny_models import tiny_hf_model_dir

PROMPTS = [[5, 17, 33, 9], [100, 7]]


class EvenAfterOdd:
    """After a token of odd id only even tokens below 40; else anything but tokens 0-9."""

    def constraint(self, completion_ids):
        if completion_ids and completion_ids[-1] % 2:
            return TokenConstraint(tuple(range(0, 40, 2)), only=True)
        return TokenConstraint(tuple(range(10)), only=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_hf_model_dir(tmp_path_factory.mktemp("masked"), "qwen2", seed=0, num_hidden_layers=1)


def _batch(groups, masked: bool):
    completions = [c for group in groups for c in group]
    return build(
        [c.prompt_ids for c in completions], [c.completion_ids for c in completions],
        [c.logprobs for c in completions], np.array([1.0, -1.0, 0.5, -0.5]),
        [i for i, group in enumerate(groups) for _ in group], pad_id=0, length_buckets=(32,),
        token_constraints=[c.constraints for c in completions] if masked else None,
    )


def test_the_learner_scores_a_masked_sample_as_the_sampler_did_and_trains_on_it(model_dir):
    generator = TorchGenerator(model_dir)
    groups = generator.generate(PROMPTS, SamplingParams(temperature=2.0, max_new_tokens=8, seed=3), n=2,
                                token_masks=[EvenAfterOdd(), None])
    masked, unmasked = _batch(groups, True), _batch(groups, False)
    # The first prompt's rows carry their constraints, the second's none; the longest list (20 ids) padded to 32.
    assert masked.constraint_ids.shape == masked.tokens.shape + (32,) and MIN_CONSTRAINT_WIDTH < 32
    kinds = masked.constraint_kinds[:, masked.completion_start:]
    assert set(np.unique(kinds[:2][masked.loss_mask[:2, masked.completion_start:]])) <= {ONLY, ALL_BUT}
    assert (kinds[2:] == UNCONSTRAINED).all() and (kinds[:2] != UNCONSTRAINED).any()

    learner = Learner(hf_io.load(model_dir), LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-2, schedule="constant"), temperature=2.0))
    gap = np.abs(np.asarray(learner.logprobs(masked)) - masked.sampler_logprobs)[masked.loss_mask]
    unmasked_gap = np.abs(np.asarray(learner.logprobs(unmasked)) - unmasked.sampler_logprobs)[unmasked.loss_mask]
    assert gap.max() < 1e-4 and unmasked_gap.max() > 1e-2
    metrics = learner.update(masked)
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0


def test_build_refuses_constraints_that_do_not_match_the_completions():
    with pytest.raises(ValueError, match="2 prompts but 1 rows of token constraints"):
        build([[1], [2]], [[3], [4]], [[0.0], [0.0]], [0.0, 0.0], [0, 0], pad_id=0, token_constraints=[[None]])
    with pytest.raises(ValueError, match="row 0: 1 completion tokens but 2 constraints"):
        build([[1]], [[3]], [[0.0]], [0.0], [0], pad_id=0, token_constraints=[[None, None]])
