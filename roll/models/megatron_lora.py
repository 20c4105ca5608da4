"""LoRA on megatron_train: peft's tensor-parallel adapter layer on megatron-core's parallel linears.

Megatron fuses q/k/v into ``linear_qkv`` and gate/up into ``linear_fc1``, so one adapter serves a fused
layer: its A is shared and its B has the fused weight's rows. That is the same function as separate HF
adapters whose A is that shared A and whose Bs are the row blocks of B, so the adapter converts exactly
to HF's layout (``lora_to_hf``): that is what hf_infer receives and what the checkpoint's ``adapter/``
folder holds (loadable with ``peft.PeftModel.from_pretrained`` on the HF model).

``lora_target`` for megatron_train: ``all-linear`` (the four layers of every transformer block), megatron's
names (``linear_qkv,linear_proj,linear_fc1,linear_fc2``) or HF's names, each fused group whole
(``q_proj,k_proj,v_proj`` together, ``gate_proj,up_proj`` together). The imports of megatron-core and peft
are inside the functions that need them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import torch

from roll.configs.megatron_targets import HF_OF_MEGATRON, hf_targets
from roll.models.lora import ADAPTER, lora_alpha, peft_config
from roll.models.megatron_convert import GPTLayout, split_qkv

COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")  # B is split by rows over tensor ranks, A is whole on each
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(self_attention|mlp)\.(linear_\w+)\.weight$")


def hf_lora_config(model_args: Any, targets: list[str], base: str | None = None) -> dict[str, Any]:
    """The HF-side peft LoraConfig (JSON-able) of the adapter that ``targets`` carry on megatron_train."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(model_args.lora_rank), "lora_alpha": lora_alpha(model_args),
            "lora_dropout": float(model_args.lora_dropout), "target_modules": hf_targets(targets), "bias": "none",
            "base_model_name_or_path": base}


def _parallel_lora_class(megatron_config: Any) -> type:
    from megatron.core import tensor_parallel
    from peft.tuners.lora.tp_layer import LoraParallelLinear

    class ParallelLora(LoraParallelLinear):
        """peft's LoraParallelLinear, reached through peft's custom-module hook: peft 0.21's own megatron dispatch
        fails (KeyError 'fan_in_fan_out'), its update_layer misses the lora_bias entry its init reads, and its
        forward feeds megatron's (output, bias) tuples straight into the next matmul. Those three are mended here;
        the layers, their init, merge and delta weights stay peft's."""

        def __init__(self, base_layer: Any, adapter_name: str, config: Any, **kwargs: Any) -> None:
            kwargs.pop("fan_in_fan_out", None)
            super().__init__(base_layer, adapter_name, config, backend=tensor_parallel, megatron_config=megatron_config,
                             **kwargs)

        def update_layer(self, adapter_name: str, *args: Any, **kwargs: Any) -> None:
            self.lora_bias[adapter_name] = False  # LoraParallelLinear refuses lora_bias; peft's reset reads the entry
            super().update_layer(adapter_name, *args, **kwargs)

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
            result, bias = self.base_layer(x, *args, **kwargs)
            if self.disable_adapters or self.merged:
                return result, bias
            dtype = result.dtype
            for name in self.active_adapters:
                if name not in self.lora_A:
                    continue
                h = self.lora_A[name](self.lora_dropout[name](self._cast_input_dtype(x, self.lora_A[name].weight.dtype)))
                h = self.lora_B[name](h[0] if isinstance(h, tuple) else h)
                result = result + (h[0] if isinstance(h, tuple) else h) * self.scaling[name]
            return result.to(dtype), bias

    return ParallelLora


def add_megatron_adapter(chunk: torch.nn.Module, model_args: Any, targets: list[str]) -> int:
    """Put a LoRA adapter (peft) on ``targets`` of one GPTModel chunk, in place; only its tensors train.
    Returns how many layers it adapted (0 for a chunk without those layers)."""
    from megatron.core import tensor_parallel
    from peft import LoraConfig, inject_adapter_in_model

    lora = LoraConfig(r=int(model_args.lora_rank), lora_alpha=lora_alpha(model_args),
                      lora_dropout=float(model_args.lora_dropout), target_modules=targets)
    # peft sets params_dtype on the config it is given (adapters train in fp32): hand it a copy
    cls = _parallel_lora_class(copy.copy(chunk.config))
    lora._register_custom_module({tensor_parallel.ColumnParallelLinear: cls, tensor_parallel.RowParallelLinear: cls})
    if not any(n.rsplit(".", 1)[-1] in targets for n, _ in chunk.named_modules()):
        return 0
    inject_adapter_in_model(lora, chunk)
    return sum(isinstance(module, cls) for module in chunk.modules())


