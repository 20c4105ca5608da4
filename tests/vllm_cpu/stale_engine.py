"""A vllm strategy whose syncs never reach the engine's kernels (the sync's tensors are dropped before the reload),
for the test that shows the pipeline's sync check stops such a run."""

from roll.strategies.vllm import VLLMStrategy


class StaleVLLMStrategy(VLLMStrategy):
    def finish_weight_sync(self) -> None:
        self.pending = []  # the reload that would re-pack the new weights is skipped
        super().finish_weight_sync()
