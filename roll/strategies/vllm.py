"""vllm: actor_infer on vLLM's AsyncLLM engine (continuous batching, paged KV cache).

- Token ids in, token ids and log-probs out: the log-prob of each sampled token under the raw model
  distribution (``logprobs_mode="raw_logprobs"``, before temperature / top-k / top-p), which is
  what hf_infer reports and what training recomputes.
- Weight sync: bucketed HF-named tensors go to every GPU worker through ``collective_rpc`` into the
  model's own ``load_weights`` (vLLM's supported weight-loading path); the prefix cache is reset
  after each sync, so no KV block computed with old weights is reused.
- Colocated with training: ``offload`` puts the engine to sleep (level 1: weights to CPU, KV cache
  freed; level 2: both freed), ``reload`` wakes it; a sync wakes the weights first.
- ``load_format: dummy`` starts from random weights: the pipeline's first sync fills them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from typing import Any

import torch

from roll.configs.strategy_configs import VLLMConfig, parse_strategy_config
from roll.distributed.batch import Batch
from roll.strategies.async_runner import LoopThread
from roll.strategies.backends import check_backend, check_passthrough
from roll.strategies.base import Generation, InferenceStrategy, NamedTensors, SamplingParams, StrategyContext

log = logging.getLogger(__name__)

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", None: "auto"}
EXTENSION = "roll.strategies.vllm_worker.RollWorkerExtension"


def engine_kwargs(c: VLLMConfig, model_path: str, dtype: str | None, seed: int, colocated: bool,
                  max_len: int | None, trust_remote_code: bool = False) -> dict[str, Any]:
    """AsyncEngineArgs fields for one engine (pure; checked on CPU)."""
    kw: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        skip_tokenizer_init=False,  # stop strings need the detokenizer
        dtype=DTYPES[dtype],
        seed=seed,
        gpu_memory_utilization=c.gpu_memory_utilization,
        load_format=c.load_format,
        tensor_parallel_size=c.tensor_parallel_size,
        pipeline_parallel_size=c.pipeline_parallel_size,
        enforce_eager=c.enforce_eager,
        enable_prefix_caching=c.enable_prefix_caching,
        enable_sleep_mode=colocated if c.enable_sleep_mode is None else c.enable_sleep_mode,
        logprobs_mode="raw_logprobs",
        worker_extension_cls=EXTENSION,
        trust_remote_code=trust_remote_code,
        disable_log_stats=True,
    )
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(c, key) is not None:
            kw[key] = getattr(c, key)
    if c.max_model_len is not None or max_len is not None:
        kw["max_model_len"] = c.max_model_len or max_len
    kw.update(c.engine_kwargs)
    return kw


class VLLMStrategy(InferenceStrategy):
    def __init__(self, worker_config: Any, context: StrategyContext | None = None) -> None:
        self.config = worker_config
        self.context = context or StrategyContext(role="actor_infer")
        self.engine: Any = None
        self.runner: LoopThread | None = None
        self.sleeping: set[str] = set()
        self._ids = itertools.count()
        self.vconfig = parse_strategy_config("vllm", worker_config.strategy_args.strategy_config,
                                             f"{self.context.role}.strategy_args.strategy_config")

    def initialize(self) -> None:
        check_backend("vllm", f"{self.context.role}.strategy_args.strategy_name")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from roll.models.resolve import ensure_hf_folder

        margs = self.config.model_args
        path = f"{self.context.role}.strategy_args.strategy_config"
        check_passthrough(self.vconfig.engine_kwargs, {f.name for f in dataclasses.fields(AsyncEngineArgs)}, path)
        model_path = ensure_hf_folder(margs.model_name_or_path, margs.gguf_file)
        kwargs = engine_kwargs(self.vconfig, model_path, margs.dtype, self.context.seed, self.context.colocated,
                               self.context.max_sequence_length, margs.trust_remote_code)
        log.info("vllm: starting AsyncLLM (tp=%d, load_format=%s, sleep mode=%s)", self.vconfig.tensor_parallel_size,
                 kwargs["load_format"], kwargs["enable_sleep_mode"])
        self.runner = LoopThread("vllm-engine")

        async def start() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        self.engine = self.runner.run(start())

    # --- generation
    def _sampling(self, params: SamplingParams, seed: int | None, **extra: Any) -> Any:
        from vllm import SamplingParams as VSampling
        from vllm.sampling_params import RequestOutputKind

        return VSampling(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=params.top_k if params.top_k > 0 and not params.greedy else -1,
            repetition_penalty=params.repetition_penalty,
            stop=list(params.stop_strings) or None,
            seed=seed,
            logprobs=0,  # the sampled token's own log-prob
            output_kind=RequestOutputKind.FINAL_ONLY,
            **extra,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        assert self.engine is not None and self.runner is not None, "initialize() first"
        if not prompts:
            return []
        self._wake(None)
        from vllm.inputs import TokensPrompt

        async def one(prompt: list[int], index: int) -> Generation:
            # distinct seeds per row: identical prompts of a GRPO group must not get identical samples
            seed = None if params.seed is None else params.seed + index
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt)),
                                                  self._sampling(params, seed), request_id=f"roll-{next(self._ids)}"):
                final = out
            completion = final.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
            reason = "length" if completion.finish_reason == "length" else "stop"
            return Generation(tokens, logprobs, reason)

        async def all_of() -> list[Generation]:
            return list(await asyncio.gather(*(one(p, i) for i, p in enumerate(prompts))))

        return self.runner.run(all_of())

    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        """[B, T] log p(x_t | x_<t) of each row's attended tokens (prompt log-probs, one forward each)."""
        assert self.engine is not None and self.runner is not None, "initialize() first"
        self._wake(None)
        from vllm.inputs import TokensPrompt

        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        out = torch.zeros(ids.shape, dtype=torch.float32)
        greedy = SamplingParams(max_new_tokens=1, temperature=0.0)

        async def row(i: int) -> None:
            positions = mask[i].nonzero().flatten()
            tokens = ids[i, positions].tolist()
            final = None
            async for o in self.engine.generate(TokensPrompt(prompt_token_ids=tokens),
                                                self._sampling(greedy, None, prompt_logprobs=0),
                                                request_id=f"roll-lp-{next(self._ids)}"):
                final = o
            for t in range(1, len(tokens)):  # position 0 has no log-prob
                out[i, positions[t]] = float(final.prompt_logprobs[t][tokens[t]].logprob)

        async def all_rows() -> None:
            await asyncio.gather(*(row(i) for i in range(len(batch))))

        self.runner.run(all_rows())
        return out

    # --- weights and memory
    def load_weights(self, named_tensors: NamedTensors) -> None:
        assert self.engine is not None and self.runner is not None, "initialize() first"
        self._wake(["weights"])
        payload = [(name, tensor.contiguous()) for name, tensor in named_tensors]
        self.runner.run(self.engine.collective_rpc("roll_load_weights", args=(payload,)))
        self.runner.run(self.engine.reset_prefix_cache())  # cached KV blocks belong to the old weights

    def offload(self) -> None:
        if self.engine is None or self.runner is None or not self._sleep_mode():
            return
        if self.sleeping != {"weights", "kv_cache"}:
            self.runner.run(self.engine.sleep(level=self.vconfig.sleep_level))
            self.sleeping = {"weights", "kv_cache"}

    def reload(self) -> None:
        self._wake(None)

    def _sleep_mode(self) -> bool:
        enabled = self.vconfig.enable_sleep_mode
        return self.context.colocated if enabled is None else enabled

    def _wake(self, tags: list[str] | None) -> None:
        """Wake what is asleep (``tags`` None: everything)."""
        wanted = self.sleeping if tags is None else self.sleeping & set(tags)
        if not wanted or self.runner is None:
            return
        self.runner.run(self.engine.wake_up(tags=None if tags is None else sorted(wanted)))
        self.sleeping -= wanted

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.runner is not None:
            self.runner.close()
