"""actor_train: old log-probs, policy updates, weight sync to actor_infer, checkpoints."""

from __future__ import annotations

import time
from typing import Any

import torch

from roll.algorithms.losses import ActorLossConfig, actor_loss
from roll.algorithms.train_infer import Correction, train_infer_correction
from roll.distributed.batch import Batch, tensor_to_numpy
from roll.distributed.weight_transport import SharedWeightsSender
from roll.workers.base import RoleWorker


def make_actor_loss_fn(cfg: ActorLossConfig):
    """loss_fn(micro_batch, forward_output, counts) for the actor from batch fields."""

    def loss_fn(micro: Batch, out: Any, counts: Any):
        mask = micro["response_mask"].float()
        needs_scores = cfg.sft_loss_coef or cfg.pg_variant == "topr"
        positive = micro["scores"] > 0 if needs_scores and "scores" in micro else None
        entropy = out.entropy() if cfg.entropy_loss_coef else None
        weight = micro.tensors.get("train_infer_is_weight")
        extra: dict[str, float] = {}
        if "old_logprobs" in micro:
            old = micro["old_logprobs"]  # the pipeline applied any train/infer correction to the batch
        else:
            # This forward is the first on these weights: its own log-probs are the old ones (the pipeline
            # leaves them out only when that is exact), and the train/infer gap is measured here.
            old = out.logprobs.detach()
            if "infer_logprobs" in micro:
                weight, keep, extra = train_infer_correction(cfg.correction or Correction(), mask, old,
                                                             micro["infer_logprobs"].to(old.device), counts)
                mask = mask * keep
        loss, metrics = actor_loss(out.logprobs, old, micro["advantages"], mask, cfg,
                                   ref_logprob=micro.tensors.get("ref_logprobs"), entropy=entropy, positive_rows=positive,
                                   counts=counts, weight=weight)
        return loss, {**metrics, **extra}

    return loss_fn


class ActorTrainWorker(RoleWorker):
    _sender: SharedWeightsSender | None = None

    def compute_log_probs(self, batch: Batch) -> Batch:
        return Batch({"old_logprobs": self.strategy.compute_log_probs(batch)})

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """The reference policy of a LoRA run: this model with its adapter off (the base weights)."""
        return Batch({"ref_logprobs": self.strategy.compute_log_probs(batch, adapters=False)})

    def train_step(self, batch: Batch, loss_cfg: ActorLossConfig, epochs: int = 1) -> dict[str, float]:
        return self.strategy.train_step(batch, make_actor_loss_fn(loss_cfg), epochs)

    def sync_weights(self, infer_workers: list[Any], bucket_bytes: int = 256 << 20, transport: str = "auto") -> dict[str, float]:
        """Send the weights bucket by bucket to every inference worker. Every training rank walks the
        buckets (ZeRO-3 gathers collectively); rank 0 sends: through a reused shared-memory buffer to
        workers on its node, through Ray's object store to the others (``transport="object_store"``
        forces the latter). No copy passes through the driver."""
        import ray

        start = time.perf_counter()
        sent = 0
        local, remote = [], []
        adapter = self.strategy.adapter_config() if hasattr(self.strategy, "adapter_config") else None
        # engines that apply adapters get the adapter's tensors only; the others get merged weights
        adapters = adapter is not None and all(ray.get([w.accepts_adapters.remote() for w in infer_workers]))
        if adapters and self.rank == 0:
            ray.get([w.configure_adapter.remote(adapter) for w in infer_workers])
        if self.rank == 0:
            here = ray.get_runtime_context().get_node_id()
            nodes = ray.get([w.node_id.remote() for w in infer_workers])
            same_node = transport in ("auto", "shared_memory")
            local = [w for w, n in zip(infer_workers, nodes) if n == here and same_node]
            remote = [w for w, n in zip(infer_workers, nodes) if w not in local]
            if local:
                if self._sender is None:
                    self._sender = SharedWeightsSender()
                buffer = self._sender.prepare(self.strategy.weight_sizes(adapters))
        for bucket in self.strategy.weight_buckets(bucket_bytes, adapters):
            if self.rank != 0:
                continue
            calls = []
            if local:
                slots = self._sender.write(bucket)
                calls += [w.load_shared_weights.remote(buffer, slots) for w in local]
            if remote:
                ref = ray.put([(name, tensor_to_numpy(t)) for name, t in bucket])
                calls += [w.update_weights.remote(ref) for w in remote]
            ray.get(calls)
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
        if self.rank == 0:
            ray.get([w.finish_weight_sync.remote() for w in infer_workers])
        return {"time/weight_sync_s": time.perf_counter() - start, "weight_sync/bytes": float(sent),
                "weight_sync/adapter_only": float(adapters),
                # engines fed through the object store: on other nodes (or forced by transport="object_store")
                "weight_sync/object_store_workers": float(len(remote))}

    def release(self) -> None:
        if self._sender is not None:
            self._sender.close()  # unlinks the weight-sync buffer in /dev/shm
            self._sender = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.strategy.state_dict()

    def save_checkpoint(self, path: str) -> None:
        self.strategy.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.strategy.load_checkpoint(path)

