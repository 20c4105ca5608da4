"""LoRA adapters (through peft) and partial freezing, with ROLL's ``model_args`` keys.

``lora_target`` is ROLL's syntax: comma-separated module names, the shorthands ``all-linear`` (every
linear layer but the output head) and ``all-embedding``, or a regular expression over module paths
(when it holds any of ``* $ | (``), which peft matches against the whole path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

REGEX_CHARS = ("*", "$", "|", "(")
ADAPTER = "default"  # peft's name of the one adapter


def lora_enabled(model_args: Any) -> bool:
    return bool(getattr(model_args, "lora_target", None))


def target_modules(spec: str, model: torch.nn.Module) -> str | list[str]:
    """peft's ``target_modules`` for ROLL's ``lora_target`` on ``model``."""
    if any(c in spec for c in REGEX_CHARS):
        return spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    out: list[str] = []
    for name in names:
        if name in ("all-linear", "all"):
            out += _module_names(model, torch.nn.Linear, skip_output=True)
        elif name == "all-embedding":
            out += _module_names(model, torch.nn.Embedding)
        else:
            out.append(name)
    return sorted(set(out))


def _module_names(model: torch.nn.Module, kind: type, skip_output: bool = False) -> list[str]:
    output = model.get_output_embeddings() if skip_output and hasattr(model, "get_output_embeddings") else None
    return [name.rsplit(".", 1)[-1] for name, module in model.named_modules()
            if isinstance(module, kind) and module is not output and name]


def lora_alpha(model_args: Any) -> int:
    """ROLL's lora_alpha, 2 x lora_rank when unset."""
    return int(model_args.lora_alpha or 2 * int(model_args.lora_rank))


def peft_config(fields: dict[str, Any]) -> Any:
    """A peft LoraConfig from a config dict (``LoraConfig.to_dict()`` or ours): keys peft does not take are left out."""
    from peft import LoraConfig

    return LoraConfig(**{k: v for k, v in fields.items() if k in LoraConfig.__dataclass_fields__})


def lora_config(model_args: Any, model: torch.nn.Module) -> Any:
    """The peft LoraConfig that ``model_args`` asks for on ``model``."""
    from peft import LoraConfig, TaskType

    return LoraConfig(r=int(model_args.lora_rank), lora_alpha=lora_alpha(model_args), lora_dropout=float(model_args.lora_dropout),
                      target_modules=target_modules(model_args.lora_target, model), task_type=TaskType.CAUSAL_LM)


def add_adapter(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """``model`` with a fresh LoRA adapter (peft); only the adapter's parameters require gradients."""
    from peft import get_peft_model

    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    peft_model = get_peft_model(model, config)
    if not any(p.requires_grad for p in peft_model.parameters()):
        raise ValueError(f"lora_target {config.target_modules!r} matches no module of the model")
    if tied and any(getattr(m, "base_layer", None) is embedding for m in peft_model.modules()):
        # peft adapts the lookup alone while the head keeps the shared base weight; a merge writes the update into
        # the shared weight, head included, so merged syncs and the export would not be the policy that trained
        raise ValueError(f"lora_target {config.target_modules!r} adapts the input embedding of a model whose output "
                         "head shares that weight (tie_word_embeddings); leave the embedding out of lora_target")
    return peft_model


def freeze(model: torch.nn.Module, prefixes: str | None, strict: bool = True) -> list[str]:
    """Freeze every parameter whose name starts with one of the comma-separated ``prefixes``; returns them.
    ``strict``: a prefix list that names nothing is an error (not for one part of a split model)."""
    wanted = [p.strip() for p in (prefixes or "").split(",") if p.strip()]
    frozen = [name for name, param in model.named_parameters() if any(name.startswith(p) for p in wanted)]
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    if strict and wanted and not frozen:
        raise ValueError(f"freeze_module_prefix {prefixes!r} matches no parameter of the model")
    return frozen


def is_adapted(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapter's own tensors (what trains), by their names in the peft model."""
    return [(n, p) for n, p in model.named_parameters() if ".lora_" in n]


_PREFIX = re.compile(r"^base_model\.model\.")


def peft_module_name(peft_name: str) -> str:
    """The name a parameter of a peft-wrapped model has in the plain model with the adapter injected in place
    (``base_model.model.`` dropped, ``base_layer`` / ``lora_A`` kept)."""
    return _PREFIX.sub("", peft_name)


def base_name(peft_name: str) -> str:
    """The plain model's name of a peft-wrapped parameter (``...q_proj.base_layer.weight`` -> ``...q_proj.weight``)."""
    return _PREFIX.sub("", peft_name).replace(".base_layer.", ".")


def merged_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every weight of the plain model, with each adapted layer's update merged in (W + scale B A)."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        # an embedding keeps its adapter in lora_embedding_A / _B (its lora_A is empty)
        if isinstance(module, LoraLayer) and (ADAPTER in module.lora_A or ADAPTER in module.lora_embedding_A):
            deltas[f"{name}.base_layer.weight"] = module.get_delta_weight(ADAPTER)
    out = []
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        weight = param.detach()
        if name in deltas:
            weight = weight + deltas[name].to(weight.dtype)
        out.append((base_name(name), weight))
    return out


def save_hf_adapter(folder: str, tensors: Mapping[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Write an adapter folder as peft saves one (adapter_config.json + adapter_model.safetensors)."""
    import os

    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    peft_config(config).save_pretrained(folder)
    save_file({peft_file_key(k): v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "adapter_model.safetensors"))


def peft_file_key(name: str) -> str:
    """A parameter's key in peft's adapter file: the adapter's name dropped (it is given when loading), whether it
    sits inside the name (``lora_A.default.weight``) or ends it (an embedding's ``lora_embedding_A.default``)."""
    return re.sub(rf"\.{ADAPTER}(?=\.|$)", "", name)
