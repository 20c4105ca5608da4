"""Every entry of the shipped env catalogs builds its env from its env_config and runs a step."""

import pytest
from omegaconf import OmegaConf

from envs.registration import make_env

from ..configs.conftest import EXAMPLE_CONFIG


def _entries():
    for catalog in ("traj_envs.yaml", "step_envs.yaml"):
        cfg = OmegaConf.to_container(OmegaConf.load(EXAMPLE_CONFIG / catalog), resolve=True)
        for tag, entry in cfg["custom_env"].items():
            yield pytest.param(entry, id=f"{catalog}:{tag}")


@pytest.mark.parametrize("entry", list(_entries()))
def test_catalog_entry_builds_and_steps(entry):
    env = make_env(entry["env_type"], **entry["env_config"])
    obs, info = env.reset(seed=0)
    assert obs and info["env_instruction"]
    template = entry["agent_template"]
    template.format(turn_idx=1, observation=obs, actions_left=3, max_response_length=64)
    _, reward, _, _, info = env.step("?")
    assert info["metrics"]["action_is_valid"] == 0.0
    assert info["metrics"]["format_penalty"] == entry["env_config"]["format_penalty"]
