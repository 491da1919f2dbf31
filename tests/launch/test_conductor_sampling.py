"""A trained Conductor is sampled, in eval and serve, with the completion limit and temperature it was trained
with."""

from __future__ import annotations

import pytest
from absl import flags
from absl.testing import flagsaver

from conductor.model import save_trained_sampling
from launch.flag_groups import renamed  # noqa: F401  (defines the old names)
from launch.flag_groups import sampling as sampling_flags
from rollout.types import SamplingParams


pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def test_the_trained_limit_and_temperature_apply_unless_given_on_the_command_line(tmp_path):
    save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64))
    with flagsaver.flagsaver():
        flags.FLAGS(["eval"])
        trained = sampling_flags.from_flags(trained_conductor=tmp_path)
        untrained = sampling_flags.from_flags(trained_conductor=tmp_path / "untrained")
        flags.FLAGS(["eval", "--max_tokens=32"])
        only_limit = sampling_flags.from_flags(trained_conductor=tmp_path)
        flags.FLAGS(["eval", "--max_tokens=32", "--temperature=0.5"])
        both = sampling_flags.from_flags(trained_conductor=tmp_path)
    assert (trained.max_new_tokens, trained.temperature) == (64, 0.7)
    assert (untrained.max_new_tokens, untrained.temperature) == (1024, 1.0)  # the flags' defaults
    assert (only_limit.max_new_tokens, only_limit.temperature) == (32, 0.7)
    assert (both.max_new_tokens, both.temperature) == (32, 0.5)
    assert not flags.FLAGS["max_tokens"].present  # flagsaver restored the command line


def test_evaluation_decodes_greedily_unless_the_temperature_is_given_and_the_old_flag_is_refused(tmp_path):
    save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64))
    with flagsaver.flagsaver():
        flags.FLAGS(["eval"])
        greedy = sampling_flags.from_flags(trained_conductor=tmp_path, default_temperature=0.0)
        flags.FLAGS(["eval", "--temperature=0.5"])
        given = sampling_flags.from_flags(trained_conductor=tmp_path, default_temperature=0.0)
        with pytest.raises(flags.IllegalFlagValueError, match="--conductor_temperature is renamed to --temperature"):
            flags.FLAGS(["eval", "--conductor_temperature=0"])
    assert (greedy.max_new_tokens, greedy.temperature) == (64, 0.0)
    assert (given.max_new_tokens, given.temperature) == (64, 0.5)
