"""A trained Conductor is sampled, in eval and serve, with the completion limit it was trained with."""

from __future__ import annotations

import pytest
from absl import flags
from absl.testing import flagsaver

from launch import common
from rollout.types import SamplingParams


pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def test_the_trained_limit_applies_unless_max_tokens_is_given(tmp_path):
    common.save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64))
    with flagsaver.flagsaver():
        flags.FLAGS(["eval"])
        assert common.conductor_sampling_params(tmp_path).max_new_tokens == 64
        assert common.conductor_sampling_params(tmp_path / "untrained").max_new_tokens == 1024  # the flag's default
        flags.FLAGS(["eval", "--max_tokens=32", "--temperature=0.5"])
        params = common.conductor_sampling_params(tmp_path)
    assert (params.max_new_tokens, params.temperature) == (32, 0.5)
    assert not flags.FLAGS["max_tokens"].present  # flagsaver restored the command line
