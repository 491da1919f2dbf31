"""launch/configs/orchestration.cfg builds the orchestration world its header describes, with the reward
tests/env/test_orchestration.py checks, chooses its final weights on the validation split whose exact figures the
header quotes."""

import pathlib
import re

import pytest
from absl import flags
from absl.testing import flagsaver

from env.orchestration import OrchestrationWorldConfig
from env.worlds import build_world
from launch import train  # noqa: F401  (defines the flagfile's flags)
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import teacher as teacher_flags
from tests.env.test_orchestration import RECIPE_REWARD

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "launch" / "configs" / "orchestration.cfg"


def test_the_recipe_builds_the_orchestration_world_and_quotes_its_exact_validation_figures():
    header = " ".join(line[1:].strip() for line in CONFIG.read_text().splitlines() if line.startswith("#"))
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={CONFIG}"])
        assert flags.FLAGS["eval_tasks"].value == [], "the test split is the reporting round's, on its command line"
        assert flags.FLAGS["selection_score"].value == "gap_closed"
        spec = environment_flags.from_flags(flags.FLAGS["selection_tasks"].value)
        train_spec = environment_flags.from_flags()
        teacher = teacher_flags.from_flags()
        learning_rate = flags.FLAGS["learning_rate"].value
        assert flags.FLAGS["iterations"].value * flags.FLAGS["questions_per_iteration"].value * flags.FLAGS[
            "group_size"].value == 1920  # the bandit's budget the header names  # fmt: skip
    assert isinstance(spec.world, OrchestrationWorldConfig)
    assert (spec.world.split, train_spec.world.split) == ("validation", "train")
    assert spec.config.reward == RECIPE_REWARD
    assert spec.config.max_steps == 3 and spec.config.expected_grades
    # The recipe the header states: the compact prompt, warm-started on each training question's optimum, then GRPO
    # at the learning rate the header names.
    assert (spec.config.conductor_prompt, teacher.teacher) == ("compact", "optimum")
    assert learning_rate == 1e-4 and "GRPO at a learning rate of 1e-4," in header
    world = build_world(spec.world, spec.config.reward, spec.config.max_steps)
    figures = world.orchestration.figures(world.tasks)
    quoted = re.search(r"per pool ([\d.]+), the best per \(task, pool\) ([\d.]+), the per-question optimum ([\d.]+)",
                       header)  # fmt: skip
    assert quoted is not None
    assert [float(value) for value in quoted.groups()] == pytest.approx(
        [figures["best_fixed_reward"], figures["per_task_reward"], figures["optimum_reward"]], abs=5e-5
    )
    assert figures["heldout_pools"]
