"""Ray start-up and device placement.

Global device ids map to (node, local id) by ``num_gpus_per_node``: device d is local device
d % num_gpus_per_node of config node d // num_gpus_per_node. Config node k is the k-th node that offers
devices (GPUs; on CPU clusters the ``roll_device`` slots each node offers, or virtual slots when no node
offers any), ordered by the launch contract's RANK label. Each used device is one bundle of its node's
placement group; a worker is scheduled into the bundle of its first device and sees its devices through
``CUDA_VISIBLE_DEVICES`` (set per rank). Roles whose ``device_mapping`` shares ids land in the same
bundles: they are colocated and time-share the devices. With no GPU the same configs and code run with gloo.
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
        address="local",  # a new instance: never a `ray start` cluster this machine ran before (maybe gone)
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


DEVICE_RESOURCE = "roll_device"  # device slots a CPU node offers (``ray start --resources``)
ENV_RESOURCE = "roll_env"  # marks nodes that host env managers
RANK_LABEL = "roll-node-rank"  # a node's RANK under the launch contract (``ray start --labels``)


@dataclass(frozen=True)
class Node:
    """One alive Ray node as placement sees it."""

    node_id: str
    ip: str
    devices: int | None  # GPUs, or roll_device slots on a CPU node; None: virtual slots, no limit
    rank: int | None  # the roll-node-rank label, when the node was started with one
    hosts_envs: bool  # offers the roll_env resource

    def describe(self) -> str:
        return f"{self.node_id[:8]}@{self.ip}"


def alive_nodes() -> list[Node]:
    """The alive nodes of the Ray cluster this driver joined; ``devices`` counts GPUs where any node has one,
    else roll_device slots where any node offers them, else None (every node offers virtual slots)."""
    import ray

    raw = [n for n in ray.nodes() if n.get("Alive")]
    key = "GPU" if any(n.get("Resources", {}).get("GPU", 0) for n in raw) else DEVICE_RESOURCE
    counted = any(n.get("Resources", {}).get(key, 0) for n in raw)
    out = []
    for n in raw:
        res, labels = n.get("Resources", {}), n.get("Labels") or {}
        rank = labels.get(RANK_LABEL)
        out.append(Node(n["NodeID"], n.get("NodeManagerAddress", "?"), int(res.get(key, 0)) if counted else None,
                        int(rank) if rank is not None and str(rank).isdigit() else None, bool(res.get(ENV_RESOURCE, 0))))
    return out


def device_nodes(nodes: list[Node], driver_node: str | None = None) -> list[Node]:
    """The nodes that offer devices, in config-node order: config node k (devices k * num_gpus_per_node ...) is
    the k-th. Nodes started by the launch contract carry their RANK as a label and keep that order; otherwise the
    driver's node comes first and the rest follow by address, then node id."""
    offering = [n for n in nodes if n.devices is None or n.devices > 0]
    if offering and all(n.rank is not None for n in offering):
        return sorted(offering, key=lambda n: n.rank)
    return sorted(offering, key=lambda n: (n.node_id != driver_node, n.ip, n.node_id))


def env_nodes(nodes: list[Node]) -> list[Node]:
    """Where env managers run: the nodes that offer roll_env when any does, else every alive node; managers go
    round-robin over them in this order (each manager hosts up to max_env_num_per_worker envs)."""
    marked = [n for n in nodes if n.hosts_envs]
    return sorted(marked or nodes, key=lambda n: (n.ip, n.node_id))


def check_nodes_fit(mappings: dict[str, list[int]], num_gpus_per_node: int, node_devices: list[int | None]) -> None:
    """The devices of every role exist on the cluster's device nodes (in config-node order): device d is local
    device d % num_gpus_per_node of node d // num_gpus_per_node; the nodes used offer equal devices. Raises
    ConfigError in one line, before any worker starts."""
    from roll.configs.errors import ConfigError

    owner: dict[int, str] = {}
    for role, devices in mappings.items():
        for d in devices:
            owner.setdefault(d, role)
    if not owner:
        return
    used = sorted({d // num_gpus_per_node for d in owner})
    if used[-1] >= len(node_devices):
        device = max(owner)
        raise ConfigError(f"{owner[device]}.device_mapping", f"device {device} is on node {device // num_gpus_per_node} "
                          f"(num_gpus_per_node={num_gpus_per_node}), but the cluster has {len(node_devices)} node(s) "
                          f"with devices")
    counts = {k: node_devices[k] for k in used if node_devices[k] is not None}
    if len(set(counts.values())) > 1:
        raise ConfigError("num_gpus_per_node", f"the nodes used offer unequal devices ({', '.join(f'node {k}: {c}' for k, c in counts.items())}); "
                          f"every node must offer the same number")
    for d, role in sorted(owner.items()):
        have = counts.get(d // num_gpus_per_node)
        if have is not None and d % num_gpus_per_node >= have:
            raise ConfigError(f"{role}.device_mapping", f"device {d} is device {d % num_gpus_per_node} of node "
                              f"{d // num_gpus_per_node}, which offers {have} (num_gpus_per_node={num_gpus_per_node})")


@dataclass(frozen=True)
class Placement:
    bundle_index: int
    local_devices: list[int]
    node: int  # config node: the index into ResourceManager.nodes


class ResourceManager:
    """A placement group per config node, pinned to its Ray node (``ray.io/node-id`` label), holding a bundle
    per used device of that node."""

    def __init__(self, device_ids: list[int], num_gpus_per_node: int, use_gpu: bool | None = None,
                 nodes: list[Node] | None = None) -> None:
        import ray
        import torch
        from ray.util.placement_group import placement_group

        self.use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
        self.num_gpus_per_node = num_gpus_per_node
        self.device_ids = sorted(set(device_ids))
        self.nodes = nodes if nodes is not None else device_nodes(alive_nodes(), ray.get_runtime_context().get_node_id())
        beyond = [d for d in self.device_ids if d // num_gpus_per_node >= len(self.nodes)]
        if beyond:  # the pipeline names the role first (check_nodes_fit); this guards direct use
            raise ValueError(f"devices {beyond} lie beyond the cluster's {len(self.nodes)} device node(s)")
        slots = any(n.devices is not None for n in self.nodes) and not self.use_gpu
        # A CPU slot asks for no real core: colocated roles share the machine's cores.
        bundle = {"GPU": 1, "CPU": 1} if self.use_gpu else {"CPU": 0.001, **({DEVICE_RESOURCE: 1} if slots else {})}
        self.index: dict[int, int] = {}
        self.groups: dict[int, Any] = {}
        for k in sorted({d // num_gpus_per_node for d in self.device_ids}):
            mine = [d for d in self.device_ids if d // num_gpus_per_node == k]
            self.index.update({d: i for i, d in enumerate(mine)})
            self.groups[k] = placement_group([dict(bundle) for _ in mine], strategy="PACK",
                                             bundle_label_selector=[{"ray.io/node-id": self.nodes[k].node_id}] * len(mine))
        ray.get([g.ready() for g in self.groups.values()], timeout=600)

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
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.groups[place.node], place.bundle_index),
            "runtime_env": {"env_vars": env},
        }

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for g in self.groups.values():
            remove_placement_group(g)
        self.groups = {}
