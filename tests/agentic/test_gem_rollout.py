"""GEM envs under our env managers: token-exact rows with GEM's {suffix}, ROLL's step-concatenating layout,
ROLL's tool wrapper (python code) and GEM's own metrics, with a scripted policy."""

import threading

import pytest
from transformers import AutoTokenizer

from envs.problem_sets import problems, write_jsonl
from envs.registration import make_env
from roll.agentic.generation import ScriptedPolicy
from roll.configs.loading import load_config
from roll.strategies.base import Generation

from .support import RecordingBackend
from .test_rollout import assert_token_exact, rollout

GUESSES = [f"\\boxed{{{n}}}" for n in range(1, 11)] + ["I think five"]
CONCAT = "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager"


@pytest.fixture
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def config(*overrides):
    base = ["rollout_batch_size=8", "val_batch_size=4", "train_env_manager.num_env_groups=2", "train_env_manager.group_size=4",
            "train_env_manager.num_groups_partition=[2]", "sequence_length=4096", "render_save_dir=null",
            "val_env_manager.num_env_groups=4", "val_env_manager.num_groups_partition=[4]",
            "train_env_manager.group_filter_cls=null", "max_tokens_per_step=16", "num_demonstrations=0"]
    return load_config("agentic_gem_guess_number", overrides=base + list(overrides)).config


def test_guess_the_number_rows_are_token_exact_and_render_gems_suffix(tok):
    recorder = RecordingBackend(ScriptedPolicy(tok, GUESSES, seed=2))
    r, template = rollout(config(), tok, recorder)
    result = r.collect(8, step=0)
    assert_token_exact(result, template, recorder)
    long = max(result.trajectories, key=lambda t: len(t.turn_rewards))
    users = [m["content"] for m in long.messages if m["role"] == "user"]
    assert users[0].startswith("You are playing Guess The Number") and users[0].endswith("\nEnter your next guess.")
    if len(users) > 1:  # a later turn: GEM's hint, then its suffix
        assert users[1].startswith("At turn 1, you guessed") and users[1].endswith("\nEnter your next guess.")
    m = result.metrics
    for key in ("action_is_valid", "success", "format_penalty", "num_actions"):
        assert f"rollout/GuessTheNumber/{key}" in m, key
    # the scripted replies hold a \boxed{} answer 10 times in 11
    assert 0.5 < m["rollout/GuessTheNumber/action_is_valid"] <= 1.0


def test_a_group_shares_its_number_however_the_threads_interleave():
    """GEM seeds Python's global random in reset: without the adapter's lock, concurrent resets race (switching
    threads every microsecond, 88 of 200 seeds drew differing numbers across 8 envs without it)."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    envs = [make_env("game:GuessTheNumber-v0", min_number=1, max_number=1000, max_turns=3) for _ in range(8)]
    numbers = {}

    def play(i):
        for seed in range(100):
            envs[i].reset(seed=seed)
            numbers.setdefault(seed, set()).add(envs[i].gem.game_number)

    threads = [threading.Thread(target=play, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert all(len(v) == 1 for v in numbers.values())
    assert len({next(iter(v)) for v in numbers.values()}) > 10  # and the seeds do pick different numbers


def test_step_concat_prompt_is_the_recent_observations_and_the_current_one(tok):
    cfg = config(f"custom_envs.GuessTheNumber.env_manager_cls={CONCAT}", "+custom_envs.GuessTheNumber.history_length=3",
                 "custom_envs.GuessTheNumber.agent_system_template=null",
                 "custom_envs.GuessTheNumber.agent_template='Observation:\n{history}\n{current_observation}\nGuess:'",
                 "adv_estimator=step_reinforce")
    recorder = RecordingBackend(ScriptedPolicy(tok, [f"\\boxed{{{n}}}" for n in range(1, 11)], seed=4))
    r, template = rollout(cfg, tok, recorder)
    result = r.collect(8, step=0)
    long = max(result.trajectories, key=lambda t: len(t.steps))
    assert len(long.steps) >= 3
    for rec in long.steps:
        shown = [s.observation for s in long.steps[max(0, rec.step_idx - 2): rec.step_idx]]  # history_length 3: 2 past
        user = "Observation:\n" + "\n".join(shown) + f"\n{rec.observation}\nEnter your next guess.\nGuess:"
        prompt = template.prompt_ids([{"role": "user", "content": user}])  # no system message: the template's is null
        assert rec.row.input_ids[: len(prompt)] == prompt
        sampled = rec.row.input_ids[len(prompt):]
        assert rec.row.response_mask == [0] * len(prompt) + [1] * len(sampled)
        assert any(g.token_ids == sampled for p, g in recorder.records if p == prompt)
    assert len(result.batch) == sum(len(t.steps) for t in result.trajectories)


class CodeThenAnswer:
    """Runs code on the first turn of an episode, answers once the code's result is in the conversation."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, rank, prompts, params):
        out = []
        for prompt in prompts:
            seen = "Code execution result: 42" in self.tokenizer.decode(prompt)
            ids = list(self.tokenizer("\\boxed{42}" if seen else "<code>print(6 * 7)</code>", add_special_tokens=False)["input_ids"])
            ids.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


