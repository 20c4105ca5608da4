"""Every start command the README and docs/ show stays runnable: each is loaded and checked with --dry_run
(ROLL checkout paths point at our copy of ROLL's examples; placeholders and multi-node lines are left out)."""

import re
import shlex

import pytest

from roll.cli import main

from .configs.conftest import REPO

SCRIPTS = {"examples/start_agentic_pipeline.py": False, "examples/start_agentic_rollout_pipeline.py": True}


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every start command inside a ```bash block, continuation lines joined."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("#", 1)[0].strip()
                if any(script in line for script in SCRIPTS) and "NAME" not in line and "RANK=" not in line:
                    found.append((page.name, line))
    return found


COMMANDS = shown_commands()


def test_the_docs_show_start_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}:{c[-60:]}" for p, c in COMMANDS])
def test_a_shown_command_loads(page, command, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # as the start scripts have it: custom_env imports
    words = shlex.split(command.replace("~/ROLL/examples", str(REPO / "tests" / "fixtures" / "roll_examples")))
    script = next(w for w in words if w in SCRIPTS)
    args = words[words.index(script) + 1:]
    status = main([*args, "--dry_run"] if "--dry_run" not in args else args, search_roots=[REPO / "examples"],
                  rollout_only=SCRIPTS[script])
    err = capsys.readouterr().err
    assert status == 0, f"{page}: {command}\n{err[-2000:]}"
