"""Every flagfile shipped in launch/configs/ parses against the flags of `launch.train` and `launch.sft` (a renamed
flag breaks it): a training flagfile and a `launch.sft` one (one that sets no --iterations)."""

from __future__ import annotations

import pathlib
import re

import pytest
from absl import flags
from absl.testing import flagsaver

from env.optimum import best_fixed_workflow, expected_reward, workflow_shapes
from env.worlds import build_world, synthetic_skills_and_weights

# Every launcher is imported: importing one (for its functions, as tests do) must not make a flag of its own
# required in other programs' parses of the global FLAGS.
from launch import benchmark, sft, sglang_servers, train  # noqa: F401  (train and sft define the flagfiles' flags)
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import teacher as teacher_flags

CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[2] / "launch" / "configs"
CONFIGS = sorted(CONFIGS_DIR.glob("*.cfg"))


def _settings(path: pathlib.Path) -> dict[str, str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return {name: value for name, _, value in (line[2:].partition("=") for line in lines if line.startswith("--"))}


def test_the_shipped_flagfiles_are_found():
    assert {path.name for path in CONFIGS} >= {
        "paper.cfg", "quickstart.cfg", "synthetic.cfg", "replay_routerdc.cfg", "serve_local.cfg", "workflows.cfg",
        "cost_aware.cfg", "replay_rl.cfg",
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_a_shipped_flagfile_parses_and_sets_its_values(path):
    settings = _settings(path)
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={path}"])
        assert flags.FLAGS["world"].value == settings["world"]
        assert flags.FLAGS["logdir"].value == settings["logdir"]
        if "iterations" in settings:  # a launch.train flagfile
            assert flags.FLAGS["iterations"].value == int(settings["iterations"])
        else:  # launch.sft's: a warm-start alone
            assert flags.FLAGS["warm_start_steps"].value == int(settings["warm_start_steps"])


def test_the_workflows_flagfile_states_its_worlds_exact_optimum_and_starts_from_a_uniform_shape():
    """workflows.cfg's header quotes the best fixed workflow's exact expected reward; recomputed here from the world
    its flags build. That workflow has several steps, the last reading the others, and no two-step workflow comes
    within 95% of it, so the goal needs the third step."""
    path = CONFIGS_DIR / "workflows.cfg"
    header = " ".join(line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#"))
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={path}"])
        spec = environment_flags.from_flags()
        teacher = teacher_flags.from_flags()
    world = build_world(spec.world, spec.config.reward, spec.config.max_steps)
    skills, weights = synthetic_skills_and_weights(spec.world, world.tasks)
    answer_model, reward_config = spec.world.answer_model, spec.config.reward
    best = best_fixed_workflow(skills, weights, answer_model, reward_config, spec.config.max_steps)
    stated = re.search(r"the best fixed workflow is .*?(\d\.\d{3})", header)
    assert stated and float(stated.group(1)) == round(best.expected_reward, 3)
    assert len(best.workflow.steps) >= 2 and best.workflow.final_step_reads_every_step
    two_steps = max(expected_reward(w, skills, weights, answer_model, reward_config) for w in workflow_shapes(3, 2))
    assert two_steps < 0.95 * best.expected_reward
    assert teacher.teacher == "templates" and teacher.templates == ("uniform_shape",)


def test_the_replay_rl_flagfile_learns_every_route_from_rl_on_the_replay_recipes_files():
    """replay_rl.cfg trains and evaluates on replay_routerdc.cfg's files, and its warm-start is the templates
    teacher (uniformly drawn workers), never one that reads grades (the world and rollouts teachers)."""
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={CONFIGS_DIR / 'replay_routerdc.cfg'}"])
        recipe_files = (flags.FLAGS["tasks"].value, flags.FLAGS["eval_tasks"].value)
    with flagsaver.flagsaver():
        flags.FLAGS(["train", f"--flagfile={CONFIGS_DIR / 'replay_rl.cfg'}"])
        teacher = teacher_flags.from_flags()
        assert (flags.FLAGS["tasks"].value, flags.FLAGS["eval_tasks"].value) == recipe_files
        assert flags.FLAGS["warm_start_steps"].value > 0 and flags.FLAGS["iterations"].value > 0
        assert flags.FLAGS["expected_grades"].value and flags.FLAGS["max_workflow_steps"].value == 1
    assert teacher.teacher == "templates" and teacher.templates == ("single",) and teacher.reasoning == "template"
