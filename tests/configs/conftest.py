import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = REPO / "examples" / "config"


@pytest.fixture
def examples_tree(tmp_path: Path) -> Path:
    """A copy of examples/config plus an empty sibling folder, as a user's checkout has them."""
    root = tmp_path / "examples"
    shutil.copytree(EXAMPLE_CONFIG, root / "config")
    (root / "my_exp").mkdir()
    return root


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# The smallest runnable config (every role on CPU slot 0); tests add keys to it.
MINIMAL = """
sequence_length: 256
rollout_batch_size: 4
val_batch_size: 4
adv_estimator: grpo
init_kl_coef: 0.0
custom_envs:
  SimpleSokoban:
    env_type: sokoban
train_env_manager:
  num_env_groups: 2
  group_size: 2
  tags: [SimpleSokoban]
val_env_manager:
  num_env_groups: 4
  group_size: 1
  tags: [SimpleSokoban]
actor_train:
  strategy_args:
    strategy_name: deepspeed_train
  device_mapping: "[0]"
actor_infer:
  strategy_args:
    strategy_name: hf_infer
  device_mapping: "[0]"
"""
