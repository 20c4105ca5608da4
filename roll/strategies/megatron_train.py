"""megatron_train (actor_train, critic) and megatron_infer (reference) on megatron-core.

Each rank builds its GPTModel chunk(s) from the HF config (``megatron_model``), loads the HF
weights converted and cut to its (tensor, pipeline, virtual pipeline, expert) position
(``roll.models.megatron_convert``), and trains with megatron-core's DDP, optimizer (distributed
optimizer optional) and pipeline schedules.

Batches: every rank of a data-parallel group gets the same rows (``data_parallel_info``);
rows are right-aligned so megatron's causal mask is exact; all micro-batches of a mini-batch
share one length (pipeline schedules need it), rounded for sequence / context parallel.
Log-probs come from the vocabulary-parallel logits without gathering them (``megatron_math``);
with context parallel the per-position values are gathered back to whole sequences.

Losses arrive normalised by the global token/sequence counts (``roll.algorithms.losses``), so
their micro-batch sum is the mini-batch loss. megatron-core divides each micro-batch loss by the
number of micro-batches and averages gradients over data (x context) parallel ranks; the loss is
multiplied by micro-batches x data-parallel size to undo both (context parallel cancels out).

Weight sync and HF export: each pipeline stage gathers its tensor / expert shards, converts them
to HF names, and sends them to global rank 0 bucket by bucket; rank 0 yields them.
"""

from __future__ import annotations

import gc
import logging
import os
import random
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import torch

from roll.configs.megatron_targets import megatron_targets
from roll.configs.strategy_configs import check_megatron_model, parse_strategy_config
from roll.distributed.batch import Batch
from roll.models.logprobs import values_before_tokens
from roll.models.lora import freeze, save_hf_adapter
from roll.models.megatron_convert import (
    ParallelRank,
    hf_to_megatron,
    megatron_to_hf,
    merge,
    shard,
    unfuse_experts,
)
from roll.models.megatron_lora import (
    add_megatron_adapter,
    hf_adapter_sizes,
    hf_lora_config,
    local_adapter_tensors,
    lora_to_hf,
    merged_local_state,
    set_adapters,
    split_halves,
)
from roll.strategies.backends import check_backend
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
from roll.strategies.megatron_math import (
    cp_positions,
    gather_positions,
    restore,
    right_align,
    round_up,
    vocab_parallel_logprobs,
)

log = logging.getLogger(__name__)


class ValueOutput(torch.nn.Module):
    """The critic's head in place of megatron's output layer: hidden -> one value per token."""

    def __init__(self, hidden_size: int, sequence_parallel: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.value_head = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None, **_: Any) -> tuple:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
        return self.value_head(hidden), None


