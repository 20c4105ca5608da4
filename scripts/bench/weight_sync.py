"""Weight sync actor_train -> actor_infer, colocated on one device slot, through Ray.

    .venv/bin/python scripts/bench/weight_sync.py [--model smollm2|tiny|PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse

import _common


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--stage", type=int, default=0)
    args = p.parse_args()
    path = _common.model_path(args.model)
    import ray

    from roll.distributed.cluster import Cluster
    from roll.distributed.resources import ResourceManager, ray_init
    from roll.workers import ActorInferWorker, ActorTrainWorker

    ray_init(num_cpus=2, object_store_mb=2048)
    rm = ResourceManager([0], num_gpus_per_node=1, use_gpu=False)
    clusters = {}
    for role, cls, strategy in (("actor_train", ActorTrainWorker, "deepspeed_train"), ("actor_infer", ActorInferWorker, "hf_infer")):
        cfg = _common.worker_config(path, strategy, stage=args.stage)
        cfg.device_mapping = [0]
        clusters[role] = Cluster(role, cls, cfg, rm, {"seed": 0})
        clusters[role].call("initialize")
    times = []
    for _ in range(args.repeats + 1):
        stats = clusters["actor_train"].call_rank0("sync_weights", clusters["actor_infer"].workers, args.bucket_mb << 20)
        times.append(stats["time/weight_sync_s"])
    warm = times[1:]
    mb = stats["weight_sync/bytes"] / 2**20
    print(f"weight sync, {args.model} ({mb:.0f} MiB fp32), ZeRO-{args.stage}, colocated on CPU, buckets {args.bucket_mb} MiB")
    print(f"  first sync {times[0]:.3f} s; then mean {sum(warm) / len(warm):.3f} s, best {min(warm):.3f} s (target < 1 s for SmolLM2)")
    ray.shutdown()


if __name__ == "__main__":
    main()
