"""GEM's data sets read offline, ROLL's search tool against a real local retrieval server, and GEM envs under
adversarial model output (issue 26)."""

import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.gem_adapter import GemEnv
from envs.problem_sets import problems, write_jsonl
from envs.registration import make_env
from envs.task_data import DataUnavailable, load_problems
from envs.tools.search import SearchTool
from envs.tools.tool_wrapper import wrap_tools
from roll.cli import main

from .retrieval_server import RetrievalServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- data sets, offline
def test_a_local_jsonl_serves_the_same_problem_for_the_same_seed(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", problems(40, seed=3))
    envs = [make_env("roll_math", dataset_name=str(data)) for _ in range(2)]
    assert envs[0].reset(seed=11)[0] == envs[1].reset(seed=11)[0]
    firsts = {envs[0].reset(seed=s)[0] for s in range(10)}
    assert len(firsts) > 5
    env = envs[0]
    env.reset(seed=4)
    _, reward, terminated, truncated, info = env.step(f"The total is \\boxed{{{env.gem.answer}}}.")
    assert (reward, terminated, truncated) == (1.0, True, False) and info["metrics"]["success"] == 1.0
    env.reset(seed=4)
    _, reward, _, _, info = env.step("no box here")
    assert reward == 0.0 and info["metrics"]["action_is_valid"] == 0.0


def test_a_hub_id_in_the_local_cache_is_found_and_split_by_file_name(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "datasets--someone--arith" / "snapshots" / "0123abc" / "data"
    write_jsonl(snapshot / "train-00000-of-00001.jsonl", problems(12, seed=1))
    write_jsonl(snapshot / "test-00000-of-00001.jsonl", problems(5, seed=2))
    assert len(load_problems("someone/arith")) == 12
    assert len(load_problems("someone/arith", "test")) == 5
    with pytest.raises(DataUnavailable, match="has no split .dev."):
        load_problems("someone/arith", "dev")


def test_a_missing_data_set_stops_the_load_in_one_line_naming_the_key(tmp_path, capsys):
    entry = "{env_type: roll_math, env_config: {dataset_name: nobody/not-here}}"
    status = main(["--config_name", "agentic_gem_guess_number", "--dry_run", f"+custom_envs.M={entry}",
                   "train_env_manager.tags=[M]", "val_env_manager.tags=[M]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert err[0].startswith("config error: custom_envs.M.env_config.dataset_name: 'nobody/not-here'")


def test_wrong_field_names_are_named(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", problems(3))
    with pytest.raises(DataUnavailable, match="question_key"):
        make_env("roll_math", dataset_name=str(data), question_key="prompt")


# --- the search tool
def test_search_returns_bm25_passages_from_a_local_server():
    with RetrievalServer() as server:
        tool = SearchTool(search_url=server.url, topk=2)
        assert tool.probe() is None
        parsed, has_error, observation, _ = tool.execute_action("<think>hmm</think><search>highest mountain Australia</search>")
    assert parsed and not has_error
    assert observation.startswith("\n\n<information>Doc 1(Title: Mount Kosciuszko)") and "Doc 3" not in observation


def test_an_unreachable_or_slow_server_is_a_tool_error_within_the_timeout():
    tool = SearchTool(search_url=f"http://127.0.0.1:{free_port()}/retrieve", timeout=1)
    assert "nothing answers" in tool.probe()
    start = time.perf_counter()
    parsed, has_error, observation, _ = tool.execute_action("<search>okapi</search>")
    assert parsed and has_error and "search failed" in observation and time.perf_counter() - start < 1.5
    with RetrievalServer(delay_s=3) as server:
        slow = SearchTool(search_url=server.url, timeout=0.5)
        start = time.perf_counter()
        parsed, has_error, observation, _ = slow.execute_action("<search>okapi</search>")
        assert parsed and has_error and time.perf_counter() - start < 1.5


def test_rolls_search_example_loads_with_a_running_server_and_local_data(tmp_path, capsys, monkeypatch):
    from tests.pipeline.roll_examples_support import roll_tree

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    root = roll_tree(tmp_path)
    data = write_jsonl(tmp_path / "qa.jsonl", [{"problem": "Which river ends in the Black Sea?", "answer": "Danube"}])
    with RetrievalServer() as server:
        status = main(["--config_path", str(root / "qwen3_agentic_gem"), "--config_name", "gem_math_hotpotqa_search",
                       "--dry_run", f"gem_qa.HotpotQA_with_search.tool_wrapper.tool_configs.0.tool_args.search_url={server.url}",
                       f"gem_qa.HotpotQA_with_search.env_config.dataset_name={data}"])
    out = capsys.readouterr()
    assert status == 0, out.err


def test_a_search_wrapped_qa_episode_answers_from_the_corpus(tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "Which river flows through ten countries?", "answer": "Danube"}])
    with RetrievalServer() as server:
        env = wrap_tools(make_env("roll_qa", dataset_name=str(data)),
                         {"wrapper_args": {"tool_success_reward": 0.2, "max_tool_uses": 1},
                          "tool_configs": [{"tool_id": "search", "tool_args": {"search_url": server.url}}]})
        observation, info = env.reset(seed=0)
        assert "Which river flows through ten countries?" in observation and "<search>" in observation
        observation, reward, terminated, _, info = env.step("<search>river ten countries</search>")
        assert "Danube" in observation and reward == pytest.approx(0.2) and not terminated
        assert info["observation_role"] == "tool"
        _, reward, terminated, _, info = env.step("<answer>Danube</answer>")
    assert reward == 1.0 and terminated and info["metrics"]["tool_use_counter"] == 1.0


# --- GEM envs under adversarial output
GEM_IDS = ["game:GuessTheNumber-v0", "game:Mastermind-v0", "game:Minesweeper-v0", "game:FifteenPuzzle-v0",
           "game:TowerofHanoi-v0", "game:Sudoku-v0-easy", "rg:letter_counting"]
HOSTILE = ["", "\\boxed{", "\\boxed{" * 1000, "\\boxed{}" * 1000, "\\boxed{" + "9" * 5000 + "}", "\x00\udcff\\boxed{3}",
           "<|im_end|>\\boxed{1 2 3 4}", "[" * 10_000, "\\boxed{up}"]


@pytest.mark.parametrize("env_id", GEM_IDS)
def test_gem_envs_never_raise_on_model_output_and_stay_fast(env_id):
    env = GemEnv(env_id)
    for text in HOSTILE:
        env.reset(seed=3)
        observation, reward, terminated, truncated, info = env.step(text)
        assert isinstance(observation, str) and "action_is_valid" in info["metrics"]
    env.reset(seed=1)
    big = "x" * 1_000_000
    env.step(big)  # warm-up
    env.reset(seed=1)
    start = time.perf_counter()
    env.step(big)
    assert time.perf_counter() - start < 0.05


def test_a_format_penalty_adds_to_gems_own_reward():
    env = GemEnv("game:GuessTheNumber-v0", format_penalty=-0.5)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("no guess")
    assert reward == pytest.approx(-0.6) and terminated and info["metrics"]["format_penalty"] == -0.5


def test_an_unknown_gem_id_is_named_with_close_ones():
    with pytest.raises(ValueError, match="did you mean game:GuessTheNumber-v0"):
        make_env("game:GuessTheNumbr-v0")


def test_a_code_env_runs_the_models_program_on_its_tests_in_the_sandbox(tmp_path):
    tests = {"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]}
    data = write_jsonl(tmp_path / "code.jsonl", [{"problem": "Print the sum of two integers.", "tests": tests}])
    for env_type in ("roll_code", "code:CodeContest"):
        env = make_env(env_type, dataset_name=str(data), timeout=1)
        env.reset(seed=0)
        right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
        assert env.step(right)[1] == 1.0
        env.reset(seed=0)
        assert env.step("```python\nprint(5)\n```")[1] == 0.0  # passes one test, not both
        env.reset(seed=0)
        _, reward, _, _, info = env.step("```python\nwhile True:\n    pass\n```")
        assert reward == 0.0 and info["metrics"]["action_is_valid"] == 1.0
        env.reset(seed=0)
        _, reward, _, _, info = env.step("no code")
        assert reward == 0.0 and info["metrics"]["action_is_valid"] == 0.0


FUZZ_ENVS: dict = {}  # one env per id across the examples (building one costs more than stepping it)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_id=st.sampled_from(GEM_IDS), text=st.text(max_size=200), boxed=st.booleans())
def test_fuzzed_replies_never_raise_in_gem_envs(env_id, text, boxed):
    env = FUZZ_ENVS.setdefault(env_id, GemEnv(env_id))
    env.reset(seed=2)
    _, _, _, _, info = env.step(f"\\boxed{{{text}}}" if boxed else text)
    assert info["metrics"]["action_is_valid"] in (0.0, 1.0)

