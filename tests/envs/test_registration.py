"""Envs by id, and a user's env from outside the package."""

import gymnasium
import pytest

import envs
from envs.registration import SHIPPED, make_env

from ..configs.conftest import REPO


@pytest.mark.parametrize("env_id", sorted(SHIPPED))
def test_shipped_envs_are_registered_and_follow_the_api(env_id):
    env = gymnasium.make(env_id)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert isinstance(info["env_instruction"], str) and info["metrics"] == {}
    out = env.step("not an action")
    assert len(out) == 5 and isinstance(out[0], str) and isinstance(out[1], float)


def test_gymnasium_make_with_kwargs():
    env = gymnasium.make("sokoban", dim_room=(6, 6), num_boxes=1)
    assert env.unwrapped.dim_room == (6, 6)


@pytest.fixture
def user_module(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    yield
    for env_id in ("guess_number", "my_guess"):
        gymnasium.registry.pop(env_id, None)


def test_custom_env_registered_from_outside_and_created_by_id(user_module):
    from custom_env.guess_number import GuessNumberEnv

    gymnasium.register(id="my_guess", entry_point=GuessNumberEnv)
    env = gymnasium.make("my_guess", high=5, format_penalty=-0.1)
    obs, info = env.reset(seed=3)
    secret = env.unwrapped.secret
    assert env.step("<answer>nope</answer>")[1] == pytest.approx(-0.1)  # shared penalty logic applies
    _, reward, terminated, _, info = env.step(f"<answer>{secret}</answer>")
    assert reward == 1.0 and terminated and info["metrics"]["success"] == 1.0


def test_custom_env_from_an_entry_point_in_config(user_module):
    env = make_env("guess_number", entry_point="custom_env.guess_number:GuessNumberEnv", high=3)
    assert env.reset(seed=0)[0] == "Make your first guess."
    assert "guess_number" in gymnasium.registry


def test_env_type_may_be_an_import_path(user_module):
    env = make_env("custom_env.guess_number:GuessNumberEnv", high=3)
    assert type(env).__name__ == "GuessNumberEnv"


def test_clear_errors_for_unknown_envs_and_arguments():
    with pytest.raises(ValueError, match="'webshop' is not registered"):
        make_env("webshop")
    with pytest.raises(ValueError, match="does not take 'dim_rom'"):
        make_env("sokoban", dim_rom=(6, 6))
    with pytest.raises(ValueError, match="cannot import 'no_such_pkg.mod'"):
        make_env("thing", entry_point="no_such_pkg.mod:Env")
    assert envs.make_env is make_env


def test_the_faulty_env_raises_and_hangs_when_told():
    import time

    from envs.faults import InjectedFault
    from envs.registration import make_env

    env = make_env("faulty", None, raise_rate=1.0, inner_config={"dim_room": [6, 6], "num_boxes": 1})
    env.reset(seed=1)
    with pytest.raises(InjectedFault):
        env.step("<answer>Up</answer>")
    env = make_env("faulty", None, hang_rate=1.0, hang_s=0.2)
    env.reset(seed=1)
    start = time.perf_counter()
    _, _, _, _, info = env.step("<answer>Up</answer>")
    assert time.perf_counter() - start >= 0.2 and info["metrics"]["action_is_valid"] == 1.0