def adapter_layers(chunk: torch.nn.Module) -> list[tuple[str, Any]]:
    """(module path, layer) of every LoRA layer in the chunk."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in chunk.named_modules() if isinstance(m, LoraLayer) and ADAPTER in m.lora_A]


def set_adapters(chunk: torch.nn.Module, enabled: bool) -> None:
    """Switch the chunk's adapters on or off (off: the base model), leaving which tensors train unchanged."""
    for _, layer in adapter_layers(chunk):
        layer._disable_adapters = not enabled  # peft's enable_adapters() would also flip requires_grad


def merged_local_state(chunk: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's megatron state dict in the plain model's names, with each adapted layer's local shard of
    W + scale B A merged in (peft's delta of the local A and B is exactly the local shard of the delta)."""
    deltas = {f"{n}.base_layer.weight": layer.get_delta_weight(ADAPTER) for n, layer in adapter_layers(chunk)}
    out = {}
    for name, tensor in chunk.state_dict().items():
        if ".lora_" in name or not torch.is_tensor(tensor):
            continue
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def local_adapter_tensors(chunk: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(A, B) of this rank, keyed by the adapted weight's megatron name (``...linear_qkv.weight``), so the
    weights' tensor-parallel merge joins their split halves."""
    a, b = {}, {}
    for name, layer in adapter_layers(chunk):
        a[f"{name}.weight"] = layer.lora_A[ADAPTER].weight.detach()
        b[f"{name}.weight"] = layer.lora_B[ADAPTER].weight.detach()
    return a, b


def split_halves(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                 tp_rank: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Of one tensor rank's (A, B), what a merge over tensor ranks needs: the split halves (B of column-parallel
    layers, A of row-parallel ones) from every rank, the halves that are whole on every rank from rank 0 only."""
    column = {k for k in a if k.removesuffix(".weight").endswith(COLUMN_PARALLEL)}
    return ({k: t for k, t in a.items() if tp_rank == 0 or k not in column},
            {k: t for k, t in b.items() if tp_rank == 0 or k in column})


def hf_adapter_sizes(meta_model: torch.nn.Module, config: dict[str, Any]) -> list[tuple[str, int]]:
    """(HF peft name, bytes) of every adapter tensor a sync sends (fp32, as the adapter trains), from an HF model
    on the meta device."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(peft_config(config), meta_model)
    return [(f"base_model.model.{n}", p.numel() * 4) for n, p in meta_model.named_parameters() if ".lora_" in n]


def lora_to_hf(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], layout: GPTLayout) -> dict[str, torch.Tensor]:
    """HF peft tensors (``base_model.model.model.layers.i.self_attn.q_proj.lora_A.default.weight``) from whole
    megatron adapter tensors keyed by global weight name: a fused layer's A goes to each of its HF layers, its
    B is split as the fused weight is."""
    out: dict[str, torch.Tensor] = {}
    for key, a_full in a.items():
        m = _LAYER.match(key)
        if not m:
            raise KeyError(f"adapter on {key!r}: megatron_train converts adapters of transformer-block linears only")
        layer, linear = int(m.group(1)), m.group(3)
        block, names = HF_OF_MEGATRON[linear]
        b_full = b[key]
        if linear == "linear_qkv":
            b_parts = split_qkv(b_full, layout)
        elif linear == "linear_fc1":
            b_parts = b_full.chunk(2)
        else:
            b_parts = (b_full,)
        for hf, b_part in zip(names, b_parts):
            prefix = f"base_model.model.model.layers.{layer}.{block}.{hf}"
            out[f"{prefix}.lora_A.{ADAPTER}.weight"] = a_full.clone()
            out[f"{prefix}.lora_B.{ADAPTER}.weight"] = b_part.contiguous()
    return out
