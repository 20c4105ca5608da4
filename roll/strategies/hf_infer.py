"""hf_infer: a transformers model for rollouts (actor_infer) and log-probs (reference).

Generation takes token-id prompts, left-pads them into one batch per distinct sampling setting,
and returns each request's sampled token ids exactly as produced (up to and including EOS) with
their log-probs under the model (raw logits, temperature 1), which is what training recomputes.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from roll.distributed.batch import Batch
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.logprobs import forward_logprobs
from roll.strategies.base import Generation, InferenceStrategy, NamedTensors, SamplingParams, StrategyContext

log = logging.getLogger(__name__)


class HFInferStrategy(InferenceStrategy):
    def __init__(self, worker_config: Any, context: StrategyContext | None = None, device: str | None = None) -> None:
        self.config = worker_config
        self.context = context or StrategyContext(role="actor_infer")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.eos_ids: set[int] = set()

    def initialize(self) -> None:
        self.tokenizer = load_tokenizer(self.config.model_args)
        self.model = load_causal_lm(self.config.model_args).to(self.device).eval()
        gen_eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)

    # --- generation
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        assert self.model is not None, "initialize() first"
        if not prompts:
            return []
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0)
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        if params.stop_strings:
            kwargs.update(stop_strings=list(params.stop_strings), tokenizer=self.tokenizer)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), **kwargs
        )
        new_tokens = out.sequences[:, width:].cpu()
        # Log-prob of each sampled token under the raw logits of its step.
        step_logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, steps, V]
        chosen = step_logits.gather(-1, new_tokens[:, : step_logits.shape[1], None]).squeeze(-1)
        logprobs = chosen - torch.logsumexp(step_logits, dim=-1)
        del step_logits, out
        results = []
        for i in range(len(prompts)):
            tokens, lps, reason = [], [], "length"
            for t, tok in enumerate(new_tokens[i].tolist()):
                tokens.append(tok)
                lps.append(float(logprobs[i, t]))
                if tok in self.eos_ids:
                    reason = "stop"
                    break
            if reason == "length" and params.stop_strings:
                text = self.tokenizer.decode(tokens)
                if any(s in text for s in params.stop_strings):
                    reason = "stop"
            results.append(Generation(tokens, lps, reason))
        return results

    # --- log-probs of given sequences (reference role)
    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        assert self.model is not None, "initialize() first"
        return forward_logprobs(
            self.model,
            batch["input_ids"].to(self.device),
            batch["attention_mask"].to(self.device),
            batch.tensors.get("position_ids"),
            micro_batch_size=self.config.infer_batch_size,
        ).cpu()

    # --- weights and memory
    @torch.no_grad()
    def load_weights(self, named_tensors: NamedTensors) -> None:
        assert self.model is not None, "initialize() first"
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight sync: the inference model has no parameter {name!r}")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))

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
