"""Invalid-action masking of model ids (`conductor.id_mask`): decoding names only the workers a question offers."""

from __future__ import annotations

import random
import re

import pytest

from conductor.id_mask import OfferedIdsMask
from conductor.loop_environment import TokenizedConductorEnv, completion_ids, worker_id_tokens
from conductor.outcomes import conductor_outcomes
from conductor.warm_start import masked_examples
from env.gym_env import ConductorEnv, EnvConfig
from env.orchestration import OrchestrationWorldConfig
from env.pools import offered_ids
from env.workflow import Step, Workflow, parse_workflow
from env.worlds import build_world
from models import zoo
from models.tokenizer import load_tokenizer
from rl.supervised import Example
from rollout.types import Completion, SamplingParams
from tests.env.test_orchestration import RECIPE_REWARD

LIST_START = "Two models.\n\nmodel_id = ["


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(zoo.smollm2_135m_instruct())


def allowed(mask, tokenizer, text, candidates):
    """Which of the `candidates` (texts of one token each) may follow `text` under the mask."""
    constraint = mask.constraint(tokenizer.encode(text, add_special_tokens=False))
    ids = {candidate: tokenizer.encode(candidate, add_special_tokens=False) for candidate in candidates}
    assert all(len(token) == 1 for token in ids.values()), ids
    if constraint is None:
        return set(candidates)
    return {c for c, (token,) in ids.items() if (token in constraint.token_ids) == constraint.only}


def test_inside_the_model_id_list_only_digits_towards_an_offered_id_are_allowed(tokenizer):
    mask = OfferedIdsMask(tokenizer, [12, 3, 5])
    digits = [str(d) for d in range(10)]
    # Where an id begins, only the start of an offered one, or whitespace: the list can neither close nor skip the id.
    assert allowed(mask, tokenizer, LIST_START, digits + [",", "]", '"', " ", "\n"]) == {"1", "3", "5", " ", "\n"}
    assert allowed(mask, tokenizer, LIST_START + " ", digits + ["]"]) == {"1", "3", "5"}
    # "1" is only the start of 12: nothing but its "2" may follow.
    assert allowed(mask, tokenizer, LIST_START + "1", digits + [",", "]"]) == {"2"}
    assert allowed(mask, tokenizer, LIST_START + "12", digits + [",", "]"]) == {",", "]"}
    assert allowed(mask, tokenizer, LIST_START + "12, ", digits + ["]"]) == {"1", "3", "5"}
    # Outside the list, and after it closes, the mask allows everything.
    assert allowed(mask, tokenizer, "Two models.\n\nsubtasks = [", digits) == set(digits)
    assert allowed(mask, tokenizer, LIST_START + "3]\nsubtasks = [\"Step ", digits) == set(digits)
    # Text the mask would not have written (an id no offered one completes) is left alone.
    assert allowed(mask, tokenizer, LIST_START + "7", digits) == set(digits)
    with pytest.raises(ValueError, match="distinct ints"):
        OfferedIdsMask(tokenizer, [])


def test_every_completion_the_mask_lets_a_random_writer_finish_names_only_offered_ids(tokenizer):
    rng = random.Random(0)
    alphabet = [str(d) for d in range(10)] + [",", " ", "]"]
    tokens = {piece: tokenizer.encode(piece, add_special_tokens=False)[0] for piece in alphabet}
    for trial in range(40):
        offered = sorted(rng.sample(range(16), rng.randint(1, 4)))
        mask = OfferedIdsMask(tokenizer, offered)
        text = LIST_START
        while not text.endswith("]") and len(text) < len(LIST_START) + 40:
            constraint = mask.constraint(tokenizer.encode(text, add_special_tokens=False))
            choices = [p for p in alphabet if constraint is None or (tokens[p] in constraint.token_ids) == constraint.only]
            text += rng.choice(choices)
        names = [int(run) for run in re.findall(r"\d+", text[len(LIST_START):])]
        assert set(names) <= set(offered), (offered, text)
        if text.endswith("]") and re.fullmatch(r"\[ *\d+( *, *\d+)* *\]", text[len(LIST_START) - 1:]):
            steps = len(names)
            completion = text + f"\nsubtasks = {['Answer.'] * steps}\naccess_list = {[[]] * steps}"
            assert [step.worker for step in parse_workflow(completion, offered).steps] == names


