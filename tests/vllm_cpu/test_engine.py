"""The vllm strategy's plumbing on the real engine (vLLM's CPU build): row order, per-row seeds, log-prob
positions of a padded batch against a plain HF forward (fp32), and a weight bucket reaching the model."""

import torch

from roll.distributed.batch import Batch
from roll.strategies.base import SamplingParams, StrategyContext
from roll.strategies.vllm import VLLMStrategy
from tests.strategies.helpers import worker_config


def test_rows_seeds_and_log_prob_positions_on_the_real_engine(tiny_model_path):
    import dataclasses

    from transformers import AutoModelForCausalLM

    cfg = worker_config(tiny_model_path, "vllm")
    cfg = dataclasses.replace(cfg, model_args=dataclasses.replace(cfg.model_args, dtype="fp32"), strategy_args=dataclasses.replace(
        cfg.strategy_args, strategy_config={"max_model_len": 256, "enforce_eager": True,
                                            "kv_cache_memory_bytes": 268435456}))
    s = VLLMStrategy(cfg, StrategyContext(role="actor_infer"))
    s.initialize()
    try:
        a, b = list(range(20, 40)), list(range(60, 75))
        out = s.generate([a, b, a], SamplingParams(max_new_tokens=6, temperature=1.0, seed=5))
        again = s.generate([a], SamplingParams(max_new_tokens=6, temperature=1.0, seed=5))
        assert out[0].token_ids == again[0].token_ids  # row 0 keeps seed 5, whatever else is in the call
        assert out[0].token_ids != out[2].token_ids  # the same prompt in another row gets its own seed
        ids = torch.tensor([a[:12] + [0, 0], [0] * 4 + b[:10]])
        mask = torch.tensor([[1] * 12 + [0, 0], [0] * 4 + [1] * 10])
        lp = s.compute_log_probs(Batch({"input_ids": ids, "attention_mask": mask}))
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
        for row, seq, start in ((0, a[:12], 0), (1, b[:10], 4)):
            with torch.no_grad():
                ref = torch.log_softmax(model(torch.tensor([seq])).logits[0, :-1], -1).gather(
                    -1, torch.tensor(seq[1:])[:, None]).squeeze(-1)
            got = lp[row, start + 1:start + len(seq)]
            assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()
            assert lp[row, start] == 0 and (lp[row][~mask[row].bool()] == 0).all()
    finally:
        s.shutdown()
