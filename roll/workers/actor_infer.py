"""actor_infer: generation for rollouts, weight updates from actor_train."""

from __future__ import annotations

from typing import Any

from roll.distributed.batch import Batch, numpy_to_tensor
from roll.distributed.weight_transport import SharedWeightsReceiver
from roll.strategies.base import Generation, SamplingParams
from roll.workers.base import RoleWorker


class ActorInferWorker(RoleWorker):
    _receiver: SharedWeightsReceiver | None = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.strategy.generate(prompts, params)

    def update_weights(self, bucket: Any) -> None:
        import ray
        if isinstance(bucket, ray.ObjectRef):  # refs nested in a list are not resolved by Ray
            bucket = ray.get(bucket)
        tensors = [(name, numpy_to_tensor(array, tag)) for name, (array, tag) in bucket]
        self.strategy.load_weights(tensors)

    def load_shared_weights(self, buffer_name: str, slots: list) -> None:
        if self._receiver is None:
            self._receiver = SharedWeightsReceiver()
        self.strategy.load_weights(self._receiver.views(buffer_name, slots))

    def accepts_adapters(self) -> bool:
        """Whether this engine applies a LoRA adapter itself (then a sync sends the adapter's tensors only)."""
        return bool(getattr(self.strategy, "accepts_adapters", False))

    def configure_adapter(self, config: dict) -> None:
        self.strategy.configure_adapter(config)

    def finish_weight_sync(self) -> None:
        self.strategy.finish_weight_sync()

    def compute_log_probs(self, batch: Batch) -> Batch:
        return Batch({"infer_logprobs": self.strategy.compute_log_probs(batch)})

    def state_dict(self) -> dict:
        return self.strategy.state_dict()
