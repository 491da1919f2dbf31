"""Graders and answer extraction: math, letters, short answers, exact tokens, code in the sandbox."""

from __future__ import annotations

import pytest

from env.tasks.answers import extract_answer, extract_choice, extract_code, parse_number
from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code
from env.tasks.graders import grade_choice, grade_exact, grade_math, grade_short_answer, normalize_math


def tagged(answer: str) -> str:
    return f"Some working first.\n<answer>{answer}</answer>"


# ---------------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>42</answer>", "42"),
        ("<answer>1</answer> then <ANSWER> 2 </Answer>", "2"),
        ("<answer>a <answer>b</answer>", "b"),
        ("no tags 42", None),
        ("<answer>unterminated", None),
        ("</answer> only", None),
    ],
)
def test_extract_answer_takes_the_last_complete_tag(text, expected):
    assert extract_answer(text) == expected


def test_extract_code_prefers_the_last_python_block_inside_the_answer():
    text = "```python\nprint(0)\n```\n<answer>\n```text\nnotes\n```\n```python\nprint(1)\n```\n</answer>"
    assert extract_code(text) == "print(1)\n"
    assert extract_code("```\nprint(2)\n```") == "print(2)\n"
    assert extract_code("```js\nconsole.log(3)\n```") == "console.log(3)\n"
    assert extract_code("<answer>print(4)</answer>") == "print(4)"


@pytest.mark.parametrize(
    "answer, letter",
    [("B", "B"), ("(c)", "C"), ("D. Paris", "D"), ("The answer is A", "A"), ("Answer: (B)", "B"),
     ("**C**", "C"), ("Paris", None), ("", None)],
)
def test_extract_choice(answer, letter):
    assert extract_choice(answer) == letter


@pytest.mark.parametrize(
    "text, value",
    [("42", 42.0), ("-3.5", -3.5), ("1,234,567", 1234567.0), ("25%", 0.25), ("$12.50", 12.5), ("1e-3", 0.001),
     (".5", 0.5), ("1,23", None), ("abc", None), ("", None), ("%", None), ("3/4", None)],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


# ------------------------------------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("10", "10"),
        ("\\boxed{10}", "10"),
        ("$\\dfrac{14}{3}$", "\\frac{14}{3}"),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("90^\\circ", "90"),
        ("0.5", "\\frac{1}{2}"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\text{Evelyn}", "\\text{Evelyn}"),
    ],
)
def test_math_equivalent_answers_score_one(answer, gold):
    assert grade_math(tagged(answer), gold) == 1.0


@pytest.mark.parametrize(
    "response, gold",
    [(tagged("11"), "10"), (tagged("\\frac{1}{3}"), "\\frac{1}{2}"), ("10", "10"), (tagged("x" * 400), "10"),
     (tagged("(3, \\pi)"), "\\left( 3, \\frac{\\pi}{2} \\right)")],
    ids=["wrong-number", "wrong-fraction", "no-tag", "too-long", "wrong-tuple"],
)
def test_math_wrong_or_missing_answers_score_zero(response, gold):
    assert grade_math(response, gold) == 0.0


def test_normalize_math_strips_only_presentation():
    assert normalize_math("$\\boxed{\\dfrac{1}{2}}$.") == "\\frac{1}{2}"
    assert normalize_math("\\left(1,\\ 2\\right)") == "(1,2)"
    assert normalize_math("\\boxed{1}+\\boxed{2}") == "\\boxed{1}+\\boxed{2}"


# ------------------------------------------------------------------------------------- letters, short, exact


def test_choice_grader_matches_letters_only():
    assert grade_choice(tagged("(b)"), "B") == 1.0
    assert grade_choice(tagged("B. The second option"), "B") == 1.0
    assert grade_choice(tagged("C"), "B") == 0.0
    assert grade_choice("B", "B") == 0.0


@pytest.mark.parametrize(
    "answer, gold, score",
    [
        ("3.14", "3.1416", 1.0),
        ("3.3", "3.1416", 0.0),
        ("25%", "0.25", 1.0),
        ("0.25", "25%", 1.0),
        ("25", "25%", 1.0),
        ("2.5", "25%", 0.0),
        ("1,000", "1000", 1.0),
        ("The Nile", "nile", 1.0),
        ("NILE.", "Nile", 1.0),
        ("Nile river", "Nile", 0.0),
        ("\\frac{1}{2}", "\\dfrac{1}{2}", 1.0),
        ("0", "0", 1.0),
        ("0.001", "0", 0.0),
    ],
)
def test_short_answer_grader_numeric_tolerance_percent_and_case(answer, gold, score):
    assert grade_short_answer(tagged(answer), gold) == score


