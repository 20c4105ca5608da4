"""Several Ray nodes (Ray's own multi-node harness, ``ray.cluster_utils.Cluster``: a raylet, object store and node
id per node, all on this machine): roles placed on different nodes, weights crossing nodes, env managers on a
node of their own, and nodes that die mid-run."""

import threading
import time
from contextlib import contextmanager

import pytest

from roll.configs.errors import ConfigError
from roll.distributed.resources import Node, check_nodes_fit, device_nodes, env_nodes

from ..pipeline.helpers import tiny_config

pytestmark = pytest.mark.slow


# --- placement rules (pure)
def node(i, devices=2, rank=None, envs=False, ip="10.0.0.1"):
    return Node(f"{i:02d}" + "a" * 54, ip, devices, rank, envs)


def test_config_nodes_follow_the_rank_label_else_the_driver_first():
    a, b, c = node(1, rank=2), node(2, rank=0), node(3, rank=1)
    assert device_nodes([a, b, c]) == [b, c, a]
    x, y, z = node(1, ip="10.0.0.9"), node(2, ip="10.0.0.5"), node(3, ip="10.0.0.7")
    assert device_nodes([x, y, z], driver_node=z.node_id) == [z, y, x]  # driver first, then by address
    envs_only = node(4, devices=0, envs=True)
    assert device_nodes([x, envs_only], driver_node=x.node_id) == [x]  # a node without devices hosts no role


def test_env_managers_go_to_marked_nodes_else_everywhere():
    x, y, e = node(1), node(2), node(3, devices=0, envs=True)
    assert env_nodes([x, y, e]) == [e]
    assert env_nodes([y, x]) == [x, y]


@pytest.mark.parametrize("mappings, per_node, nodes, words", [
    ({"actor_train": [0], "actor_infer": [1]}, 1, [1, 1], None),
    ({"actor_train": [0, 1], "actor_infer": [2, 3]}, 2, [None], "actor_infer.device_mapping: device 3 is on node 1"),
    ({"actor_train": [0, 1], "actor_infer": [2, 3]}, 2, [2, 4], "num_gpus_per_node: the nodes used offer unequal"),
    ({"actor_train": [0, 1, 2]}, 4, [2], "actor_train.device_mapping: device 2 is device 2 of node 0, which offers 2"),
    ({"actor_train": [0, 1, 2, 3]}, 2, [None, None], None),  # virtual CPU slots: any number per node
])
def test_device_mappings_must_fit_the_nodes_in_one_line(mappings, per_node, nodes, words):
    if words is None:
        check_nodes_fit(mappings, per_node, nodes)
        return
    with pytest.raises(ConfigError) as e:
        check_nodes_fit(mappings, per_node, nodes)
    assert words in str(e.value) and "\n" not in str(e.value)


# --- a real multi-node cluster on this machine
@contextmanager
def ray_cluster(*specs):
    """A cluster_utils cluster, one node per spec (the first is the head, where this driver runs); yields the
    node ids in spec order. Each spec: (roll_device slots, rank label or None, hosts envs)."""
    import ray
    from ray.cluster_utils import Cluster

    def args(devices, rank, envs):
        resources = {**({"roll_device": devices} if devices else {}), **({"roll_env": 1} if envs else {})}
        labels = {"roll-node-rank": str(rank)} if rank is not None else {}
        return dict(num_cpus=2, object_store_memory=96 << 20, resources=resources, labels=labels)

    cluster = Cluster(initialize_head=True, head_node_args=args(*specs[0]))
    handles = [cluster.head_node] + [cluster.add_node(**args(*s)) for s in specs[1:]]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster, handles, [h.node_id for h in handles]
    finally:
        ray.shutdown()
        cluster.shutdown()


def split_config(model, tmp_path, *overrides):
    """actor_train on node 0 (device 0), actor_infer on node 1 (device 1): one device per node."""
    return tiny_config(model, tmp_path, "num_gpus_per_node=1", "actor_train.device_mapping=[0]",
                       "actor_infer.device_mapping=[1]", "deterministic=true", "seed=3", *overrides)


