"""Tool-calling envs: valid calls, malformed JSON, unknown tools, bad arguments, a full episode."""

import json
from fractions import Fraction

import pytest

from envs.parsing import parse_tool_call
from envs.sokoban.solver import solve
from envs.tools.arithmetic import ArithmeticError_, evaluate
from envs.tools.countdown import TOOLS, CountdownEnv
from envs.tools.sokoban_tool import SokobanToolEnv


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call><|im_end|>'


@pytest.fixture
def countdown():
    env = CountdownEnv(format_penalty=-0.1)
    obs, info = env.reset(seed=0, options={"numbers": [3, 4, 5, 6], "target": 17})
    assert info["tools"] == TOOLS and "Target: 17" in obs
    return env


def test_valid_calculate_call_returns_a_tool_result(countdown):
    obs, reward, terminated, _, info = countdown.step(call("calculate", expression="3 * 4 + 5"))
    assert obs == "Result: 17" and reward == 0.0 and not terminated
    assert info["observation_role"] == "tool" and info["metrics"]["action_is_valid"] == 1.0


def test_correct_submission_wins(countdown):
    obs, reward, terminated, _, info = countdown.step(call("submit_answer", expression="(3 * 4) + 5"))
    assert reward == 1.0 and terminated and info["metrics"]["success"] == 1.0


@pytest.mark.parametrize("expression, why", [("6 * 3 - 1", "not available"), ("3 + 4 + 6", "= 13, not 17"), ("4*4+1", "not available")])
def test_wrong_submission_ends_with_zero(countdown, expression, why):
    obs, reward, terminated, _, _ = countdown.step(call("submit_answer", expression=expression))
    assert reward == 0.0 and terminated and why in obs


@pytest.mark.parametrize(
    "response, error",
    [
        ('<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"</tool_call>', "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", '"name" string'),
        (call("sqrt", x=2), "unknown tool 'sqrt'"),
        (call("calculate"), "'expression' is a required property"),
        (call("calculate", expression=12), "expression: 12 is not of type 'string'"),
        (call("calculate", expression="1", extra=True), "('extra' was unexpected)"),
        ("calculate(3*4)", "no tool call found"),
    ],
)
def test_malformed_calls_are_format_errors_with_a_clear_observation(countdown, response, error):
    obs, reward, terminated, _, info = countdown.step(response)
    assert reward == pytest.approx(-0.1) and not terminated
    assert info["metrics"]["action_is_valid"] == 0.0 and info["observation_role"] == "user"
    assert error in obs


@pytest.mark.parametrize("expression", ["__import__('os')", "2 ** 10", "abs(-1)", "x + 1", "1 / 0", "", "[1]"])
def test_calculator_never_evaluates_code(countdown, expression):
    obs, reward, terminated, _, info = countdown.step(call("calculate", expression=expression))
    assert obs.startswith("Error:") and reward == 0.0 and not terminated


def test_arithmetic_is_exact():
    value, used = evaluate("(1/3) * 3 - -2")
    assert value == Fraction(3) and used == [1, 3, 3, 2]
    with pytest.raises(ArithmeticError_):
        evaluate("1e400 ** 2")


def test_sokoban_tool_env_full_episode_through_tool_messages():
    env = SokobanToolEnv(max_steps=50)
    obs, info = env.reset(seed=4)
    assert info["tools"][0]["function"]["name"] == "move"
    plan = solve(env.level)
    for direction in plan:
        obs, reward, terminated, _, info = env.step(call("move", direction=direction.lower()))
        assert info["observation_role"] == "tool" and obs == env.render_text()
    assert terminated and info["metrics"]["success"] == 1.0


def test_bad_enum_value_is_a_format_error():
    env = SokobanToolEnv(format_penalty=-0.15)
    env.reset(seed=4)
    _, reward, _, _, info = env.step(call("move", direction="north"))
    assert info["metrics"]["action_is_valid"] == 0.0 and reward == pytest.approx(-0.25)


def test_tool_call_arguments_may_be_a_json_string():
    parsed = parse_tool_call('<tool_call>{"name": "calculate", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>', TOOLS)
    assert parsed.valid and parsed.value.arguments == {"expression": "1+2"}