def test_exact_grader_needs_the_exact_token():
    assert grade_exact(tagged("routerdc:mmlu_test:3"), "routerdc:mmlu_test:3") == 1.0
    assert grade_exact(tagged("routerdc:mmlu_test:30"), "routerdc:mmlu_test:3") == 0.0
    assert grade_exact("routerdc:mmlu_test:3", "routerdc:mmlu_test:3") == 0.0


def test_task_rejects_a_grader_outside_the_unit_interval():
    task = Task(id="t", task_label="d", question="q", gold=None, grader=lambda response, gold: 2.0)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        task.grade("anything")


# ------------------------------------------------------------------------------------------------------- code

ADD_PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
ADD_TESTS = CodeTests(
    kind="humaneval",
    entry_point="add",
    prompt=ADD_PROMPT,
    test_code="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
)


def fenced(code: str) -> str:
    return f"<answer>\n```python\n{code}\n```\n</answer>"


def test_humaneval_style_accepts_a_full_function_or_only_the_body():
    assert grade_code(fenced("def add(a, b):\n    return a + b"), ADD_TESTS) == 1.0
    assert grade_code(fenced("    return a + b"), ADD_TESTS) == 1.0
    assert grade_code(fenced("def add(a, b):\n    return a - b"), ADD_TESTS) == 0.0
    assert grade_code("no code at all", ADD_TESTS) == 0.0
    assert grade_code(fenced(""), ADD_TESTS) == 0.0


def test_stdin_programs_compare_lines_tokens_and_floats():
    tests = CodeTests(kind="stdin", cases=(("3\n1 2 3\n", "6\n"), ("2\n0.1 0.2\n", "0.3\n")))
    solution = "n = int(input())\nprint(sum(map(float, input().split())) if n == 2 else sum(map(int, input().split())))"
    assert grade_code(fenced(solution), tests) == 1.0
    buffered = "import sys\ndata = sys.stdin.buffer.read().split()\nvals = data[1:]\n" \
               "s = sum(float(v) for v in vals)\nsys.stdout.write(str(int(s)) if s == int(s) else str(s))"
    assert grade_code(fenced(buffered), tests) == 1.0
    assert grade_code(fenced("print(6)"), tests) == 0.0
    assert grade_code(fenced("import sys\nprint(6)\nsys.exit(0)"), CodeTests(kind="stdin", cases=(("", "6"),))) == 1.0
    assert grade_code(fenced("import sys\nprint(6)\nsys.exit(3)"), CodeTests(kind="stdin", cases=(("", "6"),))) == 0.0


def test_functional_problems_call_solution_methods_or_functions():
    tests = CodeTests(
        kind="functional",
        entry_point="twoSum",
        cases=(("[2, 7, 11, 15]\n9", "[0, 1]"), ("[3, 2, 4]\n6", "[1, 2]")),
    )
    leetcode = (
        "from typing import List\n"
        "class Solution:\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n"
        "        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n"
        "                return (seen[target - x], i)\n"
        "            seen[x] = i\n"
    )
    assert grade_code(fenced(leetcode), tests) == 1.0
    function = "def twoSum(nums, target):\n    return [[i, j] for j in range(len(nums)) for i in range(j) " \
               "if nums[i] + nums[j] == target][0]"
    assert grade_code(fenced(function), tests) == 1.0
    constant = "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]"
    assert grade_code(fenced(constant), tests) == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "java"}, "kind must be one of"),
        ({"kind": "humaneval", "prompt": "def f(): pass"}, "need prompt, test_code and entry_point"),
        ({"kind": "stdin"}, "at least one case"),
        ({"kind": "functional", "cases": (("1", "1"),)}, "need entry_point"),
    ],
)
def test_code_tests_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CodeTests(**kwargs)


def test_solution_cannot_read_the_expected_outputs():
    tests = CodeTests(kind="stdin", cases=(("", "secret-output"),))
    assert grade_code(fenced("print('secret-output')"), tests) == 1.0
    cheat = "import json\nprint(json.load(open('tests.json'))['cases'][0][1])"
    assert grade_code(fenced(cheat), tests) == 0.0
