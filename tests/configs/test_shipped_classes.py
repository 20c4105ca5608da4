"""The preflight takes our own class paths from roll.configs.shipped.SHIPPED_CLASSES without importing them;
each must import and be of the kind it is listed as, and a dry run of the default must stay free of torch."""

import subprocess
import sys

import pytest

from envs.registration import load_entry_point
from roll.configs.shipped import SHIPPED_CLASSES
from roll.preflight import class_bases

from .conftest import REPO


@pytest.mark.parametrize("path", sorted(SHIPPED_CLASSES))
def test_a_listed_class_is_of_its_kind(path):
    load_entry_point(path, class_bases(SHIPPED_CLASSES[path]))


def test_a_listed_class_of_the_wrong_kind_is_still_refused():
    from roll.configs.errors import ConfigError
    from roll.preflight import _check_class_path

    with pytest.raises(ConfigError, match="train_env_manager.group_filter_cls"):
        _check_class_path("train_env_manager.group_filter_cls", "roll.workers.actor_train.ActorTrainWorker", "group_filter")


_DRY_RUN = """
import sys
from pathlib import Path
sys.argv = ['start', '--config_name', 'agentic_sokoban', '--dry_run']
from roll.cli import main
code = main(search_roots=[Path('examples').resolve()])
print(code, sorted(m for m in ('torch', 'ray', 'transformers', 'deepspeed') if m in sys.modules))
"""


def test_dry_run_of_the_default_imports_neither_torch_nor_ray():
    out = subprocess.run([sys.executable, "-c", _DRY_RUN], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout[-2000:]
