"""Methods mixed into every vLLM GPU worker (``worker_extension_cls``), called through
``collective_rpc``. Imported inside vLLM's worker processes only; it imports no vLLM itself."""

from __future__ import annotations

import torch


class RollWorkerExtension:
    model_runner: object  # set by vLLM's worker

    def roll_load_weights(self, named_tensors: list) -> int:
        """Load HF-named full tensors through the model's own ``load_weights`` (which stacks
        q/k/v and gate/up and takes this rank's tensor-parallel shard)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((str(name), tensor.to(device, non_blocking=True)) for name, tensor in named_tensors))
        torch.cuda.synchronize(device)
        return len(named_tensors)
