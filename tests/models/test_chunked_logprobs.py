"""Chunked log-probs (the head and the fp32 log-softmax a few positions at a time) against the whole-logits
computation: the same values and the same gradients, for the model and for the head."""

import pytest
import torch

from roll.models.logprobs import (
    chunked_entropy,
    chunked_token_logprobs,
    shifted_entropy,
    shifted_token_logprobs,
    split_causal_lm,
)
from roll.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"),
                                                dtype=torch.float32)


@pytest.mark.parametrize("chunk", [1, 5, 7, 1000])
def test_chunked_logprobs_and_entropy_equal_the_whole_logits_with_their_gradients(model, chunk):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (3, 9), generator=gen)
    body, head = split_causal_lm(model)
    weights = torch.randn(3, 9, generator=gen)

    def grads(fn):
        model.zero_grad()
        hidden = body(input_ids=ids).last_hidden_state
        lp, ent = fn(hidden)
        ((lp * weights).sum() + (ent * weights).sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole = grads(lambda h: (shifted_token_logprobs(head(h), ids), shifted_entropy(head(h))))
    piecewise = grads(lambda h: (chunked_token_logprobs(h, head, ids, chunk), chunked_entropy(h, head, chunk)))
    torch.testing.assert_close(piecewise[0], whole[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(piecewise[1], whole[1], rtol=0, atol=1e-5)
    assert whole[2].keys() == piecewise[2].keys() and len(whole[2]) > 5
    for name, g in whole[2].items():
        torch.testing.assert_close(piecewise[2][name], g, rtol=1e-4, atol=1e-6)
    # and the same as the model's own forward (logits of the full model)
    torch.testing.assert_close(whole[0], shifted_token_logprobs(model(input_ids=ids).logits, ids).detach(), rtol=0,
                               atol=1e-5)


def test_models_with_a_scaled_head_keep_whole_logits(model):
    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gemma2"})()

    assert split_causal_lm(Other()) is None
    assert split_causal_lm(model) is not None