class PreferenceGenerator:
    """A stand-in Conductor that always prefers worker 4, then 0, 1, 2, 3, 5: it writes the first of them its prompt's
    token mask allows (all of them without a mask), as a masked greedy decoder would."""

    PREFERENCE = (4, 0, 1, 2, 3, 5)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.masks_seen = []

    def generate(self, prompt_ids, params, n, token_masks=None):
        self.masks_seen.extend(token_masks or [None] * len(prompt_ids))
        groups = []
        for index, prompt in enumerate(prompt_ids):
            mask = None if token_masks is None else token_masks[index]
            head = self.tokenizer.encode("\nmodel_id = [", add_special_tokens=False)
            for worker in self.PREFERENCE:
                (token,) = self.tokenizer.encode(str(worker), add_special_tokens=False)
                constraint = None if mask is None else mask.constraint(head)
                if constraint is None or (token in constraint.token_ids) == constraint.only:
                    break
            text = f"\nmodel_id = [{worker}]\nsubtasks = [\"Answer.\"]\naccess_list = [[]]"
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            groups.append([Completion(tuple(prompt), ids, (0.0,) * len(ids), "stop", 0)])
        return groups


@pytest.mark.parametrize("masked", [False, True])
def test_masked_greedy_evaluation_names_each_questions_first_offered_choice(tokenizer, masked):
    world = build_world(OrchestrationWorldConfig(split="validation"), RECIPE_REWARD, max_steps=3)
    environment = TokenizedConductorEnv(ConductorEnv(world, EnvConfig(max_steps=3)), tokenizer,
                                        "ids" if masked else "none")
    generator = PreferenceGenerator(tokenizer)
    outcomes = conductor_outcomes(generator, environment, SamplingParams(temperature=0.0), repeats=1)
    pools = [offered_ids(task, len(world.pool)) for task in world.tasks]
    valid = [o.metrics["valid_format"] for o in outcomes]
    if not masked:
        assert generator.masks_seen == [None] * len(world.tasks)
        assert valid == [float(4 in pool) for pool in pools] and 0 < sum(valid) < len(valid)
        return
    assert [mask.ids for mask in generator.masks_seen] == pools
    assert valid == [1.0] * len(outcomes)
    assert [o.workers for o in outcomes] == [
        (next(w for w in PreferenceGenerator.PREFERENCE if w in pool),) for pool in pools
    ]


def test_warm_start_examples_are_scored_under_their_questions_mask_at_their_id_tokens_only(tokenizer):
    world = build_world(OrchestrationWorldConfig(split="validation"), RECIPE_REWARD, max_steps=3)
    environment = TokenizedConductorEnv(ConductorEnv(world, EnvConfig(max_steps=3)), tokenizer, "ids")
    question = 0
    pool = offered_ids(world.tasks[question], len(world.pool))
    workflow = Workflow(steps=(Step(pool[2], "Solve it."), Step(pool[0], "Check it.", "all")))
    target = completion_ids(environment, workflow)
    followup = Example((1, 2, 3), target)
    [example, untouched] = masked_examples(
        environment, [Example(tuple(environment.prompt_ids(question)), target), followup])
    assert untouched is followup  # a prompt that is no question's first round keeps no constraints
    id_tokens = worker_id_tokens(tokenizer, target)
    constrained = [k for k, constraint in enumerate(example.constraints) if constraint is not None]
    # Every token inside the model_id list is constrained, from the first id to the closing bracket; nothing else.
    assert constrained == list(range(id_tokens[0], id_tokens[-1] + 2))
    for k in id_tokens:
        constraint = example.constraints[k]
        assert (target[k] in constraint.token_ids) == constraint.only
        offered_digits = {tokenizer.encode(str(w), add_special_tokens=False)[0] for w in pool}
        absent = {tokenizer.encode(str(w), add_special_tokens=False)[0] for w in range(6) if w not in pool}
        # Each id is one digit and begins where it is written: only the offered ids' digits (or whitespace) allowed.
        assert constraint.only and offered_digits <= set(constraint.token_ids)
        assert not absent & set(constraint.token_ids)
