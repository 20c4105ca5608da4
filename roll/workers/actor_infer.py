"""actor_infer: generation for rollouts, weight updates from actor_train."""

from __future__ import annotations

from typing import Any

from roll.distributed.batch import Batch
from roll.strategies.base import Generation, SamplingParams
from roll.workers.base import RoleWorker


class ActorInferWorker(RoleWorker):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.strategy.generate(prompts, params)

    def update_weights(self, bucket: Any) -> None:
        import ray

        if isinstance(bucket, ray.ObjectRef):  # refs nested in a list are not resolved by Ray
            bucket = ray.get(bucket)
        self.strategy.load_weights(bucket)

    def compute_log_probs(self, batch: Batch) -> Batch:
        return Batch({"infer_logprobs": self.strategy.compute_log_probs(batch)})

    def state_dict(self) -> dict:
        return self.strategy.state_dict()
