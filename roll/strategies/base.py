"""The two strategy interfaces every backend implements."""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from roll.distributed.batch import Batch

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy needs to know beyond its role's worker config."""

    role: str = "actor_train"
    rank: int = 0
    world_size: int = 1
    seed: int = 42
    max_grad_norm: float = 1.0
    train_calls: int = 1000  # train_step calls the run makes on this role (the LR schedule spans them)
    colocated: bool = False  # shares devices with another role (GPU engines then free memory between phases)
    max_sequence_length: int | None = None  # prompt + response tokens (engines size their KV cache by it)
    lora_rank: int | None = None  # the trainer's LoRA rank in a LoRA run (engines that apply adapters size slots by it)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None  # fixes the sampling RNG of this call (reproducible rollouts)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @staticmethod
    def from_generating_args(args: Any, **overrides: Any) -> SamplingParams:
        greedy = (not args.do_sample) or args.temperature <= 0
        values = dict(
            max_new_tokens=args.max_new_tokens or 128,
            temperature=0.0 if greedy else args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            repetition_penalty=args.repetition_penalty,
            stop_strings=tuple(args.stop_strings or ()),
        )
        values.update(overrides)
        return SamplingParams(**values)


@dataclass
class Generation:
    """One request's result: the sampled tokens exactly as produced, and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS / stop string) or "length"
    version: int = 0  # the policy version (weight sync) that sampled it; set by the generation server


@dataclass
class ForwardOutput:
    """What a training forward gives the loss function."""

    logits: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    _entropy: torch.Tensor | None = field(default=None, repr=False)
    entropy_fn: Callable[[], torch.Tensor] | None = field(default=None, repr=False)  # when logits are sharded

    def entropy(self) -> torch.Tensor:
        from roll.models.logprobs import shifted_entropy

        if self._entropy is None:
            if self.entropy_fn is not None:
                self._entropy = self.entropy_fn()
            else:
                assert self.logits is not None, "entropy needs logits"
                self._entropy = shifted_entropy(self.logits)
        return self._entropy


def mini_batches(batch: Batch, training_args: Any, epochs: int) -> list[Batch]:
    """``epochs`` passes over ``batch`` in mini-batches of per_device x grad_accum rows (one optimizer
    step each; the last may be smaller). Every data-parallel rank holds as many rows (the dispatch pads
    with zero-weight rows), so every rank runs as many steps and micro-batches."""
    mini = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    return [batch.select(range(start, min(len(batch), start + mini)))
            for _ in range(epochs) for start in range(0, len(batch), mini)]


def loss_mask_key(batch: Batch) -> str:
    """The mask the loss counts tokens with: the response tokens when the batch has them."""
    return "response_mask" if "response_mask" in batch else "attention_mask"


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class StepStats:
    """What a train_step reports. Loss metrics arrive per micro-batch as parts of their mini-batch's
    global value (normalised by global counts), so they are summed per optimizer step, averaged over
    steps and summed over data-parallel ranks (``reduce``): each equals the metric of the whole global
    batch, however it was cut. Metrics named ``*_max`` are maxima instead: the largest over micro-batches,
    steps and ranks. Grad norm: averaged over the steps that reported one; lr: the one the last step used."""

    sums: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)

    def add_micro(self, metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            if k.endswith("_max"):
                self.maxima[k] = max(self.maxima.get(k, float("-inf")), float(v))
            else:
                self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def add_step(self, grad_norm: float | None, lr: float) -> None:
        self.grad_norms.append(float(grad_norm) if grad_norm is not None else float("nan"))
        self.lrs.append(float(lr))

    def summary(self, prefix: str, reduce: Callable[[list[float]], list[float]] | None = None,
                reduce_max: Callable[[list[float]], list[float]] | None = None) -> dict[str, float]:
        steps = max(len(self.grad_norms), 1)
        keys = sorted(self.sums)
        values = [self.sums[k] / steps for k in keys]
        if reduce is not None and keys:
            values = reduce(values)
        out = dict(zip(keys, values))
        top = sorted(self.maxima)
        maxima = [self.maxima[k] for k in top]
        if reduce_max is not None and top:
            maxima = reduce_max(maxima)
        out.update(zip(top, maxima))
        reported = [n for n in self.grad_norms if not math.isnan(n)]
        out[f"{prefix}/grad_norm"] = sum(reported) / len(reported) if reported else (float("nan") if self.grad_norms else 0.0)
        out[f"{prefix}/lr"] = self.lrs[-1] if self.lrs else 0.0
        out[f"{prefix}/optimizer_steps"] = float(len(self.grad_norms))
        return out


def dp_sum(device: torch.device, group: Any = None, op: str = "sum") -> Callable[[list[float]], list[float]]:
    """Sum (or, with ``op="max"``, take the maximum of) a list of floats over the data-parallel ranks of ``group``."""

    def reduce(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM,
                                     group=group)
        return t.tolist()

    return reduce


def global_counts(mask: torch.Tensor, device: torch.device, group: Any = None, world_size: int = 1) -> Any:
    """Token and sequence counts of ``mask`` summed over the data-parallel ranks (``group``), which
    the losses normalise by, so micro-batch losses add up to the global-batch loss."""
    from roll.algorithms.losses import GlobalCounts

    # on the training device: NCCL reduces CUDA tensors only
    local = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64, device=device)
    if world_size > 1:
        torch.distributed.all_reduce(local, group=group)
    return GlobalCounts(tokens=float(local[0]), seqs=float(local[1]))


# loss_fn(micro_batch, forward_output, counts) -> (loss, metrics); the loss and every metric are this
# micro-batch's part of the global-batch value (normalised by ``counts``), so parts add up.
LossFn = Callable[[Batch, ForwardOutput, Any], tuple[torch.Tensor, dict[str, float]]]


class InferenceStrategy(abc.ABC):
    @abc.abstractmethod
    def initialize(self) -> None: ...

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]: ...

    @abc.abstractmethod
    def compute_log_probs(self, batch: Batch) -> torch.Tensor: ...

    @abc.abstractmethod
    def load_weights(self, named_tensors: NamedTensors) -> None: ...

    def finish_weight_sync(self) -> None:
        """Called once after a sync's last bucket (engines that load a synced LoRA adapter as a whole do it here)."""
        return None  # most engines apply each bucket as it arrives

    @abc.abstractmethod
    def offload(self) -> None: ...

    @abc.abstractmethod
    def reload(self) -> None: ...


class TrainStrategy(abc.ABC):
    @abc.abstractmethod
    def initialize(self) -> None: ...

    @abc.abstractmethod
    def compute_log_probs(self, batch: Batch) -> torch.Tensor: ...

    @abc.abstractmethod
    def compute_values(self, batch: Batch) -> torch.Tensor: ...

    @abc.abstractmethod
    def train_step(self, batch: Batch, loss_fn: LossFn, epochs: int = 1) -> dict[str, float]: ...

    @abc.abstractmethod
    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]: ...

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None: ...

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None: ...

    @abc.abstractmethod
    def offload(self) -> None: ...

    @abc.abstractmethod
    def reload(self) -> None: ...
