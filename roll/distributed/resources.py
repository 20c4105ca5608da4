"""Ray start-up and device placement.

Global device ids map to (node, local id) by ``num_gpus_per_node``. Each used device is one Ray
placement-group bundle; a worker is scheduled into the bundle of its first device and sees its
devices through ``CUDA_VISIBLE_DEVICES`` (set per rank). Roles whose ``device_mapping`` shares ids
land in the same bundles: they are colocated and time-share the devices. With no GPU, devices
are CPU slots: the same configs and code run with gloo.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def ray_init(num_cpus: int | None = None, object_store_mb: int = 512, address: str | None = None) -> None:
    """Start (or join) Ray once per driver process. ``RAY_ADDRESS`` or ``address`` joins an existing
    cluster (``ray start --head``); otherwise a local one starts without a dashboard."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
        return
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 1,
        include_dashboard=False,
        object_store_memory=object_store_mb << 20,
        ignore_reinit_error=True,
        log_to_driver=True,
    )


def check_devices_fit(mappings: dict[str, list[int]], num_gpus_per_node: int, node_gpus: list[int]) -> None:
    """Every role's devices exist in a cluster whose nodes have ``node_gpus`` GPUs: global device d is GPU
    d % num_gpus_per_node of config node d // num_gpus_per_node, and each config node needs a real node of its
    own with that many GPUs. Raises ConfigError naming a role's device_mapping (before Ray waits for GPUs that
    are not there)."""
    from roll.configs.errors import ConfigError

    per_node: dict[int, set[int]] = {}
    owner: dict[int, str] = {}  # a device's first role, to name in the error
    for role, devices in mappings.items():
        for d in devices:
            per_node.setdefault(d // num_gpus_per_node, set()).add(d % num_gpus_per_node)
            owner.setdefault(d, role)
    have = sorted(node_gpus, reverse=True)
    if len(per_node) > len(have):
        raise ConfigError(f"{owner[max(owner)]}.device_mapping", f"uses {len(per_node)} node(s) of num_gpus_per_node="
                          f"{num_gpus_per_node} devices, but the cluster has {len(have)} node(s) with GPUs")
    # the busiest config nodes on the largest real nodes: they fit if and only if this pairing does
    need = sorted(per_node.items(), key=lambda kv: max(kv[1]) + 1, reverse=True)
    for (node, local), gpus in zip(need, have):
        if max(local) + 1 > gpus:
            device = node * num_gpus_per_node + max(local)
            raise ConfigError(f"{owner[device]}.device_mapping", f"device {device} is GPU {max(local)} of a node, but the "
                              f"cluster's nodes have at most {gpus} GPU(s) there (num_gpus_per_node={num_gpus_per_node})")


def cluster_node_gpus() -> list[int]:
    """GPUs on each alive node of the Ray cluster this driver joined."""
    import ray

    return [int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]


@dataclass(frozen=True)
class Placement:
    bundle_index: int
    local_devices: list[int]
    node: int


class ResourceManager:
    """One placement group holding a bundle per used device id."""

    def __init__(self, device_ids: list[int], num_gpus_per_node: int, use_gpu: bool | None = None) -> None:
        import ray
        import torch
        from ray.util.placement_group import placement_group

        self.use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
        self.num_gpus_per_node = num_gpus_per_node
        self.device_ids = sorted(set(device_ids))
        self.index = {d: i for i, d in enumerate(self.device_ids)}
        # A CPU slot asks for no real core: colocated roles share the machine's cores.
        bundle = {"GPU": 1, "CPU": 1} if self.use_gpu else {"CPU": 0.001}
        self.placement_group = placement_group([dict(bundle) for _ in self.device_ids], strategy="PACK")
        ray.get(self.placement_group.ready(), timeout=600)

    def placement(self, devices: list[int]) -> Placement:
        node = devices[0] // self.num_gpus_per_node
        if any(d // self.num_gpus_per_node != node for d in devices):
            raise ValueError(f"devices {devices} of one worker span nodes (num_gpus_per_node={self.num_gpus_per_node})")
        return Placement(self.index[devices[0]], [d % self.num_gpus_per_node for d in devices], node)

    def actor_options(self, devices: list[int], env_vars: dict[str, str]) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        place = self.placement(devices)
        env = dict(env_vars)
        if self.use_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, place.local_devices))
            env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"  # we set it per rank ourselves
        return {
            "num_cpus": 0.0001,
            "num_gpus": 0.01 if self.use_gpu else 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.placement_group, place.bundle_index),
            "runtime_env": {"env_vars": env},
        }

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.placement_group)
