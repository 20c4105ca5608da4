"""Dynamic batching (micro-batches by token count) against row micro-batches: deepspeed_train train
step and log-prob pass on the same ragged batch, same run. Both give the same numbers (tests check
that); only the padding they compute on differs.

    .venv/bin/python scripts/bench/dynamic_batching.py [--model smollm2|tiny|PATH] [--rows 8 --width 768 --steps 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import _common
import torch


def nll_loss_fn(micro, out, counts):
    from roll.algorithms.losses import aggregate

    loss = aggregate(-out.logprobs, micro["response_mask"].float(), "token-mean", counts)
    return loss, {"loss": float(loss)}


def ragged_batch(rows: int, width: int, seed: int = 0):
    """Rows of lengths spread like a multi-turn rollout's (a few long episodes, many short ones)."""
    from roll.distributed.batch import Batch

    g = torch.Generator().manual_seed(seed)
    lengths = (width * (0.15 + 0.85 * torch.rand(rows, generator=g) ** 2)).long().clamp(max=width)
    lengths[0] = width  # the batch is padded to its longest row
    ids = torch.randint(10, 1000, (rows, width), generator=g)
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    response = attention.clone()
    response[:, : width // 8] = 0
    return Batch({"input_ids": ids, "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
                  "response_mask": response})


def timed(fn, steps: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--micro", type=int, default=2, help="rows per micro-batch without dynamic batching")
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy

    path = _common.model_path(args.model)
    batch = ragged_batch(args.rows, args.width)
    real = float(batch["attention_mask"].sum())
    base = _common.worker_config(path, "deepspeed_train", stage=0, micro=args.micro, gas=args.rows // args.micro)
    results = {}
    for dynamic in (False, True):
        cfg = dataclasses.replace(base, infer_batch_size=args.micro, use_dynamic_batching_in_train=dynamic,
                                  use_dynamic_batching_in_infer=dynamic,
                                  max_tokens_per_microbatch_in_train=args.micro * args.width,
                                  max_tokens_per_microbatch_in_infer=args.micro * args.width)
        strategy = DeepSpeedTrainStrategy(cfg, StrategyContext(seed=0))
        strategy.initialize()
        train = timed(lambda s=strategy: s.train_step(batch, nll_loss_fn), args.steps)
        logprobs = timed(lambda s=strategy: s.compute_log_probs(batch), args.steps)
        results[dynamic] = (train, logprobs)
        del strategy
    print(f"dynamic batching, {args.model}, {args.rows} rows padded to {args.width} ({real / (args.rows * args.width):.0%} "
          f"real tokens), budget {args.micro}x{args.width} tokens, {torch.get_num_threads()} threads")
    for name, i in (("train step", 0), ("log-probs ", 1)):
        rows, dyn = results[False][i], results[True][i]
        print(f"  {name}: rows of {args.micro} {real / rows:8.1f} tok/s | dynamic {real / dyn:8.1f} tok/s  ({rows / dyn:.2f}x)")


if __name__ == "__main__":
    main()
