"""hf_infer's batched prefill: rows with different cached and new lengths, encoded in one forward, get the KV and
logits each gets alone; rows are grouped by new length; a shared opening not yet cached is encoded once."""

import pytest
import torch

from roll.strategies.base import SamplingParams
from roll.strategies.hf_engine import GenerationEngine
from roll.strategies.hf_infer import HFInferStrategy
from roll.strategies.hf_prefill import plan_groups, prefill_rows

from .helpers import assert_greedy_matches_a_plain_forward, worker_config


@pytest.fixture(scope="module", params=[None, 2], ids=["mha", "gqa"])
def model(request, tmp_path_factory):
    from roll.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny_prefill"), num_heads=4, num_kv_heads=request.param)
    s = HFInferStrategy(worker_config(str(path), "hf_infer"))
    s.initialize()
    return s.model, s.eos_ids


def encode(model, tokens: list[int]):
    """The KV of ``tokens`` from one plain forward (a row's cached prefix as the prefix cache holds it)."""
    from transformers import DynamicCache

    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), past_key_values=DynamicCache(), use_cache=True)
    return [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def test_rows_of_different_cached_and_new_lengths_get_what_each_gets_alone(model):
    model, _ = model
    g = torch.Generator().manual_seed(0)
    # (cached tokens, new tokens): a long and a short cached prefix, none cached with few new tokens (its padding
    # queries see nothing at all: they must not turn into NaN that reaches a real row), one new token
    shapes = [(9, 4), (3, 7), (0, 2), (0, 7), (12, 1)]
    rows, prompts = [], []
    for cached, new in shapes:
        prompt = torch.randint(3, 500, (cached + new,), generator=g)
        prompts.append(prompt)
        rows.append((encode(model, prompt[:cached].tolist()) if cached else None, prompt[cached:]))
    with torch.no_grad():
        kvs, logits = prefill_rows(model, rows)
        assert logits.shape[0] == len(rows) and torch.isfinite(logits).all()
        for i, prompt in enumerate(prompts):
            alone_kvs, alone_logits = prefill_rows(model, [rows[i]])
            plain = model(input_ids=prompt[None]).logits[0, -1]
            torch.testing.assert_close(logits[i], plain, atol=1e-5, rtol=0)
            torch.testing.assert_close(logits[i], alone_logits[0], atol=1e-5, rtol=0)
            for (k, v), (k1, v1), (k2, v2) in zip(kvs[i], alone_kvs[0], encode(model, prompt.tolist())):
                assert k.shape == k2.shape == (1, k2.shape[1], len(prompt), k2.shape[3])
                torch.testing.assert_close(k, k1, atol=1e-5, rtol=0)
                torch.testing.assert_close(v, v1, atol=1e-5, rtol=0)
                torch.testing.assert_close(k, k2, atol=1e-5, rtol=0)
                torch.testing.assert_close(v, v2, atol=1e-5, rtol=0)


def test_plan_groups_by_hand():
    # sorted 2, 3, 3, 10, 11: {2, 3, 3} pads 1 + 0 + 0 = 1 token of 8 (12.5%); adding 10 would pad 8 + 7 + 7
    assert plan_groups([10, 3, 2, 11, 3]) == [[2, 1, 4], [0, 3]]
    assert plan_groups([]) == []
    assert plan_groups([5]) == [[0]]
    assert plan_groups([4, 4, 4, 4], max_tokens=8) == [[0, 1], [2, 3]]  # 3 x 4 = 12 padded tokens > 8
    assert plan_groups([1, 2], pad_share=0.0) == [[0], [1]]


def test_a_shared_opening_is_encoded_once_and_rows_then_prefill_together(model):
    """Four first turns share a 40-token opening nobody has cached: the first row encodes it whole, the other three
    wait one forward and then encode only their own 5 tokens, together; every reply equals a plain forward."""
    model, eos = model
    opening = list(range(3, 43))
    prompts = [opening + [100 + 5 * i + j for j in range(5)] for i in range(4)]
    calls: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    engine = GenerationEngine(model, eos)
    try:
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    finally:
        hook.remove()
    assert calls[:2] == [(1, 45), (3, 5)]
    assert all(rows <= 4 and width == 1 for rows, width in calls[2:])  # then decode steps only
    for prompt, gen in zip(prompts, gens):
        assert_greedy_matches_a_plain_forward(model, prompt, gen.token_ids, gen.logprobs)
    stats = engine.cache.take_stats()
    assert stats["reused_tokens"] == 3 * 40


def test_a_group_of_identical_first_turns_prefills_one_token_each_after_the_first(model):
    """A GRPO group starts from one prompt: the first row encodes it, the others then take all but its last token
    from the cache and encode that token together (a one-token forward over padded cached rows)."""
    model, eos = model
    prompt = list(range(5, 45))
    calls: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        gens = GenerationEngine(model, eos).generate([prompt] * 4, SamplingParams(max_new_tokens=3, temperature=0.0))
    finally:
        hook.remove()
    assert calls[:2] == [(1, 40), (3, 1)]
    for gen in gens:
        assert_greedy_matches_a_plain_forward(model, prompt, gen.token_ids, gen.logprobs)
