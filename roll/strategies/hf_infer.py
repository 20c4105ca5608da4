"""hf_infer: a transformers model for rollouts (actor_infer) and log-probs (reference).

Generation runs on ``hf_engine.GenerationEngine``: token-id prompts in, each request's sampled token
ids exactly as produced (up to and including EOS) out, with their log-probs under the model (raw
logits, temperature 1), which is what training recomputes. A conversation's earlier turns are not
re-encoded (prefix cache), and requests join and leave the decode batch step by step.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from roll.configs.strategy_configs import parse_strategy_config
from roll.distributed.batch import Batch
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.logprobs import forward_logprobs
from roll.models.lora import peft_module_name as base_model_name
from roll.strategies.base import Generation, InferenceStrategy, NamedTensors, SamplingParams, StrategyContext
from roll.strategies.decode_attention import use_decode_attention
from roll.strategies.hf_engine import GenerationEngine
from roll.strategies.micro_batching import dynamic_micro_batches, scatter_rows

log = logging.getLogger(__name__)


class HFInferStrategy(InferenceStrategy):
    def __init__(self, worker_config: Any, context: StrategyContext | None = None, device: str | None = None) -> None:
        self.config = worker_config
        self.context = context or StrategyContext(role="actor_infer")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.eos_ids: set[int] = set()
        self.engine: GenerationEngine | None = None
        self.adapter: dict[str, Any] | None = None  # the trainer's LoRA config, once a LoRA sync arrived

    def initialize(self) -> None:
        self.tokenizer = load_tokenizer(self.config.model_args)
        self.model = load_causal_lm(self.config.model_args).to(self.device).eval()
        use_decode_attention(self.model)  # CPU only: SDPA's kernels are slow for one-token decode steps
        gen_eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        hc = parse_strategy_config("hf_infer", self.config.strategy_args.strategy_config,
                                   f"{self.context.role}.strategy_args.strategy_config")
        self.engine = GenerationEngine(self.model, self.eos_ids, self.tokenizer,
                                       cache_tokens=hc.prefix_cache_tokens if hc.enable_prefix_caching else 0,
                                       seed=self.context.seed + 7919 * self.context.rank, max_rows=hc.max_num_seqs,
                                       prefill_tokens=hc.max_num_batched_tokens)

    # --- generation
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        assert self.engine is not None, "initialize() first"
        if not prompts:
            return []
        return self.engine.generate(prompts, params)

    def take_cache_stats(self) -> dict[str, int]:
        """Prompt tokens looked up and how many of them came from the prefix cache, since the last call."""
        assert self.engine is not None, "initialize() first"
        return self.engine.cache.take_stats()

    # --- log-probs of given sequences (reference role)
    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        assert self.model is not None, "initialize() first"
        c = self.config
        if getattr(c, "use_dynamic_batching_in_infer", False) and len(batch):
            width = batch["attention_mask"].shape[1]
            budget = c.max_tokens_per_microbatch_in_infer or c.infer_batch_size * width
            micros, groups = dynamic_micro_batches(batch, budget, c.sequence_length_round_in_infer)
            parts = [forward_logprobs(self.model, m["input_ids"].to(self.device), m["attention_mask"].to(self.device),
                                      m.tensors.get("position_ids"), micro_batch_size=len(m)).cpu() for m in micros]
            return scatter_rows(parts, groups, len(batch), width)
        return forward_logprobs(
            self.model,
            batch["input_ids"].to(self.device),
            batch["attention_mask"].to(self.device),
            batch.tensors.get("position_ids"),
            micro_batch_size=self.config.infer_batch_size,
        ).cpu()

    # --- weights and memory
    accepts_adapters = True  # a LoRA sync sends the adapter's tensors; the model applies them

    def configure_adapter(self, config: dict[str, Any]) -> None:
        """Put the trainer's LoRA adapter (peft config) into the model, in place, once; its tensors arrive with
        each sync. The base weights stay as loaded."""
        assert self.model is not None, "initialize() first"
        if self.adapter == config:
            return
        if self.adapter is not None:
            raise ValueError("weight sync: the trainer's LoRA adapter changed shape during the run")
        from peft import inject_adapter_in_model

        from roll.models.lora import peft_config

        inject_adapter_in_model(peft_config(config), self.model)
        self.model.eval()
        self.adapter = config

    @torch.no_grad()
    def load_weights(self, named_tensors: NamedTensors) -> None:
        assert self.model is not None, "initialize() first"
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            name = base_model_name(name)
            if name not in params:
                raise KeyError(f"weight sync: the inference model has no parameter {name!r}")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        if self.engine is not None:
            self.engine.clear_cache()  # cached KV belongs to the old weights

    def state_dict(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        return {k: v.detach() for k, v in self.model.named_parameters()}

    def offload(self) -> None:
        if self.model is not None and self.device.type != "cpu":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        gc.collect()

    def reload(self) -> None:
        if self.model is not None and self.device.type != "cpu":
            self.model.to(self.device)
