"""Envs never raise on model output and stay fast on huge responses (issue 14, findings 3 and 4)."""

import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.frozen_lake import FrozenLakeEnv
from envs.parsing import (
    DEFAULT_ACTION_PATTERN,
    MAX_RESPONSE_CHARS,
    THINK_ACTION_PATTERN,
    _think_answer,
    json_depth,
)
from envs.sokoban.env import SokobanEnv
from envs.tools.countdown import CountdownEnv
from envs.tools.sokoban_tool import SokobanToolEnv

ENVS = {"sokoban": SokobanEnv, "frozen_lake": FrozenLakeEnv, "countdown": CountdownEnv, "sokoban_tool": SokobanToolEnv}


def call(name, arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


ADVERSARIAL = [
    "<tool_call>" + "[" * 100_000 + "</tool_call>",  # JSON bomb: RecursionError before
    '<tool_call>{"name": "calculate", "arguments": {"expression": ' + "9" * 5000 + "}}</tool_call>",  # int too long
    call("calculate", {"expression": "1e309"}),  # OverflowError before
    call("calculate", {"expression": "1e308/1e-308"}),
    call("submit_answer", {"expression": "1e308*1e308"}),
    call("calculate", {"expression": "(" * 150 + "1" + ")" * 49}),
    call("move", {"direction": "UP"}),
    call("move", {"direction": ["Up"]}),
    call("move", {"direction": "Up", "extra": {"a": [1, 2, {"b": None}]}}),
    '<tool_call>{"name": "move", "arguments": "{\\"direction\\": \\"Left\\"}"}</tool_call>',
    '<tool_call>{"name": "move", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    "<answer>" * 16_000,  # 128 KB: quadratic before
    "<tool_call>" * 16_000,
    "<answer>" + "x" * 1_000_000 + "</answer>",
    "\x00\udcff<answer>Up</answer>",
    "",
]


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("response", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_responses_are_penalised_invalid_actions_never_errors(name, response):
    env = ENVS[name]()
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(response)
    assert isinstance(obs, str) and len(obs) < 2000  # the observation quotes at most a short prefix
    if not info["metrics"]["action_is_valid"]:
        assert reward == env.format_penalty + env.invalid_step_reward


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("unit", ["<answer>", "<tool_call>", "[", "{\"a\":", "<|im_start|>", "9"])
def test_a_one_megabyte_response_takes_under_50_ms(name, unit):
    env = ENVS[name]()
    env.reset(seed=1)
    response = unit * (1_000_000 // len(unit))
    env.step(response)  # warm-up (imports, regex compilation)
    env.reset(seed=1)
    start = time.perf_counter()
    env.step(response)
    assert time.perf_counter() - start < 0.05


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(ENVS)), text=st.text(max_size=300), wrap=st.sampled_from(["", "answer", "tool"]))
def test_fuzzed_responses_never_raise(name, text, wrap):
    env = ENVS[name]()
    env.reset(seed=5)
    if wrap == "answer":
        text = f"<answer>{text}</answer>"
    elif wrap == "tool":
        text = f'<tool_call>{{"name": "calculate", "arguments": {{"expression": {json.dumps(text)}}}}}</tool_call>'
    env.step(text)


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth('{"a": "[[[[", "b": [1, {"c": 2}]}') == 3
    assert json_depth('"\\"[["') == 0
    assert MAX_RESPONSE_CHARS >= 4096


THINK_UNITS = ["<think></think><answer>", "<think>", "</think> <answer>", "<think></think>\n\n", "</answer><think>"]


@pytest.mark.parametrize("name", ["sokoban", "frozen_lake"])
@pytest.mark.parametrize("pattern", [DEFAULT_ACTION_PATTERN, THINK_ACTION_PATTERN], ids=["answer", "think"])
@pytest.mark.parametrize("unit", THINK_UNITS + ["<answer>"])
def test_every_shipped_answer_format_parses_a_megabyte_in_under_50_ms(name, pattern, unit):
    env = ENVS[name](action_pattern=pattern)
    env.reset(seed=1)
    response = unit * (1_000_000 // len(unit))
    env.step(response)  # warm-up
    env.reset(seed=1)
    start = time.perf_counter()
    env.step(response)
    assert time.perf_counter() - start < 0.05


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "up", "<", "think>"]),
                max_size=14))
def test_the_linear_think_parser_captures_what_the_regex_captures(parts):
    text = "".join(parts)
    match = re.search(THINK_ACTION_PATTERN, text, flags=re.DOTALL)
    assert _think_answer(text) == (match.group(2) if match else None)
