"""hf_infer's engine: KV reuse across turns and continuous batching give the same tokens and
log-probs as encoding every prompt whole; sampling is per request."""

import threading

import pytest
import torch

from roll.strategies.base import SamplingParams
from roll.strategies.hf_engine import GenerationEngine, PrefixCache, common_prefix, sampling_probs
from roll.strategies.hf_infer import HFInferStrategy

from .helpers import assert_greedy_matches_a_plain_forward, worker_config


@pytest.fixture(scope="module")
def model_and_eos(tiny_model_path):
    s = HFInferStrategy(worker_config(tiny_model_path, "hf_infer"))
    s.initialize()
    return s.model, s.eos_ids


def conversations(engine: GenerationEngine, params: SamplingParams, turns: int = 3) -> list[list[tuple[list[int], list[float]]]]:
    """Three multi-turn conversations run together, as env managers do: each turn's prompt is the
    previous prompt, the sampled tokens and a new user message (different per conversation)."""
    rows = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8]]  # 0 and 2: one group
    out: list[list[tuple[list[int], list[float]]]] = [[] for _ in rows]
    for turn in range(turns):
        gens = engine.generate(rows, params)
        for i, g in enumerate(gens):
            out[i].append((g.token_ids, g.logprobs))
            rows[i] = rows[i] + g.token_ids + [20 + i, 30 + turn, 40]
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=7, temperature=0.0),
    SamplingParams(max_new_tokens=7, temperature=1.0, seed=11),
    SamplingParams(max_new_tokens=7, temperature=0.8, top_p=0.9, top_k=40, seed=3),
], ids=["greedy", "seeded", "seeded-top-p-top-k"])
def test_kv_reuse_gives_the_tokens_and_logprobs_of_re_encoding(model_and_eos, params):
    model, eos = model_and_eos
    cached = GenerationEngine(model, eos, cache_tokens=1 << 16)
    plain = GenerationEngine(model, eos, cache_tokens=0)
    with_cache = conversations(cached, params)
    without = conversations(plain, params)
    stats = cached.cache.take_stats()
    assert stats["reused_tokens"] > stats["prompt_tokens"] // 2  # later turns and the shared opening came from the cache
    assert plain.cache.take_stats()["reused_tokens"] == 0
    for conv_a, conv_b in zip(with_cache, without):
        for (tok_a, lp_a), (tok_b, lp_b) in zip(conv_a, conv_b):
            assert tok_a == tok_b
            torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)


def test_tokens_and_logprobs_equal_a_plain_forward_and_hf_generate(model_and_eos):
    model, eos = model_and_eos
    engine = GenerationEngine(model, eos)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [5, 6, 7, 8]]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for prompt, gen in zip(prompts, gens):
        assert_greedy_matches_a_plain_forward(model, prompt, gen.token_ids, gen.logprobs)
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=sorted(eos),
                            pad_token_id=0)[0, len(prompt):].tolist()
        assert hf[: len(gen.token_ids)] == gen.token_ids


def test_a_seeded_request_samples_the_same_alone_or_in_a_batch(model_and_eos):
    model, eos = model_and_eos
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    engine = GenerationEngine(model, eos, cache_tokens=0)
    together = engine.generate([[3, 4, 5], [6, 7, 8, 9, 10]], params)
    alone = engine.generate([[3, 4, 5]], params)
    assert alone[0].token_ids == together[0].token_ids


def test_requests_from_other_threads_join_the_running_batch(model_and_eos):
    model, eos = model_and_eos
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    prompts = [[i, i + 1, i + 2] for i in range(5, 13)]
    expected = [g.token_ids for g in GenerationEngine(model, eos).generate(prompts, params)]
    engine = GenerationEngine(model, eos)
    results: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        results[i] = engine.generate([prompts[i]], params)[0].token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(prompts))] == expected


def test_an_error_reaches_every_waiting_request(model_and_eos):
    model, eos = model_and_eos
    engine = GenerationEngine(model, eos)
    with pytest.raises(IndexError):
        engine.generate([[5, 6], [10_000_000]], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert engine.generate([[5, 6]], SamplingParams(max_new_tokens=2, temperature=0.0))  # the engine still runs


def test_prefix_cache_keeps_the_longest_prefix_and_evicts_least_recently_used():
    def kv(n):
        return [(torch.full((1, 1, n, 2), float(n)), torch.zeros(1, 1, n, 2))]

    cache = PrefixCache(max_tokens=10)
    cache.add(torch.tensor([1, 2, 3]), kv(3))
    cache.add(torch.tensor([1, 2, 3, 4, 5]), kv(5))  # extends the first: it replaces it
    assert len(cache) == 1
    got, n = cache.lookup(torch.tensor([1, 2, 3, 4, 9, 9]))
    assert n == 4 and got[0][0].shape[2] == 4
    _, n = cache.lookup(torch.tensor([1, 2, 3, 4, 5]))
    assert n == 4  # the prompt's last token is always fed (its logits are needed)
    cache.add(torch.tensor([7, 8, 9, 10]), kv(4))
    cache.lookup(torch.tensor([1, 2, 3]))  # touch the first entry
    cache.add(torch.tensor([11, 12, 13]), kv(3))  # over 10 tokens: the least recently used goes
    assert cache.lookup(torch.tensor([7, 8, 9, 10, 11]))[1] == 0
    assert common_prefix(torch.tensor([1, 2]), torch.tensor([1, 2, 3])) == 2


def test_sampling_probs_top_k_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(sampling_probs(logits, 1.0, 1.0, 2), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(sampling_probs(logits, 1.0, 0.7, -1), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(sampling_probs(logits, 1.0, 0.85, -1), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    hot = sampling_probs(logits, 2.0, 1.0, -1)
    torch.testing.assert_close(hot, torch.softmax(logits / 2, -1))


def test_max_rows_bounds_the_decode_batch_and_changes_no_token(model_and_eos):
    """hf_infer's max_num_seqs: at most that many rows decode at once; the others wait, join as rows finish, and
    get exactly the tokens and log-probs of an unbounded batch."""
    model, eos = model_and_eos
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)
    prompts = [[i, i + 1, i + 2 + i % 3] for i in range(5, 12)]
    expected = GenerationEngine(model, eos, cache_tokens=0).generate(prompts, params)
    widths: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        got = GenerationEngine(model, eos, cache_tokens=0, max_rows=2).generate(prompts, params)
    finally:
        hook.remove()
    assert max(widths) == 2
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    for a, b in zip(got, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_rows"):
        GenerationEngine(model, eos, max_rows=0)
