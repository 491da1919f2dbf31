"""parse_workflow / render_workflow: lenient extraction, strict validation, round trips, and robustness."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from env.workflow import (
    MAX_COMPLETION_CHARS,
    Step,
    Workflow,
    WorkflowFormatError,
    model_id_in_progress,
    parse_workflow,
    render_workflow,
)

VALID = 'model_id = [0, 2]\nsubtasks = ["Solve it.", "Check it."]\naccess_list = [[], "all"]'


def steps_of(workflow: Workflow) -> list[tuple[int, str, object]]:
    return [(step.worker, step.instruction, step.access) for step in workflow.steps]


# ---------------------------------------------------------------------------------------------- lenient reading


def test_reads_the_three_lists_and_the_reasoning_before_them():
    workflow = parse_workflow("First solve, then check.\n\n" + VALID, pool=3)
    assert steps_of(workflow) == [(0, "Solve it.", ()), (2, "Check it.", "all")]
    assert workflow.reasoning == "First solve, then check."


@pytest.mark.parametrize(
    "text",
    [
        'model_id: [0, 2]\nsubtasks: ["Solve it.", "Check it."]\naccess_list: [[], "all"]',
        '**model_id** = [0, 2]\n**subtasks** = ["Solve it.", "Check it."]\n**access_list** = [[], "all"]',
        '{"model_id": [0, 2], "subtasks": ["Solve it.", "Check it."], "access_list": [[], "all"]}',
        "```python\nmodel_id = [0, 2]\nsubtasks = ['Solve it.', 'Check it.']\naccess_list = [[], 'all']\n```",
        "model_id = ```python\n[0, 2]```\nsubtasks = [\"Solve it.\", \"Check it.\"]\naccess_list = [[], 'ALL']",
        "MODEL_ID = [0, 2]; Subtasks = [\u201cSolve it.\u201d, \u201cCheck it.\u201d]; "
        "access_list = [[], \u201call\u201d]",
        "model_id = [0, 2]\nsubtasks = [Solve it., Check it.]\naccess_list = [[], all]",
        "model_id = ['0', '2']\nsubtasks = ['Solve it.', 'Check it.']\naccess_list = [[], 'all']",
        "model_id = ['Model id 0', 'model 2']\nsubtasks = ['Solve it.', 'Check it.']\naccess_list = [[], 'all']",
    ],
    ids=["colon", "bold", "json-object", "code-fence", "fence-after-label", "smart-quotes-and-case",
         "comma-split", "string-ids", "pool-names"],
)
def test_lenient_spellings_give_the_same_workflow(text):
    assert steps_of(parse_workflow(text, pool=3)) == [(0, "Solve it.", ()), (2, "Check it.", "all")]


def test_brackets_quotes_and_labels_inside_strings_do_not_end_or_start_a_list():
    text = (
        "model_id = [1, 0]\n"
        "subtasks = [\"List the subtasks = [a, b] of 'x'\", 'Say \"model_id = [9]\" and [[nothing]]']\n"
        "access_list = [[], 'all']"
    )
    workflow = parse_workflow(text, pool=2)
    assert [step.instruction for step in workflow.steps] == [
        "List the subtasks = [a, b] of 'x'",
        'Say "model_id = [9]" and [[nothing]]',
    ]


def test_apostrophe_inside_double_quotes_and_smart_apostrophe_in_single_quotes():
    text = "model_id = [0]\nsubtasks = ['Find Bob\u2019s age']\naccess_list = [[]]"
    assert parse_workflow(text, pool=1).steps[0].instruction == "Find Bob\u2019s age"
    text = "model_id = [0]\nsubtasks = [\"Don't stop\"]\naccess_list = [[]]"
    assert parse_workflow(text, pool=1).steps[0].instruction == "Don't stop"


def test_think_blocks_are_ignored_and_the_last_complete_list_wins():
    text = (
        "<think>model_id = [5, 5, 5]</think>Drafting: model_id = [1]\n"
        "Final:\nmodel_id = [0]\nsubtasks = ['Answer.']\naccess_list = [[]]"
    )
    assert steps_of(parse_workflow(text, pool=2)) == [(0, "Answer.", ())]
    # Chat templates that open the block in the prompt leave only the closing tag in the completion.
    assert parse_workflow("planning model_id = [7]</think>" + VALID, pool=3).steps[1].worker == 2
    with pytest.raises(WorkflowFormatError, match="missing lists"):
        parse_workflow("<think>" + VALID, pool=3)


def test_fine_mode_reads_index_lists_sorted_without_duplicates_and_all_as_every_earlier_step():
    text = "model_id = [0, 1, 2]\nsubtasks = ['a', 'b', 'c']\naccess_list = [[], [0], [1, 0, 1]]"
    assert [step.access for step in parse_workflow(text, 3, access_mode="fine").steps] == [(), (0,), (0, 1)]
    text = "model_id = [0, 1, 2]\nsubtasks = ['a', 'b', 'c']\naccess_list = ['all', [0], 'all']"
    assert [step.access for step in parse_workflow(text, 3, access_mode="fine").steps] == [(), (0,), (0, 1)]


def test_binary_all_on_the_first_step_means_no_access():
    workflow = parse_workflow("model_id = [0]\nsubtasks = ['a']\naccess_list = ['all']", pool=1)
    assert workflow.steps[0].access == ()
    assert workflow.steps[0].visible_steps(0) == ()


def test_recursion_round_accepts_three_empty_lists_only_when_allowed():
    text = "The answer is right.\nmodel_id = []\nsubtasks = []\naccess_list = []"
    workflow = parse_workflow(text, pool=3, allow_empty=True)
    assert workflow.steps == () and workflow.keeps_previous_answer
    with pytest.raises(WorkflowFormatError, match="the three lists are empty"):
        parse_workflow(text, pool=3)


# ------------------------------------------------------------------------------------------- strict validation


@pytest.mark.parametrize(
    "text, mode, reason",
    [
        ("I would use model 0.", "binary",
         "missing lists: `model_id = [...]`, `subtasks = [...]`, `access_list = [...]`"),
        ("model_id = [0]\nsubtasks = ['a']", "binary", "missing list: `access_list = [...]`"),
        ("model_id = [0\nsubtasks = ['a']\naccess_list = [[]]", "binary",
         "the model_id list opens with '[' but is not closed within 20000 characters"),
        ("model_id = [0, 1]\nsubtasks = ['a']\naccess_list = [[], []]", "binary",
         "the lists have different lengths: model_id 2, subtasks 1, access_list 2"),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = []", "binary",
         "the access_list list is empty but the other lists have 2 entries"),
        ("model_id = ['x']\nsubtasks = ['a']\naccess_list = [[]]", "binary",
         "model_id[0] is 'x', not an integer model id"),
        ("model_id = [1.5]\nsubtasks = ['a']\naccess_list = [[]]", "binary",
         "model_id[0] is 1.5, not an integer model id"),
        ("model_id = [True]\nsubtasks = ['a']\naccess_list = [[]]", "binary",
         "model_id[0] is True, not an integer model id"),
        ("model_id = [0, 3]\nsubtasks = ['a', 'b']\naccess_list = [[], []]", "binary",
         "model_id[1] is 3, outside the pool's ids 0..2"),
        ("model_id = [-1]\nsubtasks = ['a']\naccess_list = [[]]", "binary",
         "model_id[0] is -1, outside the pool's ids 0..2"),
        ("model_id = [0]\nsubtasks = ['  ']\naccess_list = [[]]", "binary", "subtasks[0] is empty"),
        ("model_id = [0]\nsubtasks = [7]\naccess_list = [[]]", "binary", "subtasks[0] is 7, not a string"),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], [0]]", "binary",
         'access_list[1] is [0]; binary mode allows only "all" or []'),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], 'some']", "binary",
         'access_list[1] is \'some\'; binary mode allows only "all" or []'),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], [1]]", "fine",
         "access_list[1] refers to step 1, which does not come before step 1"),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], [-1]]", "fine",
         "access_list[1] contains -1, a negative step index"),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], ['x']]", "fine",
         "access_list[1] contains 'x', not a step index"),
        ("model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], 3]", "fine",
         'access_list[1] is 3, not a list of step indices or "all"'),
        ("model_id = [0]\nsubtasks = [[[[[x]]]]]\naccess_list = [[]]", "binary",
         "the subtasks list could not be read: [[[[[x]]]]]"),
        ("model_id = [0, 1, 2, 0, 1, 2]\nsubtasks = ['a', 'b', 'c', 'd', 'e', 'f']\n"
         "access_list = [[], [], [], [], [], []]", "binary", "the workflow has 6 steps, more than the limit of 5"),
    ],
)
def test_each_format_error_has_one_precise_reason(text, mode, reason):
    with pytest.raises(WorkflowFormatError) as error:
        parse_workflow(text, pool=3, access_mode=mode)
    assert str(error.value) == reason
    assert "\n" not in str(error.value)


def test_step_limit_is_configurable():
    text = "model_id = [0, 0]\nsubtasks = ['a', 'b']\naccess_list = [[], 'all']"
    assert len(parse_workflow(text, pool=1, max_steps=2).steps) == 2
    with pytest.raises(WorkflowFormatError, match="more than the limit of 1"):
        parse_workflow(text, pool=1, max_steps=1)


def test_oversized_completion_is_refused_before_any_work():
    with pytest.raises(WorkflowFormatError, match=f"more than the limit of {MAX_COMPLETION_CHARS}"):
        parse_workflow(VALID + " " * MAX_COMPLETION_CHARS, pool=3)


def test_non_text_completion_is_a_format_error():
    with pytest.raises(WorkflowFormatError, match="must be text"):
        parse_workflow(None, pool=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pool": 0}, "pool_size"),
        ({"pool": 3, "max_steps": 0}, "max_steps"),
        ({"pool": 3, "access_mode": "coarse"}, "access_mode"),
    ],
)
def test_bad_settings_are_programming_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_workflow(VALID, **kwargs)
    assert not isinstance(error.value, WorkflowFormatError)


def test_adversarial_inputs_finish_quickly():
    texts = [
        "model_id = [" * 9000,
        ("model_id=[" * 20 + '"') * 400,
        "[" * 90_000,
        "model_id = [" + "1," * 30_000 + "1]",
        'subtasks = ["' + "\\" * 60_000,
        "</think>" * 10_000 + "<think>",
        "model_id" * 10_000,
        "model_id = [[[[" * 5000 + "]" * 20_000,
    ]
    for text in texts:
        start = time.perf_counter()
        with pytest.raises(WorkflowFormatError):
            parse_workflow(text, pool=3)
        assert time.perf_counter() - start < 2.0, text[:30]


# ------------------------------------------------------------------------------------------------- rendering


def test_render_writes_the_reference_layout():
    workflow = Workflow(
        steps=(Step(0, "Solve it."), Step(2, "Check it.", "all")), reasoning="  Solve, then check.\n"
    )
    assert render_workflow(workflow) == "Solve, then check.\n\n" + VALID
    assert render_workflow(Workflow(steps=())) == "model_id = []\nsubtasks = []\naccess_list = []"


def test_render_fine_mode_writes_indices_and_binary_rejects_partial_access():
    workflow = Workflow(steps=(Step(0, "a"), Step(1, "b", (0,)), Step(1, "c", "all")))
    assert render_workflow(workflow, "fine").endswith("access_list = [[], [0], [0, 1]]")
    assert render_workflow(Workflow(steps=(Step(0, "a"), Step(1, "b", (0,)))), "binary").endswith(
        'access_list = [[], "all"]'
    )
    with pytest.raises(ValueError, match="binary mode cannot express"):
        render_workflow(Workflow(steps=(Step(0, "a"), Step(0, "b"), Step(1, "c", (1,)))), "binary")


# ----------------------------------------------------------------------------------------- property tests

_instructions = st.text(min_size=1, max_size=60).filter(lambda text: text.strip() != "")
_reasoning = (
    st.text(alphabet=st.characters(exclude_characters="[<"), max_size=80)
    .map(str.strip)
    .filter(lambda text: not any(label in text.lower() for label in ("model_id", "subtasks", "access_list")))
)


@st.composite
def workflows(draw, access_mode: str, pool_size: int = 7, max_steps: int = 5) -> Workflow:
    count = draw(st.integers(1, max_steps))
    steps = []
    for index in range(count):
        if access_mode == "binary":
            access = () if index == 0 else draw(st.sampled_from(["all", ()]))
        else:
            access = tuple(sorted(draw(st.sets(st.integers(0, index - 1), max_size=index)))) if index else ()
        steps.append(Step(draw(st.integers(0, pool_size - 1)), draw(_instructions), access))
    return Workflow(steps=tuple(steps), reasoning=draw(_reasoning))


@pytest.mark.parametrize("access_mode", ["binary", "fine"])
def test_render_then_parse_is_the_identity(access_mode):
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(workflows(access_mode))
    def check(workflow):
        text = render_workflow(workflow, access_mode)
        assert parse_workflow(text, pool=7, access_mode=access_mode) == workflow

    check()


_NOISE = [
    "model_id", "subtasks", "access_list", " = ", ": ", "[", "]", "[[", "]]", '"', "'", "\u201c", "\u201d",
    "\u2019", ",", "all", "[]", "<think>", "</think>", "\\", "\n", "```", "0", "7", "-1", "1.5", "True", "None",
    "{", "}", "(", ")", "**", "\x00", "\ud7ff", "é", " " * 5,
]


def _mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        operation = rng.randrange(5)
        at = rng.randint(0, len(text))
        end = rng.randint(at, min(len(text), at + 20))
        if operation == 0:
            text = text[:at] + text[end:]
        elif operation == 1:
            text = text[:at] + rng.choice(_NOISE) + text[at:]
        elif operation == 2:
            text = text[:at] + text[at:end] * rng.randint(2, 4) + text[at:]
        elif operation == 3:
            text = text[:at]
        else:
            text = text[:at] + chr(rng.randint(0, 0x2FFF)) + text[end:]
    return text


def _parse_never_crashes(text: str, **kwargs) -> None:
    try:
        result = parse_workflow(text, **kwargs)
    except WorkflowFormatError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert isinstance(result, Workflow)
        assert 1 <= len(result.steps) <= kwargs.get("max_steps", 5) or kwargs.get("allow_empty")
        assert all(0 <= step.worker < kwargs["pool"] for step in result.steps)


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=300), st.sampled_from(["binary", "fine"]), st.booleans())
def test_arbitrary_text_only_parses_or_raises_format_error(text, access_mode, allow_empty):
    _parse_never_crashes(text, pool=3, access_mode=access_mode, allow_empty=allow_empty)


MUTANTS_PER_EXAMPLE = 50


@pytest.mark.slow
@settings(
    max_examples=2000,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(workflows("fine"), st.sampled_from(["binary", "fine"]), st.integers(0, 2**32 - 1))
def test_100k_mutated_workflows_only_parse_or_raise_format_error(workflow, access_mode, seed):
    """2,000 generated workflows x 50 random mutations each = 100,000 texts."""
    rng = random.Random(seed)
    text = render_workflow(workflow, "fine")
    assert parse_workflow(text, pool=7, access_mode="fine") == workflow
    for _ in range(MUTANTS_PER_EXAMPLE):
        _parse_never_crashes(_mutate(text, rng), pool=7, access_mode=access_mode, allow_empty=rng.random() < 0.5)


@pytest.mark.parametrize(
    "accesses, reads_every_step",
    [
        (((),), True),
        (((), ()), False),
        (((), "all"), True),
        (((), (), "all"), True),
        (((), "all", ()), False),
        (((), (0,), (1,)), True),  # a chain: step 2 reads step 0 through step 1
        (((), (), (1,)), False),  # nothing reads step 0
        (((), (0,), (0,)), False),  # nothing reads step 1
    ],
)
def test_final_step_reads_every_step_follows_the_access_lists_through_earlier_steps(accesses, reads_every_step):
    workflow = Workflow(steps=tuple(Step(0, "Solve.", access) for access in accesses))
    assert workflow.final_step_reads_every_step is reads_every_step


def test_an_empty_workflow_reads_nothing():
    assert not Workflow(steps=()).final_step_reads_every_step


@pytest.mark.parametrize("text,expected", [
    ("Plan.\nmodel_id = [", ""),
    ("model_id=[0, 1", "1"),
    ('"model_id": [12,  ', ""),
    ("**model_id**:\n```python\n[3", "3"),
    ("model_id = [3 ", "3 "),
    ("model_id = [3]", None),
    ("model_id = [3]\nsubtasks = [", None),
    ("model_id = ['W", None),
    ("model_id = [3, x", None),
    ("no list yet", None),
    ("<think>model_id = [</think>Plan.", None),
    ("model_id = [0]\nsubtasks = [\"a\"]\nmodel_id = [2, ", ""),
])
def test_model_id_in_progress_is_the_id_being_written_where_the_parser_reads_one(text, expected):
    assert model_id_in_progress(text) == expected
