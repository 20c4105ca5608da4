"""reference: log-probs of the frozen reference policy (KL terms)."""

from __future__ import annotations

from roll.distributed.batch import Batch
from roll.workers.base import RoleWorker


class ReferenceWorker(RoleWorker):
    def compute_log_probs(self, batch: Batch) -> Batch:
        return Batch({"ref_logprobs": self.strategy.compute_log_probs(batch)})
