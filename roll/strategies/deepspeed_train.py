"""deepspeed_train: actor_train and critic on DeepSpeed (ZeRO stages 0-3, CPU offload).

The ``strategy_config`` is a DeepSpeed config (the ``deepspeed_zero*.yaml`` pieces); its "auto"
fields are filled from ``training_args``. The optimizer is a torch AdamW handed to DeepSpeed
(``zero_force_ds_cpu_optimizer: false``), so no DeepSpeed CPU op is JIT-compiled.

Losses come in already normalised by global token/sequence counts (``roll.algorithms.losses``):
micro-batch losses add up to the mini-batch loss, so backward runs without DeepSpeed's
1/gradient_accumulation scaling, and the loss is multiplied by the data-parallel size because
DeepSpeed averages gradients over ranks. One data-parallel step then equals one big-batch step.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from roll.distributed.batch import Batch
from roll.models.loading import load_causal_lm, load_value_model
from roll.models.logprobs import (
    CHUNK_ABOVE_BYTES,
    CHUNK_TOKENS,
    chunked_entropy,
    chunked_token_logprobs,
    chunking_pays,
    position_ids_from_mask,
    shifted_token_logprobs,
    split_causal_lm,
)
from roll.models.lora import (
    adapter_named_tensors,
    add_adapter,
    freeze,
    is_adapted,
    lora_config,
    lora_enabled,
    merged_named_tensors,
)
from roll.strategies.base import (
    ForwardOutput,
    LossFn,
    NamedTensors,
    StepStats,
    StrategyContext,
    TrainStrategy,
    dp_sum,
    global_counts,
    loss_mask_key,
    mini_batches,
    set_lr,
)
from roll.strategies.lr_schedule import LRSchedule
from roll.strategies.micro_batching import budget_groups, micro_batches_of, scatter_rows, split_to
from roll.strategies.train_state_offload import TrainStateOffload

log = logging.getLogger(__name__)

CPU_DIST_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


def fill_ds_config(ds: dict[str, Any] | None, training_args: Any, world_size: int, dtype: str | None,
                   max_grad_norm: float, hidden_size: int) -> dict[str, Any]:
    """A DeepSpeed config with every "auto" resolved from the training arguments."""
    cfg = copy.deepcopy(ds or {"zero_optimization": {"stage": 0}})
    micro, gas = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    fills = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "train_batch_size": micro * gas * world_size,
        "gradient_clipping": max_grad_norm,
    }
    for key, value in fills.items():
        if cfg.get(key, "auto") == "auto":
            cfg[key] = value
    cfg.setdefault("bf16", {})["enabled"] = dtype == "bf16" if cfg.get("bf16", {}).get("enabled", "auto") == "auto" else cfg["bf16"]["enabled"]
    cfg.setdefault("fp16", {})["enabled"] = dtype == "fp16" if cfg.get("fp16", {}).get("enabled", "auto") == "auto" else cfg["fp16"]["enabled"]
    zero = cfg.setdefault("zero_optimization", {"stage": 0})
    auto_zero = {  # sizes DeepSpeed's HF integration derives from the hidden size
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key, value in auto_zero.items():
        if zero.get(key) == "auto":
            zero[key] = value
    cfg.setdefault("zero_allow_untested_optimizer", True)
    cfg.setdefault("zero_force_ds_cpu_optimizer", False)
    cfg.setdefault("steps_per_print", 10**9)
    return cfg


class DeepSpeedTrainStrategy(TrainStrategy):
    def __init__(self, worker_config: Any, context: StrategyContext | None = None) -> None:
        context = context or StrategyContext()
        self.config = worker_config
        self.role = context.role
        self.seed = context.seed
        self.max_grad_norm = context.max_grad_norm
        self.train_calls = context.train_calls
        self.world_size = context.world_size
        self.rank = context.rank
        self.is_critic = worker_config.model_args.model_type == "value" or self.role == "critic"
        self.engine: Any = None
        self.partial = False  # some weights are frozen
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.zero_stage = 0
        self.chunk_above = CHUNK_ABOVE_BYTES  # fp32 logits of a micro-batch past this size: chunked log-probs
        self.chunk_tokens = CHUNK_TOKENS

    # --- set-up
    def initialize(self) -> None:
        if self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # this worker process only
            for key, value in CPU_DIST_ENV.items():
                os.environ.setdefault(key, value)
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        import deepspeed

        if self.device.type == "cpu":
            _disable_cpu_op_builds()
        torch.manual_seed(self.seed)
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="gloo" if self.device.type == "cpu" else "nccl")
        model_args = self.config.model_args
        model = load_value_model(model_args) if self.is_critic else load_causal_lm(model_args)
        if not model_args.disable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        freeze(model, model_args.freeze_module_prefix)
        if lora_enabled(model_args):
            model = add_adapter(model, lora_config(model_args, model))
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.partial = len(trainable) < sum(1 for _ in model.parameters())  # checkpoints skip the frozen weights
        ta = self.config.training_args
        # frozen weights get no optimizer state (LoRA: only the adapter's tensors are in the optimizer)
        optimizer = torch.optim.AdamW(trainable, lr=ta.learning_rate, betas=(ta.adam_beta1, ta.adam_beta2),
                                      eps=ta.adam_epsilon, weight_decay=ta.weight_decay)
        # the schedule sets each step's lr itself (its length follows what this role really runs)
        self.schedule = LRSchedule(ta.lr_scheduler_type, ta.learning_rate, self.train_calls, ta.warmup_steps, ta.warmup_ratio)
        hidden = _hidden_size(model)
        ds_config = fill_ds_config(self.config.strategy_args.strategy_config, ta, self.world_size,
                                   model_args.dtype, self.max_grad_norm, hidden)
        self.zero_stage = int(ds_config["zero_optimization"].get("stage", 0))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config, dist_init_required=False
        )
        self.state_offload = TrainStateOffload(self.engine, self.device)

    # --- forward passes
    def _forward(self, batch: Batch, grad: bool) -> ForwardOutput:
        ids = batch["input_ids"].to(self.device)
        mask = batch["attention_mask"].to(self.device)
        pos = batch.tensors.get("position_ids")
        pos = (pos if pos is not None else position_ids_from_mask(mask)).to(self.device)
        bf16 = self.config.training_args.bf16
        with torch.set_grad_enabled(grad), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            if self.is_critic:
                return ForwardOutput(values=self.engine(input_ids=ids, attention_mask=mask, position_ids=pos).float())
            # ZeRO-3 keeps whole logits: its partitioned (tied) head would be gathered again by each chunk's
            # recompute in the backward pass, outside the order its hooks traced
            split = split_causal_lm(self.engine.module) if self.zero_stage < 3 else None
            if split is None or not chunking_pays(ids.numel(), split[1].out_features, self.chunk_above):
                logits = self.engine(input_ids=ids, attention_mask=mask, position_ids=pos).logits
                return ForwardOutput(logits=logits, logprobs=shifted_token_logprobs(logits, ids))
            # big logits: the head and the fp32 log-softmax a few hundred positions at a time, so the [B, T, V]
            # logits are never whole, in the forward or (recomputed per piece) in the backward
            body, head = split
            hidden = body(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state

            def entropy() -> torch.Tensor:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                    return chunked_entropy(hidden, head, self.chunk_tokens)

            return ForwardOutput(logprobs=chunked_token_logprobs(hidden, head, ids, self.chunk_tokens), entropy_fn=entropy)

    @torch.no_grad()
    def _batched(self, batch: Batch, field: str) -> torch.Tensor:
        self.engine.eval()
        c = self.config
        if c.use_dynamic_batching_in_infer and len(batch):
            budget = c.max_tokens_per_microbatch_in_infer or c.infer_batch_size * batch["attention_mask"].shape[1]
            micros, groups = self._dynamic(batch, budget, c.sequence_length_round_in_infer)
            parts = [getattr(self._forward(m, grad=False), field).detach().cpu() for m in micros]
            return scatter_rows(parts, groups, len(batch), batch["attention_mask"].shape[1])
        out = []
        for start in range(0, len(batch), c.infer_batch_size):
            part = batch.select(range(start, min(len(batch), start + c.infer_batch_size)))
            out.append(getattr(self._forward(part, grad=False), field).detach().cpu())
        return torch.cat(out)

    def _dynamic(self, batch: Batch, budget: int, round_to: int) -> tuple[list[Batch], list[list[int]]]:
        """Token-budget micro-batches, as many on every data-parallel rank (ZeRO collectives run per forward)."""
        groups = budget_groups(batch, budget, round_to)
        if self.world_size > 1:
            count = torch.tensor([len(groups)], device=self.device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            groups = split_to(groups, int(count.item()))
        return micro_batches_of(batch, groups, round_to), groups

    def _train_micro_batches(self, mini_batch: Batch) -> list[Batch]:
        ta, c = self.config.training_args, self.config
        if c.use_dynamic_batching_in_train:
            budget = c.max_tokens_per_microbatch_in_train or ta.per_device_train_batch_size * mini_batch["attention_mask"].shape[1]
            return self._dynamic(mini_batch, budget, c.sequence_length_round_in_train)[0]
        micro = ta.per_device_train_batch_size
        return [mini_batch.select(range(s, min(len(mini_batch), s + micro))) for s in range(0, len(mini_batch), micro)]

    def compute_log_probs(self, batch: Batch, adapters: bool = True) -> torch.Tensor:
        """Log-probs of the current policy; ``adapters=False``: of the base model under a LoRA adapter (the
        reference policy of a LoRA run, with no second copy of the weights)."""
        if self.is_critic:
            raise RuntimeError("the critic has no log-probs")
        if adapters or not self.lora:
            return self._batched(batch, "logprobs")
        with self.engine.module.disable_adapter():
            return self._batched(batch, "logprobs")

    @property
    def lora(self) -> bool:
        return self.engine is not None and is_adapted(self.engine.module)

    def compute_values(self, batch: Batch) -> torch.Tensor:
        if not self.is_critic:
            raise RuntimeError(f"{self.role} has no value head; values come from the critic")
        return self._batched(batch, "values")

    # --- training
    def train_step(self, batch: Batch, loss_fn: LossFn, epochs: int = 1) -> dict[str, float]:
        """``epochs`` passes over ``batch`` in mini-batches of per_device x grad_accum rows, one
        optimizer step per mini-batch. Returns the metrics of the whole global batch (see StepStats)."""
        self.engine.train()
        stats = StepStats()
        mask_key = loss_mask_key(batch)
        minis = mini_batches(batch, self.config.training_args, epochs)
        self.schedule.plan(len(minis))
        for mini_batch in minis:
            counts = global_counts(mini_batch[mask_key], self.device, world_size=self.world_size)
            parts = self._train_micro_batches(mini_batch)
            for j, part in enumerate(parts):
                micro_batch = part.to(self.device)
                out = self._forward(micro_batch, grad=True)
                loss, metrics = loss_fn(micro_batch, out, counts)
                self.engine.set_gradient_accumulation_boundary(j == len(parts) - 1)
                self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
                stats.add_micro(metrics)
            lr = self.schedule.lr()
            set_lr(self.engine.optimizer, lr)
            before = self._grad_norm_before_step()
            self.engine.step()
            self.schedule.step_taken()
            norm = before if before is not None else self.engine.get_global_grad_norm()
            stats.add_step(float(norm) if norm is not None else None, lr)
        self.schedule.call_done()
        many = self.world_size > 1
        return stats.summary("critic" if self.is_critic else "actor", dp_sum(self.device) if many else None,
                             dp_sum(self.device, op="max") if many else None)

    def _grad_norm_before_step(self) -> float | None:
        """Without ZeRO, DeepSpeed does not report the norm: take it from the gradients (before clipping)."""
        if self.zero_stage != 0:
            return None
        norms = [torch.linalg.vector_norm(p.grad.float()) for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    # --- weights
    def _sync_tensors(self, adapters: bool) -> list[tuple[str, Any]]:
        """What a weight sync sends: every parameter; under LoRA the adapter's tensors alone (``adapters``,
        for engines that apply adapters) or every weight with the adapter merged in."""
        if not self.lora:
            return list(self.engine.module.named_parameters())
        return adapter_named_tensors(self.engine.module) if adapters else merged_named_tensors(self.engine.module)

    def adapter_config(self) -> dict[str, Any] | None:
        """The LoRA adapter's peft config (JSON-able), or None without LoRA."""
        if not self.lora:
            return None
        config = self.engine.module.peft_config["default"].to_dict()
        return {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}

    def weight_sizes(self, adapters: bool = False) -> list[tuple[str, int]]:
        """(name, bytes) of every tensor a sync sends, in sync order."""
        return [(n, _numel(p) * p.element_size()) for n, p in self._sync_tensors(adapters)]

    def weight_buckets(self, bucket_bytes: int = 256 << 20, adapters: bool = False) -> Iterator[NamedTensors]:
        """(name, tensor) lists of at most ``bucket_bytes`` each; ZeRO-3 gathers one bucket at a time."""
        bucket: list[tuple[str, torch.nn.Parameter]] = []
        size = 0
        for name, param in self._sync_tensors(adapters):
            nbytes = _numel(param) * param.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield self._materialise(bucket)
                bucket, size = [], 0
            bucket.append((name, param))
            size += nbytes
        if bucket:
            yield self._materialise(bucket)

    def _materialise(self, bucket: list[tuple[str, torch.nn.Parameter]]) -> NamedTensors:
        if self.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for _, p in bucket], modifier_rank=None):
                return [(n, p.detach().clone().cpu()) for n, p in bucket]
        return [(n, p.detach().cpu()) for n, p in bucket]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for bucket in self.weight_buckets() for n, t in bucket}

    # --- checkpoints
    def save_checkpoint(self, path: str) -> None:
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        # frozen weights (LoRA's base model, freeze_module_prefix) are not saved: they come from the model path
        self.engine.save_checkpoint(path, tag=self.role, client_state={"rng": rng, "lr_schedule": self.schedule.state_dict()},
                                    save_latest=False, exclude_frozen_parameters=self.partial)
        if self.lora and self.rank == 0:  # the adapter as peft saves it, loadable from outside (PeftModel.from_pretrained)
            self.engine.module.save_pretrained(os.path.join(path, "adapter"))

    def load_checkpoint(self, path: str) -> None:
        if not os.path.isdir(os.path.join(path, self.role)):  # DeepSpeed would fail with a bare assert
            raise FileNotFoundError(f"no {self.role} checkpoint in {path}")
        _, client = self.engine.load_checkpoint(path, tag=self.role, load_optimizer_states=True, load_lr_scheduler_states=False,
                                                load_module_strict=not self.partial)
        if client is None:
            raise FileNotFoundError(f"no {self.role} checkpoint in {path}")
        self.schedule.load_state_dict(client["lr_schedule"])
        rng = client["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    # --- memory
    def offload(self) -> None:
        """Weights, gradients and optimizer state to host memory (see roll.strategies.train_state_offload for
        what moves per ZeRO stage). On a CPU there is nothing to free: nothing moves."""
        if self.device.type != "cpu":
            self.state_offload.offload()
            gc.collect()
            torch.cuda.empty_cache()

    def reload(self) -> None:
        if self.device.type != "cpu":
            self.state_offload.reload()


def _numel(param: torch.nn.Parameter) -> int:
    return int(getattr(param, "ds_numel", param.numel()))  # ZeRO-3 partitions keep the full size here


def _hidden_size(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None) or getattr(getattr(model, "body", None), "config", None)
    return int(getattr(config, "hidden_size", 1024))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _disable_cpu_op_builds() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op (35-50 s on a fresh
    machine): it only speeds up intra-node CPU collectives, and gloo does the same work."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
