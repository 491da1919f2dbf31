"""A trained Conductor is sampled, in eval and serve, with the completion limit and temperature it was trained
with, and prompted as it was trained."""

from __future__ import annotations

import pytest
from absl import flags
from absl.testing import flagsaver

from conductor.model import save_trained_sampling, trained_sampling
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import renamed  # noqa: F401  (defines the old names)
from launch.flag_groups import sampling as sampling_flags
from rollout.types import SamplingParams


pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def test_the_trained_limit_and_temperature_apply_unless_given_on_the_command_line(tmp_path):
    save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64), "full")
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
    save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64), "full")
    with flagsaver.flagsaver():
        flags.FLAGS(["eval"])
        greedy = sampling_flags.from_flags(trained_conductor=tmp_path, default_temperature=0.0)
        flags.FLAGS(["eval", "--temperature=0.5"])
        given = sampling_flags.from_flags(trained_conductor=tmp_path, default_temperature=0.0)
        with pytest.raises(flags.IllegalFlagValueError, match="--conductor_temperature is renamed to --temperature"):
            flags.FLAGS(["eval", "--conductor_temperature=0"])
    assert (greedy.max_new_tokens, greedy.temperature) == (64, 0.0)
    assert (given.max_new_tokens, given.temperature) == (64, 0.5)


def test_the_trained_prompt_applies_unless_given_on_the_command_line_and_old_records_read_as_full(tmp_path):
    save_trained_sampling(tmp_path, SamplingParams(temperature=0.7, max_new_tokens=64), "compact")
    record = trained_sampling(tmp_path)
    assert record == {"max_new_tokens": 64, "temperature": 0.7, "conductor_prompt": "compact"}
    with flagsaver.flagsaver():
        flags.FLAGS(["eval"])
        trained = environment_flags.from_flags(trained=record).config.conductor_prompt
        untrained = environment_flags.from_flags().config.conductor_prompt
        before_the_flag = environment_flags.from_flags(trained={"max_new_tokens": 64}).config.conductor_prompt
        flags.FLAGS(["eval", "--conductor_prompt=full"])
        given = environment_flags.from_flags(trained=record).config.conductor_prompt
        with pytest.raises(flags.IllegalFlagValueError, match="conductor_prompt"):
            flags.FLAGS(["eval", "--conductor_prompt=short"])
    assert (trained, untrained, before_the_flag, given) == ("compact", "full", "full", "full")
