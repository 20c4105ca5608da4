"""The import rules of the architecture (arrows point down only), checked twice for every module:

- by its source: each import statement, those inside functions too, names only parts its part may use;
- by running it: importing the module alone in a fresh interpreter pulls in nothing its part may not reach.

``roll.configs`` loads a config with neither torch nor Ray (an instant ``--dry_run`` and config errors);
``roll.preflight`` and ``roll.cli`` reach the runtime only from inside functions, so they import neither
either; ``roll.algorithms`` is torch alone; ``envs`` know nothing of ``roll``; strategies never see env
managers, workers or the pipeline.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .configs.conftest import REPO

# What each part may import of ours, by import statement.
RULES: dict[str, set[str]] = {
    "envs": set(),
    "roll.algorithms": set(),
    "roll.utils": set(),
    "roll.configs": {"envs"},
    "roll.models": {"roll.configs"},
    "roll.distributed": {"roll.configs"},
    "roll.strategies": {"envs", "roll.algorithms", "roll.configs", "roll.distributed", "roll.models", "roll.utils"},
    "roll.workers": {"roll.algorithms", "roll.configs", "roll.distributed", "roll.models", "roll.strategies", "roll.utils"},
    "roll.agentic": {"envs", "roll.algorithms", "roll.configs", "roll.distributed", "roll.models", "roll.preflight",
                     "roll.strategies", "roll.utils", "roll.workers"},
    "roll.preflight": {"envs", "roll.agentic", "roll.configs", "roll.distributed", "roll.models", "roll.strategies",
                       "roll.utils", "roll.workers"},
    "roll.cli": {"envs", "roll.agentic", "roll.configs", "roll.distributed", "roll.preflight", "roll.utils"},
}
# Parts of ours that these may import only inside a function (the runtime, reached when a config names it).
LAZY_ONLY: dict[str, set[str]] = {
    "roll.preflight": {"roll.agentic", "roll.distributed", "roll.models", "roll.strategies", "roll.utils", "roll.workers"},
    "roll.cli": {"roll.agentic", "roll.distributed", "roll.preflight", "roll.utils"},
}
# Other packages a part may not import at all.
BANNED: dict[str, set[str]] = {
    "envs": {"torch", "ray", "transformers"},
    "roll.algorithms": {"ray", "transformers", "deepspeed", "omegaconf", "hydra"},
    "roll.configs": {"torch", "ray", "transformers", "deepspeed", "vllm", "sglang", "megatron", "peft"},
    "roll.strategies": {"ray"},
}
# Kept out of sys.modules by importing a module of these parts alone.
NOT_LOADED: dict[str, set[str]] = {
    "envs": {"torch", "ray"},
    "roll.algorithms": {"ray", "transformers", "deepspeed"},
    "roll.configs": {"torch", "ray", "transformers", "deepspeed"},
    "roll.preflight": {"torch", "ray", "transformers", "deepspeed"},
    "roll.cli": {"torch", "ray", "transformers", "deepspeed"},
}


def part_of(module: str) -> str:
    bits = module.split(".")
    return ".".join(bits[:2]) if bits[0] == "roll" and len(bits) > 1 else bits[0]


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted([*REPO.glob("roll/**/*.py"), *REPO.glob("envs/**/*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out.append((name.removesuffix(".__init__"), path))
    return out


def imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for each import statement of the file."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    found.append((".".join(base + ([child.module] if child.module else [])), lazy))
                else:
                    found.append((child.module or "", lazy))
            visit(child, inner)

    visit(tree, False)
    return found


def violations(module: str, path: Path) -> list[str]:
    part = part_of(module)
    bad = []
    for name, lazy in imports(module, path):
        target = part_of(name)
        if target == part or name == "__future__":
            continue
        ours = target == "envs" or target.startswith("roll")
        if ours and target not in RULES[part]:
            bad.append(f"{module} has an import of {target}")
        elif ours and not lazy and target in LAZY_ONLY.get(part, ()):
            bad.append(f"{module} imports {target} at module level (only inside functions is allowed)")
        elif name.split(".")[0] in BANNED.get(part, ()):
            bad.append(f"{module} has an import of {name.split('.')[0]}")
    return bad


def test_every_part_has_a_rule():
    parts = {part_of(m) for m, _ in modules()} - {"roll"}
    assert parts <= set(RULES), f"parts without an import rule: {sorted(parts - set(RULES))}"


@pytest.mark.parametrize("part", sorted(RULES))
def test_import_statements_keep_the_layers(part):
    mods = [(m, p) for m, p in modules() if part_of(m) == part]
    assert mods, part
    bad = [v for m, p in mods for v in violations(m, p)]
    assert not bad, "\n".join(bad)


def test_the_statement_check_sees_a_violation(tmp_path):
    """The checker itself: a config module importing torch inside a function, a strategy importing the pipeline,
    and preflight importing a worker at module level are each reported."""
    cases = {
        "roll.configs.fake": "def f():\n    import torch\n",
        "roll.strategies.fake": "from roll.agentic.pipeline import AgenticPipeline\n",
        "roll.preflight": "from roll.workers.base import RoleWorker\n",
    }
    for module, source in cases.items():
        path = tmp_path / f"{module}.py"
        path.write_text(source)
        assert violations(module, path), module


# One interpreter per part; a fork per module, so each import starts from a clean interpreter without paying
# Python's start-up each time.
_PROBE = r"""
import json, os, sys
result = {}
for module in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(module)
            text = json.dumps(sorted(m for m in sys.modules if '.' not in m or m.startswith(('roll.', 'envs.'))))
        except BaseException as e:
            text = json.dumps({'error': f'{type(e).__name__}: {e}'})
        os.write(write, text.encode())
        os.close(write)
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    result[module] = json.loads(b''.join(chunks))
print(json.dumps(result))
"""


def _reach(part: str) -> set[str]:
    """The parts of ours ``part`` may reach through others' module-level imports."""
    seen, todo = set(), [part]
    while todo:
        current = todo.pop()
        for p in RULES[current] - LAZY_ONLY.get(current, set()):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen | {part}


@pytest.mark.parametrize("part", sorted(RULES))
def test_importing_each_module_alone_loads_only_its_layers(part):
    mods = [m for m, _ in modules() if part_of(m) == part]
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(mods)], cwd=REPO, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout)
    allowed = _reach(part)
    bad = []
    for module in mods:
        names = loaded[module]
        assert isinstance(names, list), f"importing {module} alone fails: {names}"
        ours = {part_of(n) for n in names if n == "envs" or n.startswith("roll.")}
        bad += [f"{module} loads {p}" for p in sorted(ours - allowed)]
        bad += [f"{module} loads {p}" for p in sorted(NOT_LOADED.get(part, set()) & set(names))]
    assert not bad, "\n".join(bad)
