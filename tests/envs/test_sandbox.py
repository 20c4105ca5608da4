"""The python tool's sandbox: hostile code ends as a tool error observation, the run goes on, and nothing of
the run is touched (issue 26). Each case runs the real sandbox: a separate process with limits."""

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from envs.tools.python_code import PythonCodeTool
from envs.tools.sandbox import SandboxLimits, check_sandbox, run_python

HAVE_BWRAP = shutil.which("bwrap") is not None


def call(code: str, **tool_args) -> tuple[bool, bool, str]:
    tool = PythonCodeTool(**{"timeout": 3, **tool_args})
    parsed, has_error, observation, _ = tool.execute_action(f"Let me compute.\n<code>\n{code}\n</code>")
    return parsed, has_error, observation


def leftover_sandboxes() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("roll-sandbox-*")}


@pytest.mark.parametrize("sandbox_type", ["none", "bwrap"])
def test_code_runs_and_its_output_comes_back(sandbox_type):
    if sandbox_type == "bwrap" and not HAVE_BWRAP:
        pytest.skip("bwrap is not installed: its refusal is tested below")
    parsed, has_error, observation = call("import math\nprint(math.factorial(10))", sandbox_type=sandbox_type)
    assert (parsed, has_error) == (True, False) and observation == "Code execution result: 3628800\n\n"


@pytest.mark.parametrize("name, code, words", [
    ("infinite loop", "while True:\n    pass", "ran longer than 3 s"),
    ("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", ""),
    ("4 GB allocation", "block = bytearray(4 * 1024 ** 3)\nprint('allocated')", "MemoryError"),
    ("10 MB print", "print('x' * 10_000_000)", "File too large"),
])
def test_hostile_code_ends_as_a_tool_error(name, code, words):
    before = leftover_sandboxes()
    parsed, has_error, observation = call(code)
    assert parsed and has_error and words in observation, observation[-300:]
    assert "allocated" not in observation
    assert len(observation) < 70_000  # the output cap (64 KiB by default) holds
    assert leftover_sandboxes() <= before  # its temporary folder is gone


def test_the_code_cannot_start_processes_but_can_use_threads():
    code = ("import os, subprocess, threading\ntry:\n    os.fork()\nexcept OSError as e:\n    print('fork', e.errno)\n"
            "try:\n    subprocess.run(['true'])\nexcept OSError as e:\n    print('spawn', e.errno)\n"
            "out = []\nt = threading.Thread(target=out.append, args=(7,))\nt.start()\nt.join()\nprint('thread', out)")
    _, has_error, observation = call(code)
    assert not has_error and "fork 1" in observation and "spawn 1" in observation and "thread [7]" in observation


def test_code_cannot_kill_the_run():
    """The code sees no process of the run: a kill of this test's pid (or its parent's) reaches nothing."""
    me = os.getpid()
    code = (f"import os, signal\nfor pid in ({me}, os.getppid()):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "        print('sent', pid)\n    except OSError as e:\n        print('refused', pid, type(e).__name__)")
    parsed, _, observation = call(code)
    assert parsed and f"refused {me}" in observation  # and this test is still running
    assert os.getpid() == me


def test_the_code_gets_a_scrubbed_environment_and_no_network(monkeypatch):
    monkeypatch.setenv("ROLL_SECRET_TOKEN", "hunter2")
    _, _, observation = call("import os\nprint(sorted(os.environ))\nprint(os.environ.get('ROLL_SECRET_TOKEN'))")
    assert "ROLL_SECRET_TOKEN" not in observation and "hunter2" not in observation
    _, has_error, observation = call("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\nprint('connected')")
    assert has_error and "connected" not in observation


def test_the_sandbox_holds_its_limits_against_code_that_raises_them():
    code = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\nprint('raised')"
    _, has_error, observation = call(code)
    assert has_error and "raised" not in observation


def test_bwrap_hides_the_runs_files_or_is_refused(tmp_path):
    checkpoint = tmp_path / "output" / "checkpoints" / "step_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_text("weights")
    if not HAVE_BWRAP:
        with pytest.raises(ValueError, match="bubblewrap"):
            PythonCodeTool(sandbox_type="bwrap")
        return
    code = f"import os\nprint(os.path.exists({str(checkpoint)!r}))\nprint(open({str(checkpoint / 'model.safetensors')!r}).read())"
    parsed, has_error, observation = call(code, sandbox_type="bwrap")
    assert parsed and has_error and "False" in observation and "weights" not in observation
    assert (checkpoint / "model.safetensors").read_text() == "weights"


def test_an_unknown_sandbox_type_is_refused():
    with pytest.raises(ValueError, match="sandbox_type 'docker'"):
        check_sandbox("docker")


def test_a_reply_without_code_is_not_a_tool_call():
    tool = PythonCodeTool()
    assert tool.execute_action("the answer is \\boxed{4}")[:2] == (False, True)
    assert tool.parse("```python\nprint(1)\n``` and <code>print(2)</code>") == ("print(1)", True)


def test_a_killed_process_is_reported_with_its_signal():
    result = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", SandboxLimits(timeout=3))
    assert not result.ok and signal.SIGTERM.name in result.stderr
