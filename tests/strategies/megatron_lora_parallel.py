"""Run as a script: LoRA on megatron_train with 2 ranks on CPU (gloo), tensor parallel 2 and pipeline parallel 2,
each started from the same adapter values as deepspeed_train's LoRA (one rank, HF layout) and checked against it:
log-probs before the step, the adapter's update after one SGD-like step (see megatron_lora_cpu.py), and the
trained adapter synced to HF. Prints one JSON line per layout. See megatron_cpu.py for what is patched."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

LAYOUTS = {"tp2": {"tensor_model_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}}
RANK, ALPHA = 4, 8


def full_adapter(layout) -> tuple[dict, dict]:
    """Seeded whole A and B of every adapted megatron layer (B non-zero, so A's gradient is too)."""
    gen = torch.Generator().manual_seed(3)
    q = layout.num_heads * layout.head_dim + 2 * layout.num_kv_heads * layout.head_dim
    shapes = {"self_attention.linear_qkv": (layout.hidden_size, q),
              "self_attention.linear_proj": (layout.num_heads * layout.head_dim, layout.hidden_size),
              "mlp.linear_fc1": (layout.hidden_size, 2 * layout.ffn_hidden_size),
              "mlp.linear_fc2": (layout.ffn_hidden_size, layout.hidden_size)}
    a, b = {}, {}
    for i in range(layout.num_layers):
        for name, (fan_in, fan_out) in shapes.items():
            key = f"decoder.layers.{i}.{name}.weight"
            a[key] = torch.randn(RANK, fan_in, generator=gen) * 0.1
            b[key] = torch.randn(fan_out, RANK, generator=gen) * 0.05
    return a, b


def load_adapter(strategy, a: dict, b: dict) -> None:
    """Put this rank's part of the whole adapter into the strategy's LoRA layers (the inverse of the sync's
    gather: B of column-parallel layers and A of row-parallel ones split as their weights are)."""
    from roll.models.lora import ADAPTER
    from roll.models.megatron_convert import shard
    from roll.models.megatron_lora import COLUMN_PARALLEL, adapter_layers

    for v, chunk in enumerate(strategy._local_chunks()):
        pos = strategy.rank_position(v)
        whole = dataclasses.replace(pos, tp=1, tp_rank=0)
        column = {k for k in a if k.removesuffix(".weight").endswith(COLUMN_PARALLEL)}
        local_a = {**shard({k: t for k, t in a.items() if k not in column}, strategy.layout, pos),
                   **shard({k: t for k, t in a.items() if k in column}, strategy.layout, whole)}
        local_b = {**shard({k: t for k, t in b.items() if k in column}, strategy.layout, pos),
                   **shard({k: t for k, t in b.items() if k not in column}, strategy.layout, whole)}
        with torch.no_grad():
            for name, layer in adapter_layers(chunk):
                layer.lora_A[ADAPTER].weight.copy_(local_a[f"{name}.weight"])
                layer.lora_B[ADAPTER].weight.copy_(local_b[f"{name}.weight"])


def _worker(rank: int, port: int, path: str, layout: dict, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0")
    from tests.strategies.megatron_cpu import patch_megatron_for_cpu

    patch_megatron_for_cpu()
    from roll.strategies.base import StrategyContext
    from roll.strategies.megatron_train import MegatronTrainStrategy
    from tests.strategies.helpers import SGD_LIKE, ppo_loss_fn, with_old_logprobs, worker_config
    from tests.strategies.megatron_cpu_parallel import _batch

    cfg = worker_config(path, "megatron_train", lr=SGD_LIKE["lr"], micro=2, gas=2, eps=SGD_LIKE["eps"])
    cfg.strategy_args.strategy_config = {**layout, "make_vocab_size_divisible_by": 8, "use_distributed_optimizer": False}
    cfg.model_args.lora_target, cfg.model_args.lora_rank, cfg.model_args.lora_alpha = "all-linear", RANK, ALPHA
    ctx = StrategyContext(role="actor_train", rank=rank, world_size=2, seed=0, max_grad_norm=0.0, train_calls=10)
    s = MegatronTrainStrategy(cfg, ctx, device="cpu")
    s.initialize()
    load_adapter(s, *full_adapter(s.layout))
    batch = _batch()
    lp = s.compute_log_probs(batch)
    s.train_step(with_old_logprobs(batch, lp), ppo_loss_fn)
    after = s.compute_log_probs(batch)
    synced = {n: t.numpy() for bucket in s.weight_buckets(1 << 12, adapters=True) for n, t in bucket}
    # numpy through the queue: torch tensors would travel as file descriptors of a process that exits
    queue.put((rank, s.data_parallel_info()[2], lp.numpy(), after.numpy(), synced))
    torch.distributed.barrier()


def main() -> None:
    from roll.configs.megatron_targets import hf_targets
    from roll.models.megatron_convert import GPTLayout
    from roll.models.megatron_lora import lora_to_hf
    from roll.models.tiny import build_tiny_model
    from tests.strategies.helpers import ppo_loss_fn, with_old_logprobs
    from tests.strategies.megatron_cpu_parallel import _batch, _free_port, attended_positions, run_two_ranks
    from tests.strategies.megatron_lora_cpu import _hf_lora, _load, deepspeed_lora

    os.environ["MASTER_PORT"] = str(_free_port())
    path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", num_layers=4))
    batch = _batch()
    hf_layout = GPTLayout.from_hf_config(_load(path).config, fused_norms=False)
    adapter0 = lora_to_hf(*full_adapter(hf_layout), hf_layout)
    ds = deepspeed_lora(path, hf_targets(["linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"]), adapter0)
    ref = ds.compute_log_probs(batch)
    ds.train_step(with_old_logprobs(batch, ref), ppo_loss_fn)
    ds_adapter = {n: p.detach().clone() for n, p in ds.engine.module.named_parameters() if ".lora_" in n}
    config = ds.adapter_config()
    attended = attended_positions(batch)
    for name, layout in LAYOUTS.items():
        results = run_two_ranks(_worker, path, layout)
        collector = next(r for r in results if r[1])
        lp, after = torch.from_numpy(collector[2]), torch.from_numpy(collector[3])
        synced = {n: torch.from_numpy(t) for n, t in results[0][4].items()}
        update_b = max(float((synced[n] - ds_adapter[n]).abs().max()) for n in synced if ".lora_B." in n)
        update_a = 0.0
        for n in synced:
            module = n.split(".lora_A.")[0].rsplit(".", 1)[-1] if ".lora_A." in n else None
            if module in (None, "k_proj", "v_proj", "up_proj"):
                continue
            group = {"q_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj")}.get(module, (module,))
            ds_sum = sum(ds_adapter[n.replace(f".{module}.", f".{g}.")] - adapter0[n] for g in group)
            update_a = max(update_a, float((synced[n] - adapter0[n] - ds_sum).abs().max()))
        hf_after = _hf_lora(path, config, synced)
        from roll.models.logprobs import forward_logprobs

        hf_lp = forward_logprobs(hf_after, batch["input_ids"], batch["attention_mask"])
        print(json.dumps({
            "layout": name,
            "logprob_max_abs_vs_deepspeed": float((lp - ref)[attended].abs().max()),
            "update_size": max(float((synced[n] - adapter0[n]).abs().max()) for n in synced),
            "update_b_max_abs_vs_deepspeed": update_b,
            "update_a_max_abs_vs_deepspeed_sum": update_a,
            "synced_adapter_max_abs_vs_megatron": float((hf_lp - after)[attended].abs().max()),
        }), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
