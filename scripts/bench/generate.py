"""hf_infer batched generation against a plain model.generate call on the same prompts and
settings, same run.

    .venv/bin/python scripts/bench/generate.py [--model smollm2|tiny|PATH] [--batch 16 --new 64]
"""

from __future__ import annotations

import argparse
import time

import _common
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    path = _common.model_path(args.model)
    from roll.strategies.base import SamplingParams
    from roll.strategies.hf_infer import HFInferStrategy

    strategy = HFInferStrategy(_common.worker_config(path, "hf_infer"))
    strategy.initialize()
    tok, model = strategy.tokenizer, strategy.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 1000, (int(n),), generator=g).tolist() for n in torch.randint(40, 120, (args.batch,), generator=g)]
    # Never stop early, so both sides generate exactly the same number of tokens.
    no_eos = SamplingParams(max_new_tokens=args.new, temperature=1.0, seed=0)
    strategy.eos_ids = {-1}

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.pad_token_id)
    att = torch.zeros_like(ids)
    for i, pr in enumerate(prompts):
        ids[i, width - len(pr):] = torch.tensor(pr)
        att[i, width - len(pr):] = 1

    def plain():
        torch.manual_seed(0)
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=args.new, min_new_tokens=args.new,
                             do_sample=True, temperature=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        return (out.shape[1] - width) * len(prompts)

    def ours():
        return sum(len(r.token_ids) for r in strategy.generate(prompts, no_eos))

    rates = {}
    for name, fn in (("plain model.generate", plain), ("hf_infer.generate", ours)):
        fn()  # warm-up
        total, t0 = 0, time.perf_counter()
        for _ in range(args.repeats):
            total += fn()
        rates[name] = total / (time.perf_counter() - t0)
    base, mine = rates["plain model.generate"], rates["hf_infer.generate"]
    print(f"generation, {args.model}, batch {args.batch}, {args.new} new tokens, {torch.get_num_threads()} threads")
    print(f"  plain model.generate: {base:8.1f} tokens/s")
    print(f"  hf_infer.generate   : {mine:8.1f} tokens/s  ({mine / base:.2f}x of plain; target >= 0.9x)")


if __name__ == "__main__":
    main()