def manager_nodes_of(managers):
    import ray

    return {ray.get(m.handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
            for m in managers}


def manager_nodes(rollout):
    return manager_nodes_of(rollout.managers)


def remove_once_playing(cluster, handle, managers, timeout=60.0):
    """Remove a node as soon as one of its env managers is playing an episode (mid-rollout, not between steps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(m.activity_snapshot()[1] for m in managers):
        time.sleep(0.01)
    cluster.remove_node(handle, allow_graceful=False)


def test_roles_on_two_nodes_envs_on_a_third_weights_equal_after_each_sync(tiny_model_path, tmp_path):
    import torch

    from roll.agentic.pipeline import AgenticPipeline

    synced = []

    class Checked(AgenticPipeline):
        def sync_weights(self, version):
            stats = super().sync_weights(version)
            train = self.clusters["actor_train"].call_rank0("state_dict")
            infer = self.clusters["actor_infer"].call_rank0("state_dict")
            synced.append((stats["weight_sync/object_store_workers"],
                           # in the engine's dtype (bf16 here): the sync casts, nothing else may change a bit
                           all(torch.equal(train[k].to(infer[k].dtype), infer[k]) for k in train),
                           sorted(train) == sorted(infer)))
            return stats

    cfg = split_config(tiny_model_path, tmp_path, "eval_steps=0", "save_steps=0")
    with ray_cluster((1, 0, False), (1, 1, False), (0, None, True)) as (_, _, ids):
        pipeline = Checked(cfg)
        try:
            train, infer = pipeline.clusters["actor_train"], pipeline.clusters["actor_infer"]
            assert train.node_ids == [ids[0]] and infer.node_ids == [ids[1]]
            assert train.where[0].startswith("node 0 (") and infer.where[0].startswith("node 1 (")
            assert manager_nodes(pipeline.train_rollout) == {ids[2]}  # the env node runs no model worker
            assert pipeline.placement_metrics == {"placement/actor_train_node": 0.0, "placement/actor_infer_node": 1.0}
            last = pipeline.run()
        finally:
            pipeline.shutdown()
    assert synced == [(1.0, True, True)] * 2  # every sync crossed nodes, and the engine holds the trainer's weights
    assert last["rollout/env_errors"] == 0.0


def test_a_lost_env_node_costs_its_episodes_and_the_run_goes_on(tiny_model_path, tmp_path):
    """Two env nodes; one is removed while step 1's rollout runs: its managers are re-created on the other
    node, their episodes counted as env errors, and the run finishes."""
    from roll.agentic.pipeline import AgenticPipeline

    with ray_cluster((1, 0, False), (1, 1, False), (0, None, True), (0, None, True)) as (cluster, handles, ids):
        class Killing(AgenticPipeline):
            def collect(self, mode, n, step):
                if mode == "train" and step == 1:
                    doomed = [m for m in self.train_rollout.managers if manager_nodes_of([m]) == {ids[3]}]
                    threading.Thread(target=remove_once_playing, args=(cluster, handles[3], doomed)).start()
                return super().collect(mode, n, step)

        cfg = split_config(tiny_model_path, tmp_path, "max_steps=3", "eval_steps=0", "save_steps=0",
                           "train_env_manager.max_env_num_per_worker=2", "train_env_manager.min_healthy_share=0.25")
        recorded = {}
        pipeline = Killing(cfg)
        pipeline.tracker.log = lambda metrics, step: recorded.__setitem__(step, dict(metrics))
        try:
            assert manager_nodes(pipeline.train_rollout) == {ids[2], ids[3]}
            pipeline.run()
            time.sleep(1)
            assert manager_nodes(pipeline.train_rollout) == {ids[2]}  # re-created on the surviving env node
        finally:
            pipeline.shutdown()
    assert sorted(recorded) == [0, 1, 2]
    assert recorded[0]["rollout/env_errors"] == 0.0
    assert recorded[1]["rollout/env_errors"] > 0  # the lost node's episodes, counted
    assert recorded[1]["rollout/env_errors"] + recorded[1]["rollout/trajectories"] >= 4
    assert recorded[2]["rollout/env_errors"] == 0.0


def test_a_lost_inference_node_stops_the_run_naming_it_and_a_resume_continues_exactly(tiny_model_path, tmp_path):
    from roll.agentic.pipeline import AgenticPipeline
    from roll.distributed.cluster import WorkerDiedError
    from roll.utils.checkpoint import resolve_resume

    from ..pipeline.helpers import run_recorded
    from ..pipeline.test_resume import COMPARED

    def compared(steps):
        return {s: {k: m[k] for k in COMPARED if k in m} for s, m in steps.items()}

    with ray_cluster((1, 0, False), (1, 1, False)):
        straight = compared(run_recorded(split_config(tiny_model_path, tmp_path / "a", "save_steps=1", "max_steps=3")))

    # the node goes while step 1 plays; if that rollout still finishes, step 2's weight sync meets the dead worker
    cfg = split_config(tiny_model_path, tmp_path / "b", "save_steps=1", "max_steps=3")
    with ray_cluster((1, 0, False), (1, 1, False)) as (cluster, handles, ids):
        class Killing(AgenticPipeline):
            def collect(self, mode, n, step):
                if mode == "train" and step == 1:  # step 0 is checkpointed by now
                    args = (cluster, handles[1], self.train_rollout.managers)
                    threading.Thread(target=remove_once_playing, args=args).start()
                return super().collect(mode, n, step)

        pipeline = Killing(cfg)
        try:
            with pytest.raises(WorkerDiedError) as e:
                pipeline.run()
        finally:
            pipeline.shutdown()
    message = str(e.value)
    assert message.startswith(f"actor_infer rank 0 on node 1 ({ids[1][:8]}@") and "\n" not in message, message
    saved = resolve_resume(True, cfg.output_dir, verify=True)  # the manifest's hashes match: intact
    assert saved is not None and saved.name in ("step_000000", "step_000001")
    last = int(saved.name.split("_")[1])

    with ray_cluster((1, 0, False), (1, 1, False)):  # a fresh cluster
        resumed = compared(run_recorded(split_config(tiny_model_path, tmp_path / "b", "save_steps=1", "max_steps=3",
                                                     "resume_from_checkpoint=true")))
    assert sorted(resumed) == list(range(last + 1, 3))
    for step, metrics in resumed.items():
        for key, value in straight[step].items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), (step, key)
