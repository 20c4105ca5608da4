"""The adapter folder a LoRA weight sync writes for vLLM / SGLang, read back by the engines' own loading code.

Runs on CPU and starts no engine: it needs the engines' Python packages importable, not their GPU kernels
(vLLM's compiled ops are never called on this path). For each ``lora_target`` form (all-linear, a name
list, a regular expression, all-linear plus the input embedding), a peft adapter made as actor_train makes it,
B random, goes through what the engines do with a sync (``AdapterFolders``: two buckets gathered, one folder
written), then:

- vLLM: the steps of its worker's ``_load_adapter`` for a Llama model: ``PEFTHelper.from_local_dir``,
  ``validate_legal`` against the ``LoRAConfig`` our engine start asks for (slots of the trainer's rank),
  ``LoRAModel.from_local_checkpoint`` with the modules vLLM's Llama accepts and its name mapper. Every module
  peft adapted must arrive, and W + scaling * B A from vLLM's tensors must equal the trainer's merged weights;
- SGLang (when importable): its ``LoRAConfig`` reads the folder; rank and a target list it can take.

Usage: python scripts/gpu/check_adapter_loaders.py   (exit 0 passed, 1 a check failed, 3 a package missing)
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from _common import emit, require

TARGETS = ("all-linear", "q_proj,v_proj,down_proj", r".*layers\.[01]\.self_attn\.(q_proj|o_proj)",
           "all-linear,all-embedding")
RANK = 8
ATOL = 1e-6  # fp32 on both sides: W + s B A computed from the same tensors


def adapter(path: str, target: str):
    """A peft adapter on the model at ``path`` as actor_train sets it up (B random): (model, config, tensors)."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    from roll.models.lora import adapter_named_tensors, add_adapter, lora_config

    torch.manual_seed(11)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    args = SimpleNamespace(lora_rank=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, lora_target=target)
    model = add_adapter(base, lora_config(args, base))
    for name, p in model.named_parameters():
        if ".lora_" in name:
            p.data.normal_(0.0, 0.1)
    config = model.peft_config["default"].to_dict()  # as deepspeed_train's adapter_config()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    return model, config, adapter_named_tensors(model)


def write_folder(config: dict, tensors: list) -> tuple[str, object]:
    from roll.strategies.adapter_folders import AdapterFolders

    folders = AdapterFolders()
    folders.configure(config)
    half = len(tensors) // 2
    for bucket in (tensors[:half], tensors[half:]):
        folders.add([(n, t.detach()) for n, t in bucket])
    _, folder = folders.publish()
    return folder, folders


def vllm_read(folder: str, model, vocab: int, max_pos: int) -> dict:
    """What vLLM's worker does with a LoRARequest for a Llama model, up to the weights it would apply."""
    import torch
    import vllm.lora.lora_model
    from vllm.config.lora import LoRAConfig
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.request import LoRARequest
    from vllm.model_executor.models.llama import LlamaForCausalLM

    from roll.models.lora import merged_named_tensors
    from roll.strategies.adapter_folders import vllm_lora_slot

    # vLLM pins the adapter's CPU copy for the copy to the GPU; pinning needs an accelerator, which this check
    # does without (the tensors are the same either way)
    vllm.lora.lora_model.PIN_MEMORY = torch.cuda.is_available()
    request = LoRARequest(lora_name="roll-policy-v1", lora_int_id=1, lora_path=folder)  # as the vllm strategy builds it
    helper = PEFTHelper.from_local_dir(request.lora_path, max_pos)
    helper.validate_legal(LoRAConfig(max_lora_rank=vllm_lora_slot(RANK), max_loras=1))
    # the module names vLLM's Llama takes adapters on (WorkerLoRAManager: packed layers expanded, embeddings)
    packed = LlamaForCausalLM.packed_modules_mapping
    linear = {n.removesuffix(".base_layer").rsplit(".", 1)[-1] for n, m in model.get_base_model().named_modules()
              if isinstance(m, torch.nn.Linear) and ".lora_" not in n}
    supported = {next((k for k, v in packed.items() if n in v), n) for n in linear} | set(LlamaForCausalLM.embedding_modules)
    expected = {x for m in supported for x in packed.get(m, [m])}
    lora = LoRAModel.from_local_checkpoint(
        request.lora_path, expected, peft_helper=helper, lora_model_id=request.lora_int_id, device="cpu",
        dtype=torch.float32, model_vocab_size=vocab, weights_mapper=LlamaForCausalLM.hf_to_vllm_mapper.get_rename_mapper(),
        skip_prefixes=getattr(LlamaForCausalLM, "lora_skip_prefixes", None))

    merged = dict(merged_named_tensors(model))
    base = {k: v.detach() for k, v in model.get_base_model().state_dict().items()}
    adapted = {n.split(".lora_", 1)[0].replace("base_model.model.", "", 1)
               for n, _ in model.named_parameters() if ".lora_" in n}
    worst = 0.0
    for module, w in lora.loras.items():
        delta = w.scaling * (w.lora_b @ w.lora_a)
        if module.endswith("embed_tokens"):  # peft's embedding adapter: A (r, vocab), B (hidden, r)
            delta = delta.T
        key = f"{module}.weight"
        want = merged[key]
        got = base.get(f"{module}.base_layer.weight", base.get(key)) + delta
        worst = max(worst, (got - want).abs().max().item())
    return {"modules_loaded": len(lora.loras), "modules_adapted": len(adapted),
            "missing": sorted(adapted - set(lora.loras)), "extra": sorted(set(lora.loras) - adapted),
            "max_abs_weight_diff": worst, "scaling": next(iter(lora.loras.values())).scaling,
            "ok": adapted == set(lora.loras) and worst <= ATOL}


def sglang_read(folder: str) -> dict:
    from sglang.srt.lora.lora_config import LoRAConfig

    cfg = LoRAConfig(folder)
    targets = cfg.target_modules
    # SGLang takes a list of module names, or the strings all / all-linear (lora_manager.init_lora_shapes)
    ok = (cfg.hf_config["peft_type"].lower() == "lora" and cfg.r == RANK and not cfg.use_dora
          and (isinstance(targets, list) or targets in ("all", "all-linear")))
    return {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": sorted(targets), "ok": ok}


def main() -> None:
    require("vllm", "peft")
    from transformers import AutoConfig

    from roll.models.tiny import build_tiny_model

    root = Path(tempfile.mkdtemp())
    # untied: an adapter on the input embedding is refused on tied embeddings (a merge would move the head)
    path = str(build_tiny_model(root / "model", vocab_size=2048, hidden_size=256, num_layers=2, num_heads=4,
                                tie_word_embeddings=False))
    hf = AutoConfig.from_pretrained(path)
    has_sglang = importlib.util.find_spec("sglang") is not None
    results: dict = {"model": "tiny llama, untied embeddings", "rank": RANK}
    ok = True
    for target in TARGETS:
        model, config, tensors = adapter(path, target)
        folder, folders = write_folder(config, tensors)
        entry = {"vllm": vllm_read(folder, model, hf.vocab_size, hf.max_position_embeddings)}
        if has_sglang:
            entry["sglang"] = sglang_read(folder)
        ok = ok and all(part["ok"] for part in entry.values())
        results[target] = entry
        folders.close()
    emit("adapter_loaders", results, ok)


if __name__ == "__main__":
    main()
