"""Every package roll and envs import (at module level or inside a function) is declared: a core dependency, or
in the extra of the feature that imports it (issue 31)."""

import ast
import re
import sys

import tomllib

from .configs.conftest import REPO

# import name -> the requirement that provides it
PROVIDED_BY = {
    "PIL": "pillow", "yaml": "pyyaml", "hydra": "hydra-core", "huggingface_hub": "huggingface-hub", "gem": "gem-llm",
    "megatron": "megatron-core", "transformer_engine": "megatron-core", "vllm": "vllm", "sglang": "sglang",
    "datasets": "datasets", "pyarrow": "datasets", "msgspec": "msgspec", "wandb": "wandb",
}
# installed by its own documented step, not by a pip extra: gem-llm (--no-deps, see pyproject's gem extra)
OUTSIDE_EXTRAS = {"gem-llm"}


def imported_packages() -> set[str]:
    names = set()
    for folder in ("roll", "envs"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("roll", "envs")}


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[<>=!\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_every_imported_package_is_declared():
    have = declared()
    missing = sorted(name for name in imported_packages()
                     if PROVIDED_BY.get(name, name).lower().replace("_", "-") not in have
                     and PROVIDED_BY.get(name, name) not in OUTSIDE_EXTRAS)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
