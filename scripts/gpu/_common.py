"""Shared by the GPU checks: package and CUDA checks, a random-init model, HF reference log-probs,
agreement figures, output. Only torch, transformers and tokenizers are needed besides the backend."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# bf16 engines against an fp32 HF forward of the same tokens: per-token |log-prob difference|
TOLERANCE = {"mean_abs": 0.03, "max_abs": 0.3}


def require(*modules: str) -> None:
    """Exit 3 naming every missing module and how to install it without internet."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"missing packages: {', '.join(missing)}. Install them from a folder of wheels: "
              f"python -m pip install --no-index --find-links WHEELS {' '.join(missing)}", file=sys.stderr)
        sys.exit(3)


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        print("this check needs a CUDA GPU and this machine has none", file=sys.stderr)
        sys.exit(2)


def tiny_model(folder: Path) -> str:
    """A random-init Llama (4 layers, hidden 512, head_dim 64) with a locally trained tokenizer."""
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(folder / "model", vocab_size=2048, hidden_size=512, num_layers=4, num_heads=8))


def worker_config(path: str, strategy: str, strategy_config: dict | None, dtype: str = "bf16", lr: float = 1e-4,
                  micro: int = 2, gas: int = 2) -> Any:
    from roll.configs.schema import GeneratingArgs, ModelArgs, StrategyArgs, TrainingArgs, WorkerConfig

    return WorkerConfig(
        model_args=ModelArgs(model_name_or_path=path, dtype=dtype, disable_gradient_checkpointing=True),
        training_args=TrainingArgs(learning_rate=lr, per_device_train_batch_size=micro, gradient_accumulation_steps=gas),
        generating_args=GeneratingArgs(max_new_tokens=64),
        strategy_args=StrategyArgs(strategy, strategy_config),
        infer_batch_size=8,
    )


def vocab_size(path: str) -> int:
    """The model's real vocabulary (a locally trained tokenizer may stop short of the size asked for)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(path).vocab_size)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Token ids in [10, vocab): past the special tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, length), generator=g).tolist()


def hf_logprobs(path: str, sequences: list[list[int]], state: dict | None = None,
                adapter: tuple[dict, dict] | None = None) -> list[list[float]]:
    """log p(x_t | x_<t) for t >= 1 of each sequence, fp32 HF forward on the GPU; ``state``: weights to load
    first; ``adapter``: (peft config, tensors in peft names) of a LoRA adapter to apply (peft)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device()).eval()
    if state is not None:
        model.load_state_dict(state, strict=False)
    if adapter is not None:
        from peft import LoraConfig, inject_adapter_in_model

        config, tensors = adapter
        inject_adapter_in_model(LoraConfig(**{k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__}),
                                model)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, t in tensors.items():
                params[name.removeprefix("base_model.model.")].copy_(t)
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=device())
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            out.append(logp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def agreement(ours: list[list[float]], ref: list[list[float]]) -> dict[str, float]:
    diffs = [abs(a - b) for xs, ys in zip(ours, ref) for a, b in zip(xs, ys)]
    diffs.sort()
    return {"tokens": len(diffs), "mean_abs": sum(diffs) / max(len(diffs), 1), "max_abs": diffs[-1] if diffs else 0.0,
            "p99_abs": diffs[int(0.99 * (len(diffs) - 1))] if diffs else 0.0}


def within(figures: dict[str, float]) -> bool:
    return figures["mean_abs"] <= TOLERANCE["mean_abs"] and figures["max_abs"] <= TOLERANCE["max_abs"]


def buckets(state: dict, bucket_bytes: int = 64 << 20) -> list[list[tuple[str, Any]]]:
    out, current, size = [], [], 0
    for name, t in state.items():
        if current and size + t.numel() * t.element_size() > bucket_bytes:
            out.append(current)
            current, size = [], 0
        current.append((name, t))
        size += t.numel() * t.element_size()
    return out + ([current] if current else [])


def device() -> str:
    """Where the HF reference runs: the GPU, or the CPU for the checks that run there (vLLM's CPU build)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_used_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


class Clock:
    def __enter__(self) -> Clock:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start


def emit(name: str, results: dict[str, Any], ok: bool) -> None:
    """Print the figures (one JSON line) and write them under $OUT when set; exit 1 when a check failed."""
    results = {"check": name, "passed": ok, "tolerance": TOLERANCE, **results}
    text = json.dumps(results, indent=2, default=float)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(text)
    sys.exit(0 if ok else 1)
