"""A LoRA adapter that arrives over a weight sync, written where inference engines load adapters from.

vLLM (``LoRARequest.lora_path``) and SGLang (``Engine.load_lora_adapter``) take an adapter as a folder in
peft's format (adapter_config.json + adapter_model.safetensors). A sync's buckets are gathered here and,
once all have arrived, written to a new folder per version, under /dev/shm where the machine has it
(memory, not disk). The engine is then told to load that version; the folder of the version before is
removed once the engine no longer uses it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch

from roll.models.lora import save_hf_adapter

# vLLM sizes its LoRA slots by one of these ranks (vllm.config.lora.MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_slot(rank: int) -> int | None:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds ``rank``; None when none does."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def is_adapter_tensor(name: str) -> bool:
    """A LoRA tensor in peft's names: ``lora_A`` / ``lora_B`` of a linear layer, ``lora_embedding_A`` / ``_B`` of an
    embedding."""
    return ".lora_" in name


def adapted_module_names(names: list[str]) -> list[str]:
    """The last name part of every module an adapter's tensors adapt (``...self_attn.q_proj.lora_A.weight`` ->
    ``q_proj``), sorted."""
    return sorted({name.split(".lora_", 1)[0].rsplit(".", 1)[-1] for name in names if is_adapter_tensor(name)})


def engine_adapter_config(config: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The adapter config as the engines read it. SGLang takes ``target_modules`` only as a list of module names
    (or the strings ``all`` / ``all-linear``), so a regular-expression target becomes the names of the modules it
    adapted; modules of those names the regex left out get no tensors, which both engines treat as a zero update."""
    if isinstance(config.get("target_modules"), str) and config["target_modules"] not in ("all", "all-linear"):
        return {**config, "target_modules": adapted_module_names(names)}
    return config


class AdapterFolders:
    """Collects one sync's adapter tensors and writes each version as a peft folder."""

    def __init__(self, root: str | None = None) -> None:
        base = root or ("/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)
        self.root = tempfile.mkdtemp(prefix="roll-lora-", dir=base)
        self.config: dict[str, Any] | None = None
        self.pending: dict[str, torch.Tensor] = {}
        self.version = 0

    def configure(self, config: dict[str, Any]) -> None:
        """The trainer's peft config (once; an adapter that changes shape mid-run is refused)."""
        if self.config is not None and self.config != config:
            raise ValueError("weight sync: the trainer's LoRA adapter changed shape during the run")
        self.config = config

    def add(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """One bucket of adapter tensors, copied (a bucket's tensors may be views of a buffer the next bucket
        overwrites)."""
        for name, tensor in named_tensors:
            if not is_adapter_tensor(name):
                raise KeyError(f"weight sync: {name!r} is not a LoRA adapter tensor, but this engine was told to "
                               "expect the adapter alone")
            self.pending[name] = tensor.detach().to("cpu", copy=True)

    def publish(self) -> tuple[int, str] | None:
        """Write the gathered tensors as the next version's folder; (version, folder), or None when nothing
        arrived since the last one."""
        if not self.pending:
            return None
        if self.config is None:
            raise RuntimeError("weight sync: adapter tensors arrived before the adapter's config")
        self.version += 1
        folder = os.path.join(self.root, f"v{self.version}")
        save_hf_adapter(folder, self.pending, engine_adapter_config(self.config, list(self.pending)))
        self.pending = {}
        return self.version, folder

    def remove(self, version: int) -> None:
        shutil.rmtree(os.path.join(self.root, f"v{version}"), ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class EngineAdapterSync:
    """The LoRA half of an inference engine's weight sync, shared by the vllm and sglang strategies: whether the
    engine applies the trainer's adapter itself (else it gets merged full weights), the adapter's config, each
    bucket's adapter tensors gathered, and at the sync's end the new version published as a folder and swapped
    in. An engine supplies ``_slot_for`` (the rank of its adapter slots), ``_swap_adapter`` (its own load and
    unload calls) and may refuse an adapter in ``_check_adapter``."""

    engine_name: str
    engine_config: Any  # parsed strategy_config with lora_adapters and load_format
    context: Any  # StrategyContext
    engine: Any
    adapters: AdapterFolders | None

    def _slot_for(self, rank: int) -> int | None:
        return rank

    def _adapter_slot(self) -> int | None:
        """The rank of the engine's adapter slots when it applies the trainer's adapter itself; None: merged syncs."""
        rank = self.context.lora_rank
        if rank is None or not self.engine_config.lora_adapters or self.engine_config.load_format == "dummy":
            return None  # (dummy: no base weights to adapt; the merged sync fills them)
        return self._slot_for(rank)

    @property
    def accepts_adapters(self) -> bool:
        return self._adapter_slot() is not None

    def configure_adapter(self, config: dict[str, Any]) -> None:
        """The trainer's LoRA adapter (peft config): its tensors arrive with each sync."""
        slot = self._adapter_slot()
        if self.adapters is None or slot is None:
            raise RuntimeError(f"{self.engine_name}: this engine was started without LoRA; it takes merged weights")
        if int(config["r"]) > slot:
            raise ValueError(f"{self.engine_name}: the trainer's LoRA rank {config['r']} exceeds the engine's slots ({slot})")
        self.adapters.configure(config)

    def _gather_adapter(self, named_tensors: list[tuple[str, torch.Tensor]]) -> bool:
        """Keep a bucket of adapter tensors for the sync's end; False when the bucket holds full weights."""
        if self.adapters is None or not any(is_adapter_tensor(name) for name, _ in named_tensors):
            return False
        self.adapters.add(named_tensors)
        return True

    def _check_adapter(self, names: list[str]) -> None:
        """Refuse an adapter the engine cannot apply faithfully (ValueError naming the key to change)."""

    def _swap_adapter(self, version: int, folder: str) -> int | None:
        """Make the engine use the adapter in ``folder`` from now on; the version it no longer uses, if any."""
        raise NotImplementedError

    def _publish_adapter(self) -> None:
        """The sync's adapter, now whole: written as the next version, swapped in, the replaced folder removed."""
        if self.adapters is None or self.engine is None:
            return
        self._check_adapter(list(self.adapters.pending))
        published = self.adapters.publish()
        if published is None:
            return
        replaced = self._swap_adapter(*published)
        if replaced is not None:
            self.adapters.remove(replaced)
