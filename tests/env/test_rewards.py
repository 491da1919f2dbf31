import pytest

from env.executor import Execution
from env.rewards import RewardConfig, reward
from env.workflow import WorkflowFormatError
from tests.env.helpers import step_record


def execution(steps: int = 1, tokens: tuple[int, int] = (10, 5), cost_usd: float = 0.0) -> Execution:
    records = tuple(step_record(i, tokens=tokens, cost_usd=cost_usd / steps) for i in range(steps))
    return Execution("<answer>1</answer>", records, steps, steps * sum(tokens), cost_usd, 0.1)


def test_default_rewards_are_the_papers_zero_half_one():
    assert reward(None, None, "missing lists")[0] == 0.0
    assert reward(None, None, WorkflowFormatError("lengths differ"))[0] == 0.0
    assert reward(execution(), 0.0, None)[0] == 0.5
    assert reward(execution(), 1.0, None)[0] == 1.0


def test_a_fractional_grade_interpolates_between_wrong_and_correct():
    assert reward(execution(), 0.4, None)[0] == pytest.approx(0.7)
    config = RewardConfig(wrong=0.0, correct=2.0)
    assert reward(execution(), 0.25, None, config)[0] == pytest.approx(0.5)


def test_every_value_is_configurable_and_the_components_add_up_to_the_total():
    config = RewardConfig(format_error=-1.0, wrong=0.1, correct=0.9, format_bonus=0.05, step_penalty=0.1,
                          token_penalty=0.01, usd_penalty=10.0)  # fmt: skip
    assert reward(None, None, "bad", config) == (-1.0, {"outcome": -1.0, "format_valid": 0.0, "total": -1.0})
    total, components = reward(execution(steps=3, tokens=(700, 133), cost_usd=0.02), 1.0, None, config)
    expected = 0.9 + 0.05 - 3 * 0.1 - 0.01 * 2499 / 1000 - 10.0 * 0.02
    assert total == pytest.approx(expected)
    assert components["step_penalty"] == pytest.approx(-0.3)
    assert components["token_penalty"] == pytest.approx(-0.02499)
    assert components["usd_penalty"] == pytest.approx(-0.2)
    assert components["format_bonus"] == 0.05 and components["format_valid"] == 1.0
    additive = [v for k, v in components.items() if k not in ("format_valid", "total")]
    assert sum(additive) == pytest.approx(total) == components["total"]


def test_a_later_recursion_round_blends_in_the_earlier_rounds_reward():
    total, components = reward(execution(), 1.0, None, previous_reward=0.5)
    assert total == pytest.approx(0.2 * 0.5 + 0.8 * 1.0)
    assert components["this_round"] == 1.0 and components["previous_round"] == 0.5
    paper = RewardConfig(recursion_discount=0.25)
    assert reward(None, None, "bad", paper, previous_reward=1.0)[0] == pytest.approx(0.25)
    assert reward(execution(), 0.0, None, RewardConfig(recursion_discount=0.0), previous_reward=1.0)[0] == 0.5


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="needs its execution and grade"):
        reward(None, 1.0, None)
    with pytest.raises(ValueError, match="needs its execution and grade"):
        reward(execution(), None, None)
    with pytest.raises(ValueError, match="grade must be in"):
        reward(execution(), 1.5, None)
    with pytest.raises(ValueError, match="step_penalty"):
        RewardConfig(step_penalty=-0.1)
    with pytest.raises(ValueError, match="usd_penalty"):
        RewardConfig(usd_penalty=-1)
    with pytest.raises(ValueError, match="recursion_discount"):
        RewardConfig(recursion_discount=1.5)