def test_python_tool_calls_answer_as_tool_messages_with_rolls_rewards(tok, tmp_path):
    data = write_jsonl(tmp_path / "arith.jsonl", problems(32))
    entry = ("{env_type: roll_math, max_steps: 3, max_tokens_per_step: 32, agent_template: '{observation}', "
             f"env_config: {{dataset_name: '{data}'}}, "
             "tool_wrapper: {wrapper_args: {tool_reward: 0.05, tool_success_reward: 0.1, max_tool_uses: 1}, "
             "tool_configs: [{tool_id: python_code, tool_args: {timeout: 5, sandbox_type: none}}]}}")
    cfg = config(f"+custom_envs.Arith={entry}", "train_env_manager.tags=[Arith]", "val_env_manager.tags=[Arith]")
    recorder = RecordingBackend(CodeThenAnswer(tok))
    r, template = rollout(cfg, tok, recorder)
    result = r.collect(8, step=0)
    assert_token_exact(result, template, recorder)
    with_tool = [t for t in result.trajectories if any(m["role"] == "tool" for m in t.messages)]
    assert with_tool
    for t in with_tool:
        tool_msg = next(m for m in t.messages if m["role"] == "tool")
        assert tool_msg["content"].startswith("Code execution result: 42")
        assert t.turn_rewards[0] == pytest.approx(0.15)  # tool_reward + tool_success_reward
        assert t.metrics["tool_use_counter"] == 1.0 and t.metrics["tool_success_counter"] == 1.0
    m = result.metrics
    assert m["rollout/Arith/tool_use_counter"] > 0 and "rollout/Arith/raw_reward" in m


def test_a_gem_env_that_raises_is_counted_and_its_episode_retried(tok, monkeypatch):
    from envs.gem_adapter import GemEnv

    calls = {"n": 0}
    real_step = GemEnv.step

    def flaky_step(self, action):
        calls["n"] += 1
        if calls["n"] <= 3:  # the first three steps of the rollout fail (max_env_retries is 3)
            raise RuntimeError("GEM env broke")
        return real_step(self, action)

    monkeypatch.setattr(GemEnv, "step", flaky_step)
    r, _ = rollout(config(), tok, ScriptedPolicy(tok, GUESSES, seed=5))
    result = r.collect(8, step=0)
    assert result.metrics["rollout/env_errors"] == 3
    assert len(result.trajectories) == 8  # every episode was retried on a fresh env and finished


def test_an_env_config_seed_becomes_the_group_seed_as_in_roll():
    from roll.agentic.rollout import build_slots

    cfg = config("+custom_envs.GuessTheNumber.env_config.seed=7", "seed=100")
    slots = build_slots(cfg.custom_envs, cfg.train_env_manager, cfg.seed)
    assert [s.entry["env_config"]["seed"] for s in slots] == [100 + s.group_id for s in slots]
    assert {s.group_id for s in slots} == {0, 1}


def test_gem_demonstrations_show_the_answer_format():
    from envs.gem_adapter import GemEnv, has_boxed_answer

    env = GemEnv("game:GuessTheNumber-v0", min_number=1, max_number=10, max_turns=4)
    pairs = env.demonstrations(3, seed=5)
    assert len(pairs) == 3 and all(obs.startswith("You are playing Guess The Number") for obs, _ in pairs)
    assert all(has_boxed_answer(reply) for _, reply in pairs)
    assert pairs == GemEnv("game:GuessTheNumber-v0", min_number=1, max_number=10, max_turns=4).demonstrations(3, seed=5)