class MegatronTrainStrategy(TrainStrategy):
    trains = True

    def __init__(self, worker_config: Any, context: StrategyContext | None = None, device: str = "cuda") -> None:
        self.config = worker_config
        self.context = context or StrategyContext()
        # "cpu" only serves the CPU test of this strategy's own logic (megatron-core itself targets CUDA)
        self.device = torch.device(device)
        self.role = self.context.role
        self.name = worker_config.strategy_args.strategy_name
        self.where = f"{self.role}.strategy_args.strategy_config"
        self.mc = parse_strategy_config(self.name, worker_config.strategy_args.strategy_config, self.where)
        self.is_critic = worker_config.model_args.model_type == "value" or self.role == "critic"
        self.model: list[Any] = []
        self.optimizer: Any = None
        self.schedule: LRSchedule | None = None
        self._sizes: dict[bool, list[tuple[str, int]]] = {}
        ma = worker_config.model_args
        # LoRA: the megatron layers that carry an adapter (validated at config load)
        self.lora_targets = megatron_targets(ma.lora_target) if ma.lora_target else []
        self.partial = bool(self.lora_targets or ma.freeze_module_prefix)

    # --- set-up
    def initialize(self) -> None:
        if self.device.type == "cuda":
            check_backend(self.name, f"{self.role}.strategy_args.strategy_name")
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from transformers import AutoConfig

        from roll.models.resolve import ensure_hf_folder
        from roll.strategies.megatron_model import build_gpt_model, layout_for, use_transformer_engine

        mc, margs = self.mc, self.config.model_args
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # Ray gives each rank one visible GPU
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=self.context.rank,
                                                 world_size=self.context.world_size)
        if not ps.model_parallel_is_initialized():  # one process may host several roles' models (tests, tools)
            ps.initialize_model_parallel(**mc.parallel_sizes())
        if cuda:
            tensor_parallel.model_parallel_cuda_manual_seed(self.context.seed)
        torch.manual_seed(self.context.seed)
        self.model_path = ensure_hf_folder(margs.model_name_or_path, margs.gguf_file)
        self.hf_config = AutoConfig.from_pretrained(self.model_path, trust_remote_code=margs.trust_remote_code)
        hc = self.hf_config
        check_megatron_model(mc, hc.num_hidden_layers, hc.num_attention_heads,
                             getattr(hc, "num_key_value_heads", None) or hc.num_attention_heads, self.where,
                             num_experts=int(getattr(hc, "num_experts", 0) or getattr(hc, "num_local_experts", 0) or 0))
        use_te = use_transformer_engine(mc, lora=bool(self.lora_targets))
        self.layout = layout_for(hc, mc, use_te)
        vpp = mc.virtual_pipeline_model_parallel_size
        for v in range(vpp or 1):
            chunk = build_gpt_model(hc, mc, margs.dtype, use_te=use_te, vp_stage=v if vpp else None)
            if self.is_critic and chunk.post_process:
                chunk.share_embeddings_and_output_weights = False
                chunk.output_layer = ValueOutput(hc.hidden_size, chunk.config.sequence_parallel, chunk.config.params_dtype)
            self.model.append(chunk.to(self.device))
        self._load_hf_weights()
        if self.partial:
            self._adapt_or_freeze()
        if self.trains:
            self._wrap_for_training()
        log.info("%s: megatron-core model ready (tp=%d pp=%d vpp=%s cp=%d ep=%d, dp=%d, TE layers=%s)", self.role,
                 mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size, vpp, mc.context_parallel_size,
                 mc.expert_model_parallel_size, self.dp_size, use_te)

    def rank_position(self, vp_stage: int = 0) -> ParallelRank:
        from megatron.core import parallel_state as ps

        mc = self.mc
        etp = mc.expert_tensor_parallel_size or mc.tensor_model_parallel_size
        return ParallelRank(
            tp=mc.tensor_model_parallel_size, tp_rank=ps.get_tensor_model_parallel_rank(),
            pp=mc.pipeline_model_parallel_size, pp_rank=ps.get_pipeline_model_parallel_rank(),
            vpp=mc.virtual_pipeline_model_parallel_size or 1, vpp_rank=vp_stage,
            ep=mc.expert_model_parallel_size, ep_rank=ps.get_expert_model_parallel_rank(),
            etp=etp, etp_rank=ps.get_expert_tensor_parallel_rank(),
        )

    @torch.no_grad()
    def _load_hf_weights(self) -> None:
        from roll.models.loading import load_causal_lm

        hf = load_causal_lm(self.config.model_args)  # on CPU, once per rank
        full = hf_to_megatron({k: v for k, v in hf.state_dict().items()}, self.layout)
        del hf
        for v, chunk in enumerate(self.model):
            part = shard(full, self.layout, self.rank_position(v))
            if self.is_critic:
                part.pop("output_layer.weight", None)
            result = chunk.load_state_dict(part, strict=False)
            missing = [k for k in result.missing_keys if not k.endswith("_extra_state")
                       and not (self.is_critic and "value_head" in k)]
            if missing or result.unexpected_keys:
                raise RuntimeError(f"{self.role}: HF weights do not fit the megatron model (missing {missing[:5]}, "
                                   f"unexpected {result.unexpected_keys[:5]})")
        del full
        gc.collect()

    def _adapt_or_freeze(self) -> None:
        """LoRA adapters on the target layers (only they train), or freeze_module_prefix's parameters."""
        ma = self.config.model_args
        if self.layout.num_experts and self.lora_targets:
            raise ValueError(f"{self.role}.model_args.lora_target: LoRA on megatron_train is built for dense models; "
                             f"{self.hf_config.model_type} has experts")
        if self.lora_targets:
            adapted = sum(add_megatron_adapter(chunk, ma, self.lora_targets) for chunk in self.model)
            log.info("%s: LoRA rank %d on %d megatron layers (%s)", self.role, ma.lora_rank, adapted,
                     ",".join(self.lora_targets))
        else:
            frozen = [name for chunk in self.model for name in freeze(chunk, ma.freeze_module_prefix, strict=False)]
            # another pipeline stage may hold what a prefix names; with one stage, naming nothing is a mistake
            if not frozen and self.mc.pipeline_model_parallel_size == 1:
                raise ValueError(f"{self.role}.model_args.freeze_module_prefix {ma.freeze_module_prefix!r} matches no "
                                 "parameter of the megatron model (megatron-core names, e.g. embedding.word_embeddings, "
                                 "decoder.layers.0)")

    def _wrap_for_training(self) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        mc, ta, config = self.mc, self.config.training_args, self.model[0].config
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=mc.overlap_grad_reduce,
            use_distributed_optimizer=mc.use_distributed_optimizer, overlap_param_gather=mc.overlap_param_gather)
        self.model = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config, module=chunk,
                                              disable_bucketing=i > 0) for i, chunk in enumerate(self.model)]
        one = len(self.model) == 1
        if mc.overlap_grad_reduce:
            config.no_sync_func = self.model[0].no_sync if one else [m.no_sync for m in self.model]
            config.grad_sync_func = self.model[0].start_grad_sync if one else [m.start_grad_sync for m in self.model]
        if mc.overlap_param_gather:
            config.param_sync_func = self.model[0].start_param_sync if one else [m.start_param_sync for m in self.model]
        config.finalize_model_grads_func = finalize_model_grads
        opt_config = OptimizerConfig(
            optimizer="adam", lr=ta.learning_rate, min_lr=0.0, weight_decay=ta.weight_decay,
            adam_beta1=ta.adam_beta1, adam_beta2=ta.adam_beta2, adam_eps=ta.adam_epsilon,
            clip_grad=self.context.max_grad_norm, bf16=config.bf16, fp16=config.fp16, params_dtype=config.params_dtype,
            use_distributed_optimizer=mc.use_distributed_optimizer)
        self.optimizer = get_megatron_optimizer(opt_config, self.model)
        self.schedule = LRSchedule(ta.lr_scheduler_type, ta.learning_rate, self.context.train_calls, ta.warmup_steps,
                                   ta.warmup_ratio)

    # --- data layout
    @property
    def dp_size(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size()

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """(data-parallel rank, data-parallel size, whether this rank returns the results): ranks of
        one model replica get the same rows; one of them (TP 0, last stage, CP 0) answers."""
        from megatron.core import parallel_state as ps

        collects = (ps.get_tensor_model_parallel_rank() == 0 and ps.is_pipeline_last_stage(ignore_virtual=True)
                    and ps.get_context_parallel_rank() == 0)
        return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), collects

    def _micro_batches(self, batch: Batch, micro: int) -> tuple[list[tuple[Batch, dict]], int]:
        """Right-aligned micro-batches of one shared length (a multiple the parallel layout needs)."""
        mc = self.mc
        lengths = batch["attention_mask"].sum(-1)
        multiple = (mc.tensor_model_parallel_size if mc.sequence_parallel and mc.tensor_model_parallel_size > 1 else 1)
        multiple = multiple * (2 * mc.context_parallel_size if mc.context_parallel_size > 1 else 1)
        seq = round_up(max(int(lengths.max()), 2), multiple)
        short = -len(batch) % micro
        if short:  # pipeline schedules need equal micro-batches: fill with fully masked copies (no loss, dropped)
            filler = batch.select([len(batch) - 1] * short)
            filler.tensors.update({k: torch.zeros_like(v) for k, v in filler.tensors.items() if k.endswith("mask")})
            batch = Batch.concat([batch, filler])
        out = []
        for start in range(0, len(batch), micro):
            part = batch.select(range(start, min(len(batch), start + micro)))
            aligned, order = right_align(part["input_ids"], part["attention_mask"])
            ids = torch.nn.functional.pad(aligned, (0, max(0, seq - aligned.shape[1])))[:, :seq]
            labels = torch.nn.functional.pad(ids[:, 1:], (0, 1))
            dev = self.device
            out.append((part.to(dev), {"ids": ids.to(dev), "labels": labels.to(dev), "order": order.to(dev)}))
        return out, seq

    # --- forward
    def _forward_step(self, data_iterator: Any, model: Any, loss_fn: LossFn | None, counts: Any, scale: float,
                      field: str) -> tuple[torch.Tensor, Any]:
        from megatron.core import parallel_state as ps

        part, t = next(data_iterator)
        ids, labels = t["ids"], t["labels"]
        seq = ids.shape[1]
        cp = self.mc.context_parallel_size
        positions = cp_positions(seq, cp, ps.get_context_parallel_rank()).to(ids.device)
        pos_ids = positions.expand(ids.shape[0], -1)
        output = model(ids[:, positions], pos_ids, attention_mask=None)

        def loss_func(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict]:
            width = part["input_ids"].shape[1]
            cp_group = ps.get_context_parallel_group() if cp > 1 else None

            def to_rows(per_position: torch.Tensor) -> torch.Tensor:
                # position t-1's output judges token t: log p(x_t | x_<t) and V(x_<t) sit at t
                full = values_before_tokens(gather_positions(per_position, positions, seq, cp_group))
                full = torch.nn.functional.pad(full, (0, max(0, width - seq)))[:, :width]
                return restore(full, t["order"], part["attention_mask"])

            if self.is_critic:
                out = ForwardOutput(values=to_rows(output_tensor.squeeze(-1).float()))
            else:
                tp_rank, local = ps.get_tensor_model_parallel_rank(), output_tensor.shape[-1]
                group = ps.get_tensor_model_parallel_group()
                lp, _ = vocab_parallel_logprobs(output_tensor, labels[:, positions], tp_rank * local,
                                                self.layout.vocab_size, group)

                def entropy() -> torch.Tensor:
                    _, ent = vocab_parallel_logprobs(output_tensor, labels[:, positions], tp_rank * local,
                                                     self.layout.vocab_size, group, with_entropy=True)
                    return to_rows(ent)

                out = ForwardOutput(logprobs=to_rows(lp), entropy_fn=entropy)
            if loss_fn is None:  # forward only: hand the per-row result back through the schedule
                result = getattr(out, field).detach()
                return torch.zeros((), device=result.device), {"result": result}
            loss, metrics = loss_fn(part, out, counts)
            return loss * scale, {k: float(v) for k, v in metrics.items()}

        return output, loss_func

    def _run(self, micros: list, seq: int, loss_fn: LossFn | None, counts: Any, field: str = "logprobs") -> list:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        scale = float(len(micros) * self.dp_size)
        step = partial(self._forward_step, loss_fn=loss_fn, counts=counts, scale=scale, field=field)
        iterators = [iter(micros) for _ in self.model] if len(self.model) > 1 else iter(micros)
        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=iterators, model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=len(micros), seq_length=seq,  # the schedule divides by CP (and TP with SP)
            micro_batch_size=micros[0][1]["ids"].shape[0], forward_only=loss_fn is None)

    @torch.no_grad()
    def _forward_only(self, batch: Batch, field: str) -> torch.Tensor:
        for m in self.model:
            m.eval()
        micros, seq = self._micro_batches(batch, self.config.infer_batch_size)
        results = self._run(micros, seq, None, None, field)
        if not results:  # not the last pipeline stage: the collecting rank answers
            return torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
        return torch.cat([r["result"].float().cpu() for r in results])[: len(batch)]

    def compute_log_probs(self, batch: Batch, adapters: bool = True) -> torch.Tensor:
        """Log-probs of the current policy; ``adapters=False``: of the base model under a LoRA adapter (the
        reference policy of a LoRA run, with no second copy of the weights)."""
        if self.is_critic:
            raise RuntimeError("the critic has no log-probs")
        if adapters or not self.lora_targets:
            return self._forward_only(batch, "logprobs")
        for chunk in self._local_chunks():
            set_adapters(chunk, False)
        try:
            return self._forward_only(batch, "logprobs")
        finally:
            for chunk in self._local_chunks():
                set_adapters(chunk, True)

    def compute_values(self, batch: Batch) -> torch.Tensor:
        if not self.is_critic:
            raise RuntimeError(f"{self.role} has no value head; values come from the critic")
        return self._forward_only(batch, "values")

    # --- training
    def train_step(self, batch: Batch, loss_fn: LossFn, epochs: int = 1) -> dict[str, float]:
        if not self.trains:
            raise RuntimeError(f"{self.name} does not train; use megatron_train")
        from megatron.core import parallel_state as ps

        micro = self.config.training_args.per_device_train_batch_size
        stats = StepStats()
        mask_key = loss_mask_key(batch)
        for m in self.model:
            m.train()
        assert self.schedule is not None
        minis = mini_batches(batch, self.config.training_args, epochs)
        self.schedule.plan(len(minis))
        for mini_batch in minis:
            counts = global_counts(mini_batch[mask_key], self.device, ps.get_data_parallel_group(), self.dp_size)
            for m in self.model:
                m.zero_grad_buffer()
            self.optimizer.zero_grad()
            micros, seq = self._micro_batches(mini_batch, micro)
            for metrics in self._run(micros, seq, loss_fn, counts):
                stats.add_micro(metrics)
            lr = self.schedule.lr()
            set_lr(self.optimizer, lr)
            ok, grad_norm, _ = self.optimizer.step()
            self.schedule.step_taken()
            stats.add_step(float(grad_norm) if ok and grad_norm is not None else None, lr)
        self.schedule.call_done()
        many, group = self.dp_size > 1, ps.get_data_parallel_group()
        return stats.summary("critic" if self.is_critic else "actor", dp_sum(self.device, group) if many else None,
                             dp_sum(self.device, group, op="max") if many else None)

    # --- weights
    def _local_chunks(self) -> list[Any]:
        return [getattr(m, "module", m) for m in self.model]

    def _hf_weights_of_this_stage(self, adapters: bool = False) -> dict[str, torch.Tensor]:
        """This pipeline stage's weights, whole (tensor / expert shards gathered), in HF names; under LoRA with
        the adapter merged in, or (``adapters``) the adapter's tensors alone in HF peft names. Collective over the
        tensor and expert groups."""
        if adapters:
            return self._hf_adapter_of_this_stage()
        from megatron.core import parallel_state as ps

        if self.trains and self.mc.overlap_param_gather:  # the last step's parameter all-gather may be pending
            for m in self.model:
                m.start_param_sync(force_sync=True)
        tp_group, ep_group = ps.get_tensor_model_parallel_group(), ps.get_expert_model_parallel_group()
        parts = []
        for v, chunk in enumerate(self._local_chunks()):
            state = merged_local_state(chunk) if self.lora_targets else chunk.state_dict()
            local = {k: t.detach() for k, t in state.items()
                     if torch.is_tensor(t) and not k.endswith("_extra_state") and "value_head" not in k}
            # tensor shards (expert tensor ranks follow tensor ranks; merge() drops their duplicates)
            gathered = _all_gather_dicts(local, tp_group)
            positions = _all_gather_objects(self.rank_position(v), tp_group)
            if self.mc.expert_model_parallel_size > 1:  # expert weights also differ across the expert group
                gathered = [g for d in gathered for g in _all_gather_dicts(d, ep_group)]
                positions = [p for q in positions for p in _all_gather_objects(q, ep_group)]
            parts += list(zip(positions, gathered))
        # a snapshot, never views of live parameters (on CPU .cpu() would alias them)
        full = merge([(p, {k: t.to("cpu", copy=True) for k, t in d.items()}) for p, d in parts], self.layout)
        return megatron_to_hf(full, self.layout)

    def _hf_adapter_of_this_stage(self) -> dict[str, torch.Tensor]:
        """This stage's LoRA tensors, whole, in HF peft names (a fused layer's A for each of its HF layers, its
        B split by rows). Collective over the tensor group."""
        from megatron.core import parallel_state as ps

        tp_group = ps.get_tensor_model_parallel_group()
        a_parts, b_parts = [], []
        for v, chunk in enumerate(self._local_chunks()):
            a, b = local_adapter_tensors(chunk)
            positions = _all_gather_objects(self.rank_position(v), tp_group)
            for pos, a_r, b_r in zip(positions, _all_gather_dicts(a, tp_group), _all_gather_dicts(b, tp_group)):
                whole_a, whole_b = split_halves(a_r, b_r, pos.tp_rank)
                a_parts.append((pos, {k: t.to("cpu", copy=True) for k, t in whole_a.items()}))
                b_parts.append((pos, {k: t.to("cpu", copy=True) for k, t in whole_b.items()}))
        return lora_to_hf(merge(a_parts, self.layout), merge(b_parts, self.layout), self.layout)

    def adapter_config(self) -> dict[str, Any] | None:
        """The HF-side peft config of the LoRA adapter (JSON-able), or None without LoRA."""
        if not self.lora_targets:
            return None
        return hf_lora_config(self.config.model_args, self.lora_targets, self.model_path)

    def weight_sizes(self, adapters: bool = False) -> list[tuple[str, int]]:
        """(HF name, bytes) of every synced tensor, from the HF config alone (no collective: only
        rank 0 asks)."""
        if adapters not in self._sizes:
            from transformers import AutoModelForCausalLM

            dtype = self._local_chunks()[0].config.params_dtype
            with torch.device("meta"):
                meta = AutoModelForCausalLM.from_config(self.hf_config, dtype=dtype)
            if adapters:
                self._sizes[adapters] = hf_adapter_sizes(meta, self.adapter_config())
            else:
                names = unfuse_experts(dict(meta.state_dict()))
                if self.layout.tied_embeddings:
                    names.pop("lm_head.weight", None)
                self._sizes[adapters] = [(n, t.numel() * t.element_size()) for n, t in names.items()
                                         if "rotary_emb" not in n]
        return self._sizes[adapters]

    def weight_buckets(self, bucket_bytes: int = 256 << 20, adapters: bool = False) -> Iterator[NamedTensors]:
        """HF-named buckets, in pipeline-stage order, arriving on global rank 0 (every rank must walk
        them: the gathers and sends are collective). ``adapters``: the LoRA adapter's tensors only."""
        from megatron.core import parallel_state as ps

        mine = self._hf_weights_of_this_stage(adapters)
        if ps.get_tensor_model_parallel_rank() != 0 or ps.get_data_parallel_rank(with_context_parallel=True) != 0:
            return  # only the pipeline group of global rank 0 moves the weights on
        pp_group = ps.get_pipeline_model_parallel_group()
        pp, pp_rank = self.mc.pipeline_model_parallel_size, ps.get_pipeline_model_parallel_rank()
        first = torch.distributed.get_rank() == 0
        bucket: NamedTensors = []
        size = 0
        for stage in range(pp):
            names = _broadcast_object(sorted(mine) if pp_rank == stage else None, stage, pp_group)
            for name in names:
                tensor = mine.get(name) if pp_rank == stage else None
                if pp > 1:
                    tensor = _send_to_first_stage(tensor, stage, pp_rank, pp_group, self.device)
                if not first or tensor is None:
                    continue
                if bucket and size + tensor.numel() * tensor.element_size() > bucket_bytes:
                    yield bucket
                    bucket, size = [], 0
                bucket.append((name, tensor))
                size += tensor.numel() * tensor.element_size()
        if bucket:
            yield bucket

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for bucket in self.weight_buckets() for n, t in bucket}

    def export_hf(self, path: str) -> None:
        """Write the current weights as an HF checkpoint (safetensors, config, tokenizer) on rank 0."""
        from safetensors.torch import save_file
        from transformers import AutoTokenizer

        weights = self.state_dict()
        if torch.distributed.get_rank() != 0:
            return
        os.makedirs(path, exist_ok=True)
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(path, "model.safetensors"))
        self.hf_config.save_pretrained(path)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(path)

    # --- checkpoints (one file per rank; the distributed optimizer's state per model-parallel rank)
    def save_checkpoint(self, path: str) -> None:
        rank = torch.distributed.get_rank()
        folder = os.path.join(path, self.role)
        os.makedirs(folder, exist_ok=True)
        if self.lora_targets:  # the adapter as peft saves it, loadable from outside (PeftModel.from_pretrained)
            tensors = {n: t for bucket in self.weight_buckets(adapters=True) for n, t in bucket}
            if rank == 0:
                save_hf_adapter(os.path.join(path, "adapter"), tensors, self.adapter_config())
        state = {
            # LoRA / freezing: the trained tensors only (the frozen ones come from the model path)
            "model": [self._trained_state(c) for c in self._local_chunks()],
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None},
        }
        torch.save(state, os.path.join(folder, f"rank_{rank:05d}.pt"))
        if self.optimizer is not None and self.mc.use_distributed_optimizer:
            for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                opt.save_parameter_state(os.path.join(folder, f"optim_params_{self._mp_id()}.pt"))
        torch.distributed.barrier()

    def load_checkpoint(self, path: str) -> None:
        rank = torch.distributed.get_rank()
        file = os.path.join(path, self.role, f"rank_{rank:05d}.pt")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no {self.role} checkpoint for rank {rank} in {path}")
        state = torch.load(file, map_location="cpu", weights_only=False)
        for chunk, sd in zip(self._local_chunks(), state["model"]):
            result = chunk.load_state_dict(sd, strict=not self.partial)
            trained = self._trained_state(chunk).keys()
            missing = [k for k in result.missing_keys if k in trained]
            if missing or result.unexpected_keys:
                raise RuntimeError(f"{self.role} checkpoint {file} does not fit the model (missing {missing[:5]}, "
                                   f"unexpected {result.unexpected_keys[:5]})")
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.mc.use_distributed_optimizer:
                for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                    opt.load_parameter_state(os.path.join(path, self.role, f"optim_params_{self._mp_id()}.pt"))
        if self.schedule is not None:
            self.schedule.load_state_dict(state["lr_schedule"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])

    def _trained_state(self, chunk: Any) -> dict[str, Any]:
        state = chunk.state_dict()
        if not self.partial:
            return state
        trained = {n for n, p in chunk.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in trained}

    def _mp_id(self) -> str:
        r = self.rank_position()
        return f"tp{r.tp_rank}_pp{r.pp_rank}_ep{r.ep_rank}"

    # --- memory
    def offload(self) -> None:
        """megatron_infer moves its model to CPU. megatron_train keeps its state on the GPU: its
        parameters are views into DDP's contiguous buffers, which a plain ``.to("cpu")`` would
        detach from the optimizer; only the allocator cache is returned."""
        if not self.trains:
            for chunk in self._local_chunks():
                chunk.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reload(self) -> None:
        if not self.trains:
            for chunk in self._local_chunks():
                chunk.to(self.device)


