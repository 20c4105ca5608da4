"""Run as a script: LoRA on roll's megatron_train strategy on CPU (world size 1, gloo), against deepspeed_train's
LoRA (peft on the HF model) and plain HF forwards of the same tiny model, printing the figures as one JSON line.
See megatron_cpu.py for what is patched to run megatron-core on CPU.

The independent check of the training math: megatron's fused layers carry one adapter where HF has one per
projection (q/k/v share A, gate/up share A). Started from the same values, one SGD-like step (Adam with eps far
above every gradient) moves each HF B by its row block of megatron's B update, and megatron's shared A by the
sum of the HF As' updates (the gradient of a shared parameter is the sum over its uses).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch


def _hf_lora(path: str, config: dict, tensors: dict) -> torch.nn.Module:
    """The HF model with the adapter ``config`` injected (peft) and ``tensors`` loaded into it."""
    from peft import inject_adapter_in_model

    from roll.models.lora import peft_config, peft_module_name

    model = _load(path)
    inject_adapter_in_model(peft_config(config), model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            params[peft_module_name(name)].copy_(t)
    return model.eval()


def _load(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def deepspeed_lora(path: str, targets: list[str], adapter: dict) -> object:
    """deepspeed_train with a rank-4 LoRA on the HF ``targets``, its tensors set to ``adapter``, SGD-like Adam."""
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
    from tests.strategies.helpers import SGD_LIKE, worker_config

    cfg = worker_config(path, "deepspeed_train", lr=SGD_LIKE["lr"], micro=2, gas=2, eps=SGD_LIKE["eps"])
    cfg.model_args.lora_target, cfg.model_args.lora_rank, cfg.model_args.lora_alpha = ",".join(targets), 4, 8
    ds = DeepSpeedTrainStrategy(cfg, StrategyContext(role="actor_train", seed=0, max_grad_norm=0.0, train_calls=10))
    ds.initialize()
    params = dict(ds.engine.module.named_parameters())
    with torch.no_grad():
        for name, t in adapter.items():
            params[name].copy_(t)
    return ds


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29655"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    from tests.strategies.megatron_cpu import patch_megatron_for_cpu

    patch_megatron_for_cpu()
    from peft import PeftModel

    from roll.models.logprobs import forward_logprobs
    from roll.models.tiny import build_tiny_model
    from roll.strategies.base import StrategyContext
    from roll.strategies.megatron_train import MegatronTrainStrategy
    from tests.strategies.helpers import SGD_LIKE, ppo_loss_fn, with_old_logprobs, worker_config
    from tests.strategies.megatron_cpu_parallel import _batch, attended_positions

    path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    batch = _batch()  # a left-padded row too
    attended = attended_positions(batch)

    def lp_of(model: torch.nn.Module) -> torch.Tensor:
        return forward_logprobs(model, batch["input_ids"], batch["attention_mask"])

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b)[attended].abs().max())

    ctx = StrategyContext(role="actor_train", seed=0, max_grad_norm=0.0, train_calls=10)
    mcfg = worker_config(path, "megatron_train", lr=SGD_LIKE["lr"], micro=2, gas=2, eps=SGD_LIKE["eps"])
    mcfg.strategy_args.strategy_config = {"make_vocab_size_divisible_by": 128, "use_distributed_optimizer": False}
    mcfg.model_args.lora_target, mcfg.model_args.lora_rank, mcfg.model_args.lora_alpha = "all-linear", 4, 8
    meg = MegatronTrainStrategy(mcfg, ctx, device="cpu")
    meg.initialize()
    chunk = meg._local_chunks()[0]
    base_lp = lp_of(_load(path))
    lp_fresh = meg.compute_log_probs(batch)

    # B starts at 0 (the adapter is a no-op); random B values make A's gradient non-zero too
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in chunk.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    frozen_before = {n: p.detach().clone() for n, p in chunk.named_parameters() if not p.requires_grad}
    lp_adapted = meg.compute_log_probs(batch)
    reference = meg.compute_log_probs(batch, adapters=False)
    config = meg.adapter_config()
    adapter0 = {n: t for bucket in meg.weight_buckets(1 << 12, adapters=True) for n, t in bucket}
    sizes = dict(meg.weight_sizes(adapters=True))

    # the same adapter in HF's layout, in deepspeed_train's peft model
    ds = deepspeed_lora(path, config["target_modules"], adapter0)
    ds_lp0 = ds.compute_log_probs(batch)

    train_batch = with_old_logprobs(batch, lp_adapted)
    grad_norms = [meg.train_step(train_batch, ppo_loss_fn)["actor/grad_norm"],
                  ds.train_step(train_batch, ppo_loss_fn)["actor/grad_norm"]]
    adapter1 = {n: t for bucket in meg.weight_buckets(1 << 12, adapters=True) for n, t in bucket}
    ds_adapter1 = {n: p.detach().clone() for n, p in ds.engine.module.named_parameters() if ".lora_" in n}
    # megatron's update of a shared A against the sum of the HF As' updates it stands for
    fused = {"q_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj")}
    update_a, update_b = 0.0, 0.0
    for name in adapter1:
        if ".lora_B." in name:
            update_b = max(update_b, float((adapter1[name] - adapter0[name] - ds_adapter1[name] + adapter0[name])
                                           .abs().max()))
            continue
        module = name.split(".lora_A.")[0].rsplit(".", 1)[-1]
        if module in ("k_proj", "v_proj", "up_proj"):
            continue  # the same shared A as q_proj / gate_proj
        group = fused.get(module, (module,))
        ds_sum = sum(ds_adapter1[name.replace(f".{module}.", f".{g}.")] - adapter0[name] for g in group)
        update_a = max(update_a, float((adapter1[name] - adapter0[name] - ds_sum).abs().max()))
    update_size = max(float((adapter1[n] - adapter0[n]).abs().max()) for n in adapter1)

    lp_trained = meg.compute_log_probs(batch)
    frozen_same = all(torch.equal(p, frozen_before[n]) for n, p in chunk.named_parameters() if not p.requires_grad)
    trainable = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] + ".lora" for n, p in chunk.named_parameters()
                        if p.requires_grad})
    merged = {n: t for bucket in meg.weight_buckets(1 << 12) for n, t in bucket}
    plain = _load(path)
    plain.load_state_dict(merged, strict=False)
    hf_adapted = _hf_lora(path, config, adapter1)

    # checkpoint: adapter tensors only; the adapter folder loads in peft; resume is exact
    ckpt = tempfile.mkdtemp()
    meg.save_checkpoint(ckpt)
    saved_keys = set(torch.load(Path(ckpt) / "actor_train" / "rank_00000.pt", weights_only=False)["model"][0])
    from_folder = PeftModel.from_pretrained(_load(path),
                                            str(Path(ckpt) / "adapter")).eval()
    meg.train_step(train_batch, ppo_loss_fn)
    first = meg.compute_log_probs(batch)
    meg.load_checkpoint(ckpt)
    restored = meg.compute_log_probs(batch)
    meg.train_step(train_batch, ppo_loss_fn)
    second = meg.compute_log_probs(batch)

    # freeze_module_prefix in full fine-tuning (megatron-core's parameter names)
    fcfg = worker_config(path, "megatron_train", lr=1e-2, micro=2, gas=2, eps=1e-4)
    fcfg.strategy_args.strategy_config = mcfg.strategy_args.strategy_config
    fcfg.model_args.freeze_module_prefix = "embedding,decoder.layers.0"
    frz = MegatronTrainStrategy(fcfg, ctx, device="cpu")
    frz.initialize()
    frz_chunk = frz._local_chunks()[0]
    frz_before = {n: p.detach().clone() for n, p in frz_chunk.named_parameters()}
    frz.train_step(train_batch, ppo_loss_fn)
    moved = {n for n, p in frz_chunk.named_parameters() if not torch.equal(p, frz_before[n])}
    frozen_prefix_ok = bool(moved) and not any(n.startswith(("embedding", "decoder.layers.0.")) for n in moved) and any(
        n.startswith("decoder.layers.1.") for n in moved)

    export = Path(tempfile.mkdtemp()) / "hf"
    meg.export_hf(str(export))
    exported = _load(str(export))
    print(json.dumps({
        "fresh_adapter_max_abs_vs_hf": diff(lp_fresh, base_lp),
        "adapted_moves_logprobs": diff(lp_adapted, base_lp),
        "reference_max_abs_vs_hf_base": diff(reference, base_lp),
        "deepspeed_same_adapter_max_abs": diff(ds_lp0, lp_adapted),
        "grad_norm": grad_norms,
        "update_size": update_size,
        "update_b_max_abs_vs_deepspeed": update_b,
        "update_a_max_abs_vs_deepspeed_sum": update_a,
        "frozen_unchanged": frozen_same,
        "trainable": trainable,
        "adapter_sync_max_abs_vs_megatron": diff(lp_of(hf_adapted), lp_trained),
        "merged_sync_max_abs_vs_megatron": diff(lp_of(plain), lp_trained),
        "adapter_sizes_match": sizes == {n: t.numel() * t.element_size() for n, t in adapter1.items()},
        "adapter_bytes": sum(sizes.values()),
        "full_bytes": sum(n for _, n in meg.weight_sizes()),
        "checkpoint_holds_adapter_only": bool(saved_keys) and all(".lora_" in k for k in saved_keys),
        "adapter_folder_max_abs_vs_megatron": diff(lp_of(from_folder), lp_trained),
        "checkpoint_restores": bool(torch.equal(restored, lp_trained)),
        "checkpoint_resume_is_exact": bool(torch.equal(first, second)),
        "export_max_abs_vs_megatron": diff(lp_of(exported), second),
        "freeze_prefix_trains_the_rest_only": frozen_prefix_ok,
    }))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
