"""sglang: actor_infer on SGLang's offline Engine (RadixAttention, continuous batching).

The same contract as vllm:
- token ids in, token ids and log-probs out; ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` is set in this
  worker process before SGLang loads, so log-probs are the raw model distribution's (before
  temperature), as hf_infer reports them;
- weight sync through ``Engine.update_weights_from_tensor`` (HF names, SGLang's loader shards them),
  flushing the radix cache after the last bucket's update;
- colocated with training: ``release_memory_occupation`` / ``resume_memory_occupation`` (needs
  ``enable_memory_saver``, on by default when colocated);
- LoRA runs: the engine starts with LoRA enabled at the trainer's rank and applies the trainer's adapter;
  a sync sends the adapter's tensors only, written as a peft folder and loaded with
  ``load_lora_adapter`` under a new name (the previous one unloaded); every request names it.
  ``lora_adapters: false`` (or ``load_format: dummy``) falls back to merged full weights.

The Engine drives its own event loop from whichever thread calls it, so calls are serialised with a
lock; each call is a whole batch, which SGLang schedules with continuous batching.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import threading
from typing import Any

import torch

from roll.configs.strategy_configs import SGLangConfig, parse_strategy_config
from roll.distributed.batch import Batch
from roll.models.dtypes import engine_dtype
from roll.strategies.adapter_folders import AdapterFolders, EngineAdapterSync
from roll.strategies.backends import check_backend, check_passthrough
from roll.strategies.base import Generation, InferenceStrategy, NamedTensors, SamplingParams, StrategyContext

log = logging.getLogger(__name__)



def engine_kwargs(c: SGLangConfig, model_path: str, dtype: str | None, seed: int, colocated: bool,
                  max_len: int | None, trust_remote_code: bool = False, lora_rank: int | None = None) -> dict[str, Any]:
    """sglang.Engine (ServerArgs) fields for one engine (pure; checked on CPU). ``lora_rank``: LoRA on every
    module SGLang can adapt, up to that rank (one adapter: the policy's)."""
    kw: dict[str, Any] = dict(
        model_path=model_path,
        dtype=engine_dtype(dtype),
        random_seed=seed,
        load_format=c.load_format,
        tp_size=c.tensor_parallel_size,
        disable_cuda_graph=c.disable_cuda_graph,
        enable_memory_saver=colocated if c.enable_memory_saver is None else c.enable_memory_saver,
        trust_remote_code=trust_remote_code,
        log_level="error",
    )
    if c.mem_fraction_static is not None:
        kw["mem_fraction_static"] = c.mem_fraction_static
    if c.context_length is not None or max_len is not None:
        kw["context_length"] = c.context_length or max_len
    if c.max_running_requests is not None:
        kw["max_running_requests"] = c.max_running_requests
    if c.attention_backend is not None:
        kw["attention_backend"] = c.attention_backend
    if lora_rank is not None:
        # no adapter exists at start, so SGLang needs the rank and the modules to size its LoRA buffers
        kw.update(enable_lora=True, max_lora_rank=lora_rank, lora_target_modules=["all"], max_loras_per_batch=1)
    kw.update(c.engine_kwargs)
    return kw


def sampling_dict(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        max_new_tokens=params.max_new_tokens,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=params.top_k if params.top_k > 0 and not params.greedy else -1,
        repetition_penalty=params.repetition_penalty,
    )
    if params.stop_strings:
        out["stop"] = list(params.stop_strings)
    if seed is not None:
        out["sampling_seed"] = seed
    return out


def generation_from_output(output: dict[str, Any]) -> Generation:
    """Tokens and their log-probs from one SGLang result (``return_logprob=True``)."""
    meta = output["meta_info"]
    triples = meta["output_token_logprobs"]  # (logprob, token_id, text or None) per generated token
    tokens = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples]
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else str(finish)
    return Generation(tokens, logprobs, "length" if kind == "length" else "stop")


def server_arg_names(server_args: type) -> set[str]:
    """The fields of SGLang's ServerArgs: a dataclass in earlier 0.5 releases, a msgspec struct in later ones."""
    if dataclasses.is_dataclass(server_args):
        return {f.name for f in dataclasses.fields(server_args)}
    return set(getattr(server_args, "__struct_fields__", ()))


