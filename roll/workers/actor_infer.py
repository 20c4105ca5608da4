"""actor_infer: generation for rollouts, weight updates from actor_train."""

from __future__ import annotations

import warnings
from typing import Any

from roll.distributed.batch import Batch
from roll.distributed.weight_transport import SharedWeightsReceiver
from roll.strategies.base import Generation, SamplingParams
from roll.workers.base import RoleWorker


class ActorInferWorker(RoleWorker):
    _receiver: SharedWeightsReceiver | None = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.strategy.generate(prompts, params)

    def update_weights(self, bucket: Any) -> None:
        import ray
        import torch

        if isinstance(bucket, ray.ObjectRef):  # refs nested in a list are not resolved by Ray
            bucket = ray.get(bucket)
        tensors = []
        for name, (array, tag) in bucket:  # read-only views of the object store: copied once, into the params
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only view: it is only read from
                t = torch.from_numpy(array)
            tensors.append((name, t.view(torch.bfloat16) if tag == "bfloat16" else t))
        self.strategy.load_weights(tensors)

    def load_shared_weights(self, buffer_name: str, slots: list) -> None:
        if self._receiver is None:
            self._receiver = SharedWeightsReceiver()
        self.strategy.load_weights(self._receiver.views(buffer_name, slots))

    def compute_log_probs(self, batch: Batch) -> Batch:
        return Batch({"infer_logprobs": self.strategy.compute_log_probs(batch)})

    def state_dict(self) -> dict:
        return self.strategy.state_dict()
