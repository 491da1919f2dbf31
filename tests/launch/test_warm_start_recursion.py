"""With recursion rounds the templates warm-start teaches the format of the recursion prompts too."""

from __future__ import annotations

import random

import pytest

from conductor import teachers
from conductor.loop_environment import TokenizedConductorEnv
from env.gym_env import ConductorEnv, EnvConfig
from env.prompts import CONDUCTOR_PREFIX
from env.workflow import parse_workflow
from env.worlds import SyntheticWorldConfig, build_world
from models import zoo
from models.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("parsed_flags")  # tests/launch/conftest.py


def _world(recursion_rounds: int) -> TokenizedConductorEnv:
    env = ConductorEnv(build_world(SyntheticWorldConfig(num_workers=4, num_tasks=20)),
                       EnvConfig(recursion_rounds=recursion_rounds))
    return TokenizedConductorEnv(env, load_tokenizer(zoo.smollm2_135m_instruct()))


@pytest.mark.parametrize("recursion_rounds", [0, 2])
def test_template_examples_cover_each_round_of_an_episode_uniformly(recursion_rounds):
    world = _world(recursion_rounds)
    first_prompts = {tuple(world.prompt_ids(q)) for q in range(world.num_questions)}
    examples = teachers.template_examples(world, 300, random.Random(0))
    assert len(examples) == 300
    later = [e for e in examples if e.prompt_ids not in first_prompts]
    # Each example's round is one of the N + 1 an episode has, drawn uniformly.
    assert len(later) / len(examples) == pytest.approx(recursion_rounds / (recursion_rounds + 1), abs=0.08)
    kept = 0
    for example in later:
        prompt = world.decode(example.prompt_ids)
        assert "You already ran this workflow" in prompt and "Its final answer was" in prompt
        workflow = parse_workflow(CONDUCTOR_PREFIX + world.decode(example.completion_ids), 4, 5, allow_empty=True)
        kept += not workflow.steps
    if later:  # half the later rounds keep the answer, half write a new workflow
        assert kept / len(later) == pytest.approx(0.5, abs=0.1)
    world.env.close()