class SGLangStrategy(EngineAdapterSync, InferenceStrategy):
    engine_name = "sglang"

    def __init__(self, worker_config: Any, context: StrategyContext | None = None) -> None:
        self.config = worker_config
        self.context = context or StrategyContext(role="actor_infer")
        self.engine: Any = None
        self.released = False
        self.per_request_seed = False
        self.lock = threading.Lock()
        self.engine_config = parse_strategy_config("sglang", worker_config.strategy_args.strategy_config,
                                             f"{self.context.role}.strategy_args.strategy_config")
        self.adapters: AdapterFolders | None = None  # LoRA run with the adapter applied here: its synced versions
        self.lora_name: str | None = None  # the loaded adapter every request names
        self.lora_version = 0

    def initialize(self) -> None:
        check_backend("sglang", f"{self.context.role}.strategy_args.strategy_name")
        # Read when SGLang's sampler loads (in its scheduler processes, which inherit it).
        os.environ["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "1"
        import sglang
        from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSampling
        from sglang.srt.server_args import ServerArgs

        from roll.models.resolve import ensure_hf_folder

        margs = self.config.model_args
        check_passthrough(self.engine_config.engine_kwargs, server_arg_names(ServerArgs),
                          f"{self.context.role}.strategy_args.strategy_config")
        rank = self._adapter_slot()
        kwargs = engine_kwargs(self.engine_config, ensure_hf_folder(margs.model_name_or_path, margs.gguf_file), margs.dtype,
                               self.context.seed, self.context.colocated, self.context.max_sequence_length,
                               margs.trust_remote_code, lora_rank=rank)
        if rank is not None:
            self.adapters = AdapterFolders()
        log.info("sglang: starting Engine (tp=%d, load_format=%s, memory saver=%s, LoRA rank %s)", kwargs["tp_size"],
                 kwargs["load_format"], kwargs["enable_memory_saver"], rank)
        # per-request seeds arrived in later 0.5 releases; older ones sample from the engine seed
        self.per_request_seed = "sampling_seed" in inspect.signature(SGLangSampling.__init__).parameters
        self.engine = sglang.Engine(**kwargs)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        assert self.engine is not None, "initialize() first"
        if not prompts:
            return []
        seeds = [None if params.seed is None or not self.per_request_seed else params.seed + i
                 for i in range(len(prompts))]
        with self.lock:
            self._resume()
            outputs = self.engine.generate(input_ids=[list(p) for p in prompts],
                                           sampling_params=[sampling_dict(params, s) for s in seeds],
                                           return_logprob=True, **self._lora(len(prompts)))
        return [generation_from_output(o) for o in outputs]

    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        assert self.engine is not None, "initialize() first"
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        rows = [mask[i].nonzero().flatten() for i in range(len(batch))]
        tokens = [ids[i, pos].tolist() for i, pos in enumerate(rows)]
        with self.lock:
            self._resume()
            outputs = self.engine.generate(input_ids=tokens, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                                           return_logprob=True, logprob_start_len=0, **self._lora(len(tokens)))
        out = torch.zeros(ids.shape, dtype=torch.float32)
        for i, o in enumerate(outputs):
            for t, triple in enumerate(o["meta_info"]["input_token_logprobs"]):
                if t > 0 and triple[0] is not None:  # position 0 has no log-prob
                    out[i, rows[i][t]] = float(triple[0])
        return out

    def _lora(self, n: int) -> dict[str, Any]:
        """The generate() argument naming the policy's adapter for ``n`` requests (none before the first sync)."""
        return {} if self.lora_name is None else {"lora_path": [self.lora_name] * n}

    def load_weights(self, named_tensors: NamedTensors) -> None:
        assert self.engine is not None, "initialize() first"
        if self._gather_adapter(named_tensors):  # loaded as a whole in finish_weight_sync
            return
        with self.lock:
            self._resume()
            self.engine.update_weights_from_tensor(named_tensors=[(n, t.contiguous()) for n, t in named_tensors],
                                                   flush_cache=True)

    def finish_weight_sync(self) -> None:
        """A LoRA sync's adapter, now whole: the previous adapter unloaded, this one loaded under a new name."""
        self._publish_adapter()

    def _swap_adapter(self, version: int, folder: str) -> int | None:
        name = f"roll-policy-v{version}"
        replaced = None
        with self.lock:
            self._resume()
            if self.lora_name is not None:  # unloaded first: the engine holds one adapter (max_loras_per_batch 1)
                self.engine.unload_lora_adapter(self.lora_name)
                replaced, self.lora_name = self.lora_version, None
            result = self.engine.load_lora_adapter(lora_name=name, lora_path=folder)
            if not getattr(result, "success", True):
                raise RuntimeError(f"sglang: the engine did not take the synced LoRA adapter ({folder}): "
                                   f"{getattr(result, 'error_message', '')}")
            self.lora_name, self.lora_version = name, version
        return replaced

    def offload(self) -> None:
        if self.engine is None or self.released or not self._memory_saver():
            return
        with self.lock:
            self.engine.release_memory_occupation()
            self.released = True

    def reload(self) -> None:
        with self.lock:
            self._resume()

    def _resume(self) -> None:
        if self.released:
            self.engine.resume_memory_occupation()
            self.released = False

    def _memory_saver(self) -> bool:
        enabled = self.engine_config.enable_memory_saver
        return self.context.colocated if enabled is None else enabled

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.adapters is not None:
            self.adapters.close()
