"""The workflow-format mask (`conductor.format_mask`): every completion it lets a writer finish is a workflow that
`env.workflow.parse_workflow` reads over the offered ids, and it never refuses the canonical text of a workflow
(`conductor.loop_environment.completion_text`, what every teacher writes), token by token as the tokenizer writes
it."""

import random

import pytest

from conductor.format_mask import WorkflowFormatMask, WorkflowGrammar, _free_text_accepts, _vocabulary
from conductor.id_mask import OfferedIdsMask
from conductor.loop_environment import TokenizedConductorEnv, completion_text
from conductor.model import ConductorSpec, load_conductor
from env.gym_env import ConductorEnv, EnvConfig
from env.orchestration import OrchestrationWorldConfig
from env.pools import offered_ids
from env.workflow import Step, Workflow, parse_workflow, render_workflow
from env.worlds import build_world
from models import zoo
from models.tokenizer import load_tokenizer
from rollout.torch_generator import TorchGenerator
from rollout.types import SamplingParams
from tests.env.test_orchestration import RECIPE_REWARD

INSTRUCTIONS = [
    "Solve the question step by step and give the final answer inside <answer></answer>.",
    'Check the "draft" above; quote it \\ then fix it.',
    "Two lines:\nfirst, then\tsecond.",
    "Résumé of the proof — 証明.",
    "Never write <think> here.",
    "x",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(zoo.smollm2_135m_instruct())


def _mask(tokenizer, ids, max_steps=5, access_mode="binary", max_tokens=100_000):
    return WorkflowFormatMask(tokenizer, ids, max_steps, access_mode, (tokenizer.eos_token_id,), max_tokens)


def _allowed(constraint, token_id):
    return (token_id in constraint.token_ids) == constraint.only


def _random_workflow(rng, ids, max_steps, access_mode):
    steps = []
    for index in range(rng.randint(1, max_steps)):
        if access_mode == "fine":
            access = tuple(sorted(rng.sample(range(index), rng.randint(0, index))))
        else:
            access = rng.choice(["all", ()]) if index else ()
        steps.append(Step(worker=rng.choice(ids), instruction=rng.choice(INSTRUCTIONS), access=access))
    reasoning = rng.choice(["This needs one careful answer.", "model_id first: verify.", "modest plan", ""])
    return Workflow(steps=tuple(steps), reasoning=reasoning)


@pytest.mark.parametrize("access_mode", ["binary", "fine"])
def test_the_mask_allows_every_token_of_a_rendered_workflow_and_a_stop_only_at_its_end(tokenizer, access_mode):
    rng = random.Random(0)
    masks = {ids: _mask(tokenizer, ids, access_mode=access_mode) for ids in [(1,), (0, 3, 12), (2, 7, 12, 15)]}
    for trial in range(16):
        ids, mask = rng.choice(list(masks.items()))
        workflow = _random_workflow(rng, ids, 5, access_mode)
        text = completion_text(workflow, access_mode)
        assert text == "\n" + render_workflow(workflow, access_mode)
        token_ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        for position, token_id in enumerate(token_ids):
            constraint = mask.constraint(token_ids[:position])
            assert constraint is not None and _allowed(constraint, token_id), (trial, text, position)
            if position < len(token_ids) - 1:
                assert not _allowed(constraint, tokenizer.eos_token_id), (trial, text, position)
        assert parse_workflow(text, ids, 5, access_mode).steps == workflow.steps


def _sample(mask, tokenizer, rng, limit):
    """A writer that picks among the allowed tokens, a third of the time one that may close a part (a quote, a
    bracket, a newline), up to `limit`."""
    texts = [pair for group in _vocabulary(tokenizer)[0].values() for pair in group]
    closing = {token_id for token_id, text in texts if any(c in text for c in '"],\n')}
    choices = {}
    ids = []
    for _ in range(limit):
        constraint = mask.constraint(ids)
        if constraint not in choices:
            named = set(constraint.token_ids)
            allowed = sorted(named) if constraint.only else [t for t, _ in texts if t not in named]
            choices[constraint] = (allowed, [t for t in allowed if t in closing] or allowed)
        allowed, allowed_closing = choices[constraint]
        token = rng.choice(allowed_closing if rng.random() < 0.35 else allowed)
        if token == tokenizer.eos_token_id:
            return ids, True
        ids.append(token)
    return ids, False


@pytest.mark.parametrize(("ids", "max_steps", "access_mode"), [((2, 12, 15), 3, "binary"), ((0, 1, 4), 5, "fine")])
def test_every_completion_a_random_writer_finishes_under_the_mask_parses_over_the_offered_ids(
    tokenizer, ids, max_steps, access_mode
):
    mask = _mask(tokenizer, ids, max_steps, access_mode)
    rng = random.Random(1)
    finished = 0
    for _ in range(12):
        token_ids, stopped = _sample(mask, tokenizer, rng, limit=300)
        if not stopped:
            continue
        finished += 1
        workflow = parse_workflow(tokenizer.decode(token_ids, skip_special_tokens=True), ids, max_steps, access_mode)
        assert all(step.worker in ids for step in workflow.steps) and 1 <= len(workflow.steps) <= max_steps
    assert finished >= 4


@pytest.mark.parametrize(("max_tokens", "max_steps", "access_mode"), [(40, 5, "fine"), (96, 3, "binary")])
def test_under_a_token_budget_every_completion_a_random_writer_writes_stops_within_it_and_parses(
    tokenizer, max_tokens, max_steps, access_mode
):
    ids = (2, 12, 15)
    mask = _mask(tokenizer, ids, max_steps, access_mode, max_tokens=max_tokens)
    rng = random.Random(2)
    for _ in range(12):
        token_ids, stopped = _sample(mask, tokenizer, rng, limit=max_tokens)
        assert stopped, tokenizer.decode(token_ids)
        workflow = parse_workflow(tokenizer.decode(token_ids, skip_special_tokens=True), ids, max_steps, access_mode)
        assert 1 <= len(workflow.steps) <= max_steps


@pytest.mark.parametrize("state", [
    ("start",), ("lead", "model_"), ("reasoning", "\n"), ("reasoning", "<thin"),
    ("string", 0, 2, "u0", False, ""), ("string", 1, 2, "\\", False, ""), ("string", 0, 1, "", False, "</"),
    ("access_index", 3, 4, "", 1), ("access_index", 3, 4, "1", 0), ("id", "1", 0),
])
def test_the_shortest_finish_completes_a_workflow_from_its_state(state):
    grammar = WorkflowGrammar((2, 12, 15), max_steps=4, access_mode="fine")
    assert grammar.complete(grammar.run(grammar.shortest_finish(state), state)), grammar.shortest_finish(state)


@pytest.mark.parametrize(
    "text",
    [
        "\nPlan.\n\nsubtasks = [",  # after the blank line the lists begin with model_id
        "\nPlan.\n\nmodel_id = [4",  # 4 is not offered
        "\nPlan.\n\nmodel_id = [1, 2, 1, 2",  # a fourth step over max_steps=3
        '\nPlan.\n\nmodel_id = [1, 2]\nsubtasks = ["a"]',  # fewer instructions than ids
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = [" "]',  # a blank instruction
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["\\u0020"]',  # a blank one, escaped
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["a\\udb',  # a surrogate, refused where it begins
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["a\nb"]',  # a raw newline inside a string
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["a <THINK>',  # a think tag inside a string
        "\nPlan <think>",  # a think tag in the reasoning
        "\nPlan: model_id = [",  # a bracket in the reasoning
        "Plan.",  # no opening newline
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["a"]\naccess_list = [[0',  # binary mode: [] or "all"
        '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["a"]\naccess_list = [[]] ',  # nothing after the lists
    ],
)
def test_the_grammar_refuses_text_that_is_no_workflow(text):
    assert WorkflowGrammar((1, 2, 12), max_steps=3).run(text) is None


def test_fine_access_names_earlier_steps_in_increasing_order():
    grammar = WorkflowGrammar((1,), max_steps=5, access_mode="fine")
    head = '\nP.\n\nmodel_id = [1, 1, 1]\nsubtasks = ["a", "b", "c"]\naccess_list = [[], '
    assert grammar.complete(grammar.run(head + '[0], [0, 1]]'))
    assert grammar.complete(grammar.run(head + '"all", []]'))
    for refused in ("[1]", "[0, 0]", "[], [1, 0]", "[], [2]", "[], [01]"):
        assert grammar.run(head + refused) is None, refused


def test_a_stop_is_allowed_only_once_the_workflow_is_complete(tokenizer):
    mask = _mask(tokenizer, (1, 2), max_steps=2)
    head = '\nPlan.\n\nmodel_id = [1]\nsubtasks = ["Solve it."]\naccess_list = [[]'
    eos = tokenizer.eos_token_id
    assert not _allowed(mask.constraint(tokenizer.encode(head, add_special_tokens=False)), eos)
    assert mask.constraint(tokenizer.encode(head + "]", add_special_tokens=False)) == mask._at(("end",))
    assert mask._at(("end",)).token_ids == (eos,) and mask._at(("end",)).only


def test_free_text_shortcut_agrees_with_the_automaton_over_the_whole_vocabulary(tokenizer):
    mask = _mask(tokenizer, (1, 2))
    texts = [pair for group in _vocabulary(tokenizer)[0].values() for pair in group]
    for state in (("reasoning", ""), ("lead", "mod"), ("string", 0, 2, "", False, ""), ("string", 1, 2, "", True, "")):
        decided = 0
        for _, text in texts:
            fast = _free_text_accepts(state, text)
            if fast is not None:
                decided += 1
                assert fast == (bool(text) and mask.grammar.run(text, state) is not None), (state, text)
        # In free text the shortcut skips the automaton for most of the vocabulary; in structure it decides nothing.
        assert decided > len(texts) // 2 if state[0] != "lead" else decided == 0, state


def test_after_text_the_mask_did_not_write_it_constrains_nothing(tokenizer):
    mask = _mask(tokenizer, (1, 2))
    assert mask.constraint(tokenizer.encode("\nPlan.\n\nsubtasks = [[]]", add_special_tokens=False)) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_steps": 0}, "max_steps"),
        ({"access_mode": "all"}, "access_mode"),
        ({"stop_token_ids": ()}, "stop token"),
        ({"ids": ()}, "model ids"),
        ({"max_tokens": 20}, "max_tokens must be an int >= "),
        ({"max_tokens": 96.0}, "max_tokens must be an int"),
    ],
)
def test_a_bad_configuration_is_refused(tokenizer, kwargs, message):
    arguments = {"ids": (1, 2), "max_steps": 3, "access_mode": "binary", "stop_token_ids": (2,), "max_tokens": 96}
    arguments |= kwargs
    with pytest.raises(ValueError, match=message):
        WorkflowFormatMask(tokenizer, **arguments)


def _orchestration_env(tokenizer, token_masks, max_tokens=96, **config):
    world = build_world(OrchestrationWorldConfig(split="validation"), RECIPE_REWARD, max_steps=3)
    return TokenizedConductorEnv(ConductorEnv(world, EnvConfig(max_steps=3, **config)), tokenizer, token_masks,
                                 max_tokens)


def test_the_environment_builds_the_mask_its_token_masks_name_over_each_questions_pool(tokenizer):
    environment = _orchestration_env(tokenizer, "workflow", access_mode="fine")
    mask = environment.token_mask(0)
    assert isinstance(mask, WorkflowFormatMask) and environment.masked
    assert mask.ids == offered_ids(environment.tasks[0], len(environment.env.world.pool))
    assert (mask.grammar.max_steps, mask.grammar.access_mode) == (3, "fine")
    assert mask.stop_token_ids == (tokenizer.eos_token_id,) and mask.max_tokens == 96
    assert isinstance(_orchestration_env(tokenizer, "ids").token_mask(0), OfferedIdsMask)
    with pytest.raises(ValueError, match="without token masks"):
        _orchestration_env(tokenizer, "none").token_mask(0)
    with pytest.raises(ValueError, match="recursion rounds"):
        _orchestration_env(tokenizer, "workflow", recursion_rounds=1)
    with pytest.raises(ValueError, match="completion limit"):
        _orchestration_env(tokenizer, "workflow", max_tokens=None)
    with pytest.raises(ValueError, match="token_masks must be one of"):
        _orchestration_env(tokenizer, "format")


def test_the_torch_generator_samples_a_tiny_conductor_inside_the_grammar_under_the_environments_masks(
    tokenizer, tmp_path
):
    """The real path: a randomly initialised tiny Conductor sampled by the torch generator under the environment's
    masks. Every token is drawn under the constraint the mask gives for the completion so far, and no completion
    leaves the grammar (a random policy rarely gets past its reasoning: the random writer above covers the rest)."""
    environment = _orchestration_env(tokenizer, "workflow")
    _, _, model_dir = load_conductor(ConductorSpec(name="tiny", seed=3), tmp_path / "tiny")
    generator = TorchGenerator(model_dir)
    questions = [0, 1, 2]
    masks = [environment.token_mask(q) for q in questions]
    groups = generator.generate([environment.prompt_ids(q) for q in questions],
                                SamplingParams(temperature=1.0, max_new_tokens=40, seed=0), n=2, token_masks=masks)
    generator.close()
    for mask, group in zip(masks, groups):
        for completion in group:
            ids = list(completion.completion_ids)
            assert list(completion.constraints) == [mask.constraint(ids[:k]) for k in range(len(ids))]
            assert mask.grammar.run(environment.decode(ids)) is not None