class MegatronInferStrategy(MegatronTrainStrategy):
    """megatron_infer: the same model for log-probs only (reference), no optimizer."""

    trains = False


def _all_gather_objects(obj: Any, group: Any) -> list[Any]:
    world = torch.distributed.get_world_size(group)
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def _all_gather_dicts(local: dict[str, torch.Tensor], group: Any) -> list[dict[str, torch.Tensor]]:
    """Every rank's tensors of the same names (shapes may differ per rank only for padded splits)."""
    world = torch.distributed.get_world_size(group)
    if world == 1:
        return [local]
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(world)]
    for name in sorted(local):
        t = local[name].contiguous()
        parts = [torch.empty_like(t) for _ in range(world)]
        torch.distributed.all_gather(parts, t, group=group)
        for r, p in enumerate(parts):
            out[r][name] = p
    return out


def _broadcast_object(obj: Any, src_local: int, group: Any) -> Any:
    if torch.distributed.get_world_size(group) == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(group, src_local), group=group)
    return box[0]


def _send_to_first_stage(tensor: torch.Tensor | None, stage: int, pp_rank: int, group: Any, device: torch.device) -> Any:
    """Move one HF tensor of pipeline stage ``stage`` to stage 0 (where global rank 0 lives)."""
    if stage == 0:
        return tensor if pp_rank == 0 else None
    meta = _broadcast_object((tuple(tensor.shape), tensor.dtype) if pp_rank == stage else None, stage, group)
    if pp_rank == stage:
        torch.distributed.send(tensor.to(device), torch.distributed.get_global_rank(group, 0), group=group)
        return None
    if pp_rank == 0:
        buf = torch.empty(meta[0], dtype=meta[1], device=device)
        torch.distributed.recv(buf, torch.distributed.get_global_rank(group, stage), group=group)
        return buf.cpu()
    return None
