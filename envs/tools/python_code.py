"""ROLL's ``python_code`` tool: the model writes a code block, the code runs in the sandbox
(``envs.tools.sandbox``) and what it printed comes back as the next observation.

``tool_args`` as in ROLL's configs: ``timeout`` (seconds), ``sandbox_type`` (``none`` or ``bwrap``),
``keep_error_last_line`` (report only the last line of an error), ``tool_instruction`` (replaces the text
that tells the model how to call the tool), ``patterns`` (regular expressions whose first group is the
code; default: ``<code>...</code>`` and a fenced python block). Our own limits: ``memory_mb``,
``max_processes``, ``max_output_bytes``.
"""

from __future__ import annotations

import re

from envs.tools.sandbox import SandboxLimits, check_sandbox, run_python

DEFAULT_PATTERNS = (r"<code>(.*?)</code>", r"```\n?python(.*?)```")
INSTRUCTION = (
    "You may run Python to check a calculation. Put a complete program (imports included) between <code> and "
    "</code>, or in a ```python fenced block, and print every value you want to see: the printed output comes "
    "back to you after \"Code execution result:\". Keep reasoning in words around the code, and give the final "
    "answer in \\boxed{}."
)
MAX_CODE_CHARS = 1 << 16


class PythonCodeTool:
    tool_type = "python_code"

    def __init__(self, timeout: float = 5, sandbox_type: str = "none", keep_error_last_line: bool = False,
                 tool_instruction: str | None = None, patterns: list[str] | None = None, memory_mb: int = 1024,
                 max_processes: int = 32, max_output_bytes: int = 1 << 16) -> None:
        check_sandbox(str(sandbox_type))
        if not float(timeout) > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.limits = SandboxLimits(timeout=float(timeout), memory_mb=int(memory_mb), max_processes=int(max_processes),
                                    max_output_bytes=int(max_output_bytes), sandbox_type=str(sandbox_type))
        self.keep_error_last_line = bool(keep_error_last_line)
        self.instruction = tool_instruction or INSTRUCTION
        self.patterns = [re.compile(p, re.DOTALL) for p in (patterns or DEFAULT_PATTERNS)]

    def instruction_string(self) -> str:
        return self.instruction

    def parse(self, action: str) -> tuple[str | None, bool]:
        """The code of the block that ends first among the patterns' first matches, and whether one matched."""
        best: tuple[int, str] | None = None
        for pattern in self.patterns:
            match = pattern.search(action)
            if match and (best is None or match.end() <= best[0]):
                best = (match.end(), (match.group(1) if match.groups() else match.group(0)).strip())
        return (best[1], True) if best else (None, False)

    def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
        """(parsed, has_error, observation, action): ROLL's tool contract."""
        code, parsed = self.parse(action)
        if not parsed:
            return False, True, "", action
        if len(code) > MAX_CODE_CHARS:
            return True, True, f"Code execution result: the code is longer than {MAX_CODE_CHARS} characters\n", action
        result = run_python(code, self.limits)
        stderr = result.stderr.strip()
        if stderr and self.keep_error_last_line:
            stderr = stderr.splitlines()[-1]
        text = f"{result.stdout}\n{stderr}" if stderr else result.stdout
        text = text.lstrip(" \n")
        has_error = not result.ok or not text
        return True, has_error, f"Code execution result: {text}\n", action
