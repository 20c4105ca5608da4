"""hf_infer's CPU decode attention: the same numbers as torch's SDPA with the key/value heads repeated, for grouped
heads and padded rows; the engine on a grouped-query model gives the tokens and log-probs of a plain forward."""

import pytest
import torch

from roll.strategies.base import SamplingParams
from roll.strategies.decode_attention import NAME, grouped_decode_attention, use_decode_attention
from roll.strategies.hf_engine import GenerationEngine
from roll.strategies.hf_infer import HFInferStrategy

from .helpers import assert_greedy_matches_a_plain_forward, worker_config


def sdpa_reference(query, key, value, keep):
    """torch's SDPA in fp64 with every key/value head repeated for its query heads (transformers' repeat_kv)."""
    groups = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1),
        attn_mask=keep)
    return out.transpose(1, 2)


@pytest.mark.parametrize("kv_heads", [1, 2, 6])
def test_grouped_decode_attention_equals_sdpa_with_repeated_heads(kv_heads):
    torch.manual_seed(0)
    b, heads, length, dim = 3, 6, 11, 8
    query, key, value = torch.randn(b, heads, 1, dim), torch.randn(b, kv_heads, length, dim), torch.randn(b, kv_heads, length, dim)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    keep[1, ..., :4] = False  # left padding of a shorter row
    keep[2, ..., :9] = False
    got = grouped_decode_attention(query, key, value, keep, dim ** -0.5)
    assert got.shape == (b, 1, heads, dim)
    torch.testing.assert_close(got.double(), sdpa_reference(query, key, value, keep), atol=1e-6, rtol=0)
    # a float mask (0 attends, -inf hides) and no mask at all
    additive = torch.zeros(b, 1, 1, length).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(grouped_decode_attention(query, key, value, additive, dim ** -0.5), got, atol=1e-6, rtol=0)
    everything = torch.ones_like(keep)
    torch.testing.assert_close(grouped_decode_attention(query, key, value, None, dim ** -0.5).double(),
                               sdpa_reference(query, key, value, everything), atol=1e-6, rtol=0)


def test_by_hand_one_head_two_keys():
    query = torch.tensor([[[[1.0, 0.0]]]])
    key = torch.tensor([[[[2.0, 0.0], [0.0, 5.0]]]])
    value = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    # scores 2 and 0 at scale 1: softmax (e^2, 1) / (e^2 + 1)
    p = torch.tensor(2.0).exp() / (torch.tensor(2.0).exp() + 1)
    got = grouped_decode_attention(query, key, value, None, 1.0)
    torch.testing.assert_close(got[0, 0, 0], torch.stack([p, 1 - p]))
    hidden = torch.tensor([[[[False, True]]]])
    torch.testing.assert_close(grouped_decode_attention(query, key, value, hidden, 1.0)[0, 0, 0], torch.tensor([0.0, 1.0]))


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    from roll.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny_gqa"), num_heads=4, num_kv_heads=2)
    s = HFInferStrategy(worker_config(str(path), "hf_infer"))
    s.initialize()
    return s.model, s.eos_ids


def test_engine_on_a_grouped_query_model_equals_a_plain_forward(gqa_model):
    """Rows of different lengths decode together (left-padded); each row's greedy tokens and log-probs equal a plain
    forward of that row alone, which runs SDPA (more than one query token)."""
    model, eos = gqa_model
    assert model.config._attn_implementation == NAME
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        gens = GenerationEngine(model, eos, cache_tokens=0).generate(
            [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16], [5, 6, 7, 8]], SamplingParams(max_new_tokens=6, temperature=0.0))
    finally:
        hook.remove()
    assert 1 in calls  # decode steps ran
    for prompt, gen in zip([[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16], [5, 6, 7, 8]], gens):
        assert_greedy_matches_a_plain_forward(model, prompt, gen.token_ids, gen.logprobs)


def test_only_cpu_models_on_sdpa_are_switched(gqa_model, tiny_model_path):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="eager")
    assert not use_decode_attention(eager)
    assert eager.config._attn_implementation == "eager"
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa")
    assert use_decode_attention(sdpa) and sdpa.config._attn_implementation == NAME
