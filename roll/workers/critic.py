"""critic: values for GAE and value-function updates."""

from __future__ import annotations

from roll.algorithms.losses import value_loss
from roll.distributed.batch import Batch
from roll.workers.base import RoleWorker


class CriticWorker(RoleWorker):
    def compute_values(self, batch: Batch) -> Batch:
        return Batch({"values": self.strategy.compute_values(batch)})

    def train_step(self, batch: Batch, value_clip: float | None = None, agg_mode: str = "token-mean",
                   epochs: int = 1, norm_length: float | None = None) -> dict[str, float]:
        def loss_fn(micro, out, counts):
            return value_loss(out.values, micro["values"], micro["returns"], micro["response_mask"].float(),
                              clip=value_clip, agg_mode=agg_mode, counts=counts, norm_length=norm_length)

        return self.strategy.train_step(batch, loss_fn, epochs)

    def save_checkpoint(self, path: str) -> None:
        self.strategy.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.strategy.load_checkpoint(path)
