"""ROLL's ``tool_wrapper``: tools in front of any text env.

    tool_wrapper:
      wrapper_args: {tool_reward: 0, tool_success_reward: 0, max_tool_uses: 1}
      tool_configs: [{tool_id: python_code, tool_args: {timeout: 5, sandbox_type: none}}]

Each turn the model's reply is offered to the tools in order (while fewer than ``max_tool_uses`` calls were
made this episode); the first tool that parses a call and runs it without error answers, else the last
one that parsed. A tool call earns ``tool_reward``, plus ``tool_success_reward`` when it ran without error;
its result comes back as a ``tool`` message and the episode goes on. A reply no tool parses goes to the env.
The instructions of the tools are appended to the first observation. ``tool_use_counter`` and
``tool_success_counter`` are logged per episode (their last value).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

TOOL_IDS = {
    "python_code": "envs.tools.python_code:PythonCodeTool",
    "search": "envs.tools.search:SearchTool",
}
REFUSED_TOOL_IDS = {"mcp": "MCP tools are not shipped"}
LIMIT_NOTE = "\n\nThat was the last tool call this episode allows: give the final answer now."


def make_tool(tool_id: str, tool_args: Mapping[str, Any] | None = None) -> Any:
    from envs.registration import load_entry_point

    if tool_id not in TOOL_IDS:
        why = REFUSED_TOOL_IDS.get(tool_id, f"tool id {tool_id!r} is not shipped")
        raise ValueError(f"{why} (shipped tool ids: {', '.join(TOOL_IDS)})")
    return load_entry_point(TOOL_IDS[tool_id])(**dict(tool_args or {}))


def make_tools(tool_wrapper: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    configs = tool_wrapper.get("tool_configs") or []
    if not configs:
        raise ValueError("tool_configs names no tool")
    tools = [make_tool(str(c.get("tool_id")), c.get("tool_args")) for c in configs]
    return tools, dict(tool_wrapper.get("wrapper_args") or {})


class ToolEnvWrapper(gym.Wrapper):
    def __init__(self, env: gym.Env, tools: list[Any], tool_reward: float = 0.0, tool_success_reward: float = 0.0,
                 max_tool_uses: int | None = 10) -> None:
        super().__init__(env)
        self.tools = tools
        self.tool_reward = float(tool_reward)
        self.tool_success_reward = float(tool_success_reward)
        self.max_tool_uses = float("inf") if max_tool_uses is None else int(max_tool_uses)
        self.tool_uses = self.tool_successes = 0
        base = getattr(env, "metric_aggregation", None)
        self.metric_aggregation = dict(base) if isinstance(base, dict) else {}
        self.metric_aggregation.update({"tool_use_counter": "last", "tool_success_counter": "last"})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.tool_uses = self.tool_successes = 0
        observation, info = self.env.reset(seed=seed, options=options)
        guide = "\n".join(t.instruction_string() for t in self.tools)
        if len(self.tools) > 1:
            guide = f"Tools you can call:\n{guide}"
        info = dict(info)
        info["metrics"] = {**dict(info.get("metrics") or {}), **self._counters()}
        return f"{observation}\n{guide}", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = None
        if self.tool_uses < self.max_tool_uses:
            for tool in self.tools:
                parsed, has_error, observation, _ = tool.execute_action(action)
                if parsed:
                    answer = (tool, has_error, observation)
                    if not has_error:
                        break
        if answer is None:
            observation, reward, terminated, truncated, info = self.env.step(action)
            info = dict(info)
            info["metrics"] = {**dict(info.get("metrics") or {}), **self._counters()}
            return observation, reward, terminated, truncated, info
        tool, has_error, observation = answer
        self.tool_uses += 1
        reward = self.tool_reward + (0.0 if has_error else self.tool_success_reward)
        self.tool_successes += not has_error
        if self.tool_uses >= self.max_tool_uses:
            observation += LIMIT_NOTE
        metrics = {"action_is_valid": 1.0, "format_penalty": 0.0, **self._counters()}
        info = {"metrics": metrics, "observation_role": "tool", "use_tool": True, "tool_type": tool.tool_type,
                "tool_error": bool(has_error)}
        return observation, reward, False, False, info

    def _counters(self) -> dict[str, float]:
        return {"tool_use_counter": float(self.tool_uses), "tool_success_counter": float(self.tool_successes)}


def wrap_tools(env: gym.Env, tool_wrapper: Mapping[str, Any]) -> ToolEnvWrapper:
    tools, wrapper_args = make_tools(tool_wrapper)
    unknown = sorted(set(wrapper_args) - {"tool_reward", "tool_success_reward", "max_tool_uses"})
    if unknown:
        raise ValueError(f"wrapper_args has no key {unknown[0]!r} (keys: tool_reward, tool_success_reward, max_tool_uses)")
    return ToolEnvWrapper(env, tools, **wrapper_args)
