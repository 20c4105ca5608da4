"""GPU check of megatron_train on one GPU (world size 1; tensor parallel needs more GPUs: run it
under torchrun --nproc-per-node N with tp=N).

1. log-prob agreement of the megatron-core model (weights converted from HF) with an fp32 HF forward;
2. weight sync: weight_buckets gives back the HF weights unchanged before training (bit-exact at
   bf16), and its time;
3. train steps (a policy-gradient loss pushing up the given tokens) lower the loss; the grad norm
   and step time are reported;
4. after training, the synced HF weights reproduce the megatron model's log-probs in HF.
With lora=1: LoRA (all-linear, rank 8) trains instead of the whole model; step 4 checks the merged sync
and the adapter-only sync (peft on the HF model), and reports both sizes.

Needs: a CUDA GPU, torch, transformers, tokenizers, megatron-core (transformer-engine optional:
local layers otherwise). Without internet: pip install --no-index --find-links WHEELS megatron-core.
    python scripts/gpu/check_megatron.py            # or: torchrun --nproc-per-node 2 scripts/gpu/check_megatron.py tp=2
    python scripts/gpu/check_megatron.py lora=1
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from _common import (
    Clock,
    agreement,
    emit,
    hf_logprobs,
    random_prompts,
    require,
    require_cuda,
    tiny_model,
    vocab_size,
    within,
)
from _common import worker_config as make_config


def main(args: dict[str, int]) -> None:
    import torch

    from roll.algorithms.losses import ActorLossConfig
    from roll.distributed.batch import Batch
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import default_registry
    from roll.workers.actor_train import make_actor_loss_fn

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29610")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    folder = Path(os.environ.get("ROLL_GPU_CHECK_DIR") or tempfile.mkdtemp())
    path = str(folder / "model") if (folder / "model").exists() else tiny_model(folder)
    lora = bool(args.get("lora", 0))
    sc = {"tensor_model_parallel_size": args.get("tp", 1), "use_distributed_optimizer": True,
          "sequence_parallel": args.get("tp", 1) > 1 and not lora}  # LoRA runs without sequence parallel
    cfg = make_config(path, "megatron_train", sc, lr=3e-4, micro=2, gas=2)
    if lora:
        cfg.model_args.lora_target, cfg.model_args.lora_rank = "all-linear", 8
    cls = default_registry().resolve("megatron_train", "actor_train")
    strategy = cls(cfg, StrategyContext(role="actor_train", rank=rank, world_size=world, seed=1, train_calls=100))
    results: dict = {}
    with Clock() as c:
        strategy.initialize()
    results["init_s"] = c.seconds

    sequences = [p + q for p, q in zip(random_prompts(8, 48, vocab_size(path), seed=1), random_prompts(8, 16, vocab_size(path), seed=2))]
    ids = torch.tensor(sequences)
    mask = torch.ones_like(ids)
    response = torch.zeros_like(ids)
    response[:, 48:] = 1
    batch = Batch({"input_ids": ids, "attention_mask": mask, "response_mask": response})
    lp = strategy.compute_log_probs(batch)
    ref = hf_logprobs(path, sequences) if rank == 0 else None

    with Clock() as c:
        synced = {n: t for bucket in strategy.weight_buckets(64 << 20) for n, t in bucket}
    results["weight_sync_s"] = c.seconds
    if rank == 0:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
        # LoRA: B starts at zero, so the merged weights are the base weights
        exact = all(torch.equal(synced[k].to(torch.bfloat16), v) for k, v in hf.items() if k in synced)
        results["sync_roundtrip_exact"] = exact and len(synced) == len([k for k in hf if k != "lm_head.weight"])
        results["logprobs_vs_hf"] = agreement([lp[i, 1:].tolist() for i in range(len(sequences))], ref)

    batch = batch | Batch({"old_logprobs": lp, "advantages": torch.ones_like(lp)})
    loss_fn = make_actor_loss_fn(ActorLossConfig(pg_clip_low=10.0, pg_clip_high=10.0))
    steps = []
    for _ in range(4):
        with Clock() as c:
            metrics = strategy.train_step(batch, loss_fn)
        steps.append({"seconds": c.seconds, **{k: v for k, v in metrics.items() if isinstance(v, float)}})
    new_lp = strategy.compute_log_probs(batch)
    gain = float(((new_lp - lp) * response).sum() / response.sum())
    results["train"] = {"steps": steps, "mean_logprob_gain_on_trained_tokens": gain}
    synced = {n: t for bucket in strategy.weight_buckets(64 << 20) for n, t in bucket}
    adapter = {n: t for bucket in strategy.weight_buckets(64 << 20, adapters=True) for n, t in bucket} if lora else {}
    if rank != 0:
        return
    after = hf_logprobs(path, sequences, state={k: v.float() for k, v in synced.items()})
    results["trained_logprobs_megatron_vs_hf_after_sync"] = agreement(
        [new_lp[i, 1:].tolist() for i in range(len(sequences))], after)
    ok = (results["sync_roundtrip_exact"] and within(results["logprobs_vs_hf"]) and gain > 0
          and within(results["trained_logprobs_megatron_vs_hf_after_sync"]))
    if lora:
        results["sync_bytes"] = {"merged": sum(t.numel() * t.element_size() for t in synced.values()),
                                 "adapter": sum(t.numel() * t.element_size() for t in adapter.values())}
        results["trained_logprobs_megatron_vs_hf_peft_after_adapter_sync"] = agreement(
            [new_lp[i, 1:].tolist() for i in range(len(sequences))],
            hf_logprobs(path, sequences, adapter=(strategy.adapter_config(), adapter)))
        ok = ok and within(results["trained_logprobs_megatron_vs_hf_peft_after_adapter_sync"])
    emit("megatron_check", results, ok)


if __name__ == "__main__":
    require_cuda()
    require("transformers", "tokenizers", "megatron.core")
    main({k: int(v) for k, v in (a.split("=") for a in sys.argv[1:])})
