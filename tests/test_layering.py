"""The import rules of the architecture: configs load without torch or Ray (instant --dry_run and
config errors); the algorithms use torch only; envs use nothing from roll."""

import subprocess
import sys

import pytest

from .configs.conftest import REPO

CASES = {
    "roll.configs.loading": {"torch", "ray", "transformers", "deepspeed"},
    "roll.cli": {"torch", "ray", "transformers", "deepspeed"},
    "roll.algorithms": {"ray", "transformers", "deepspeed", "roll.configs", "omegaconf", "hydra"},
    "envs": {"roll", "torch", "ray"},
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_module_does_not_import_forbidden_packages(module):
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in {sorted(CASES[module])!r} if m in sys.modules)\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
