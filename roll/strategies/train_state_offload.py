"""What deepspeed_train moves off its device while another role uses it (colocated rollouts), and back.

Under ZeRO 1-3 the training state lives in buffers DeepSpeed owns: flat bf16 weights, fp32 master partitions,
gradient partitions, Adam moments. DeepSpeed's own ``engine.offload_states()`` / ``reload_states()`` moves
them and re-points the module's parameters; which of them it can move depends on the stage and the offload
settings (``offload_kinds``). Weights in no optimizer (a LoRA base, ``freeze_module_prefix``) and the module's
buffers are not DeepSpeed's: they move by storage (``move_storages``). ZeRO-0 has no DeepSpeed buffers at all,
so every tensor of its module and optimizer moves by storage, views into a flat buffer staying views of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

ALL_KINDS = ("hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer", "optim_states")


def offload_kinds(stage: int, cpu_optimizer: bool, offload_param: bool, fused_adam: bool) -> tuple[str, ...]:
    """The DeepSpeed state kinds (``OffloadStateTypeEnum`` values) that ``offload_states`` moves here.

    - ZeRO-0: none (no DeepSpeed buffers; the storage mover moves everything).
    - ZeRO 1-2: fp32 masters, bf16 weights, gradient partitions and Adam moments; with ``offload_optimizer``
      the masters and moments already live on the CPU, so only the weights and gradients move.
    - ZeRO-3: bf16 weight partitions, gradient partitions and the contiguous gradient buffer. DeepSpeed moves
      the fp32 partitions and moments only for its FusedAdam; the optimizer here is torch's AdamW, so those stay.
      With ``offload_optimizer`` the gradient partitions are on the CPU already; with ``offload_param`` every
      partition is, and there is nothing to move.
    """
    if stage == 0 or (stage == 3 and offload_param):
        return ()
    if stage in (1, 2):
        return ("lp_params", "lp_grads") if cpu_optimizer else ("hp_params", "lp_params", "lp_grads", "optim_states")
    kinds = ["lp_params", "contiguous_grad_buffer"]
    if not cpu_optimizer:
        kinds.insert(1, "lp_grads")
        if fused_adam:
            kinds = ["hp_params", *kinds, "optim_states"]
    return tuple(kinds)


def move_storages(tensors: Iterable[torch.Tensor], device: torch.device | str) -> None:
    """Copy each distinct storage behind ``tensors`` to ``device`` once and point every tensor at its new place
    (same offset, size and stride), so that tensors sharing a storage (parameters that are views into a flat
    buffer, a master copy and its gradient view) still share it afterwards. The old storage is freed when
    nothing else holds it."""
    moved: dict[tuple[str, int], torch.Tensor] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        key = (str(storage.device), storage.data_ptr())
        if key not in moved:
            old = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            moved[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device).copy_(old)
        new = moved[key].untyped_storage()
        t.data = torch.empty(0, dtype=t.dtype, device=device).set_(new, t.storage_offset(), t.size(), t.stride())


def _tensors_in(obj: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    """Tensors an optimizer (or DeepSpeed's wrapper of one) holds: its attributes, lists and dicts of them, its
    state and param groups, and the optimizer it wraps."""
    if isinstance(obj, torch.Tensor):
        yield obj
        if obj.grad is not None:
            yield obj.grad
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item, depth + 1)
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _tensors_in(list(obj.state.values()), depth + 1)
        yield from _tensors_in([g["params"] for g in obj.param_groups], depth + 1)
    if depth == 0 and not isinstance(obj, (torch.Tensor, list, tuple, dict)):
        for value in vars(obj).values():
            if isinstance(value, (torch.Tensor, list, tuple, dict, torch.optim.Optimizer)):
                yield from _tensors_in(value, depth + 1)


class TrainStateOffload:
    """Moves one DeepSpeed engine's state from ``device`` to the host and back (see the module doc)."""

    def __init__(self, engine: Any, device: torch.device | str, pin_memory: bool = True) -> None:
        self.engine = engine
        self.device = torch.device(device)
        self.pin_memory = pin_memory
        zero = engine.zero_optimization_stage()
        offload_param = engine.zero_offload_param()
        self.stage = zero
        self.kinds = offload_kinds(
            zero, cpu_optimizer=bool(engine.zero_use_cpu_optimizer()),
            offload_param=offload_param is not None and str(getattr(offload_param.device, "value", offload_param.device)) != "none",
            fused_adam=type(getattr(engine.optimizer, "optimizer", None)).__name__ == "FusedAdam")
        self._moved: list[torch.Tensor] = []

    def _by_storage(self) -> list[torch.Tensor]:
        """The tensors on the device that are not in DeepSpeed's own buffers."""
        module = self.engine.module
        tensors: list[torch.Tensor] = list(module.buffers())
        if self.stage == 0:
            tensors += [t for p in module.parameters() for t in (p, p.grad) if t is not None]
            tensors += list(_tensors_in(self.engine.optimizer))
        elif self.stage in (1, 2):
            tensors += [p for p in module.parameters() if not p.requires_grad]
        seen: set[int] = set()
        out = []
        for t in tensors:
            if id(t) not in seen and t.device == self.device:
                seen.add(id(t))
                out.append(t)
        return out

    def offload(self) -> None:
        if self.kinds:
            from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

            self.engine.offload_states(include=[OffloadStateTypeEnum(k) for k in self.kinds],
                                       device=OffloadDeviceEnum.cpu, pin_memory=self.pin_memory)
        self._moved = self._by_storage()
        move_storages(self._moved, "cpu")

    def reload(self) -> None:
        if self.kinds:
            self.engine.reload_states()
        move_storages(self._moved, self.device)
        self._moved = []

    def offloaded_kinds(self) -> set[str]:
        """The kinds DeepSpeed marks as offloaded now (empty for ZeRO-0)."""
        states = getattr(self.engine.optimizer, "offloaded_states", set())
        return {getattr(s, "value", s) for s in states}
