"""deepspeed_train (ZeRO-2, CPU) training throughput against a plain torch AdamW loop, same model,
same batch, same run.

    .venv/bin/python scripts/bench/train_step.py [--model smollm2|tiny|PATH] [--rows 4 --length 256 --steps 3]
"""

from __future__ import annotations

import argparse
import time

import _common
import torch


def nll_loss_fn(micro, out, counts):
    from roll.algorithms.losses import aggregate

    loss = aggregate(-out.logprobs, micro["response_mask"].float(), "token-mean", counts)
    return loss, {"loss": float(loss)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in both (training_args.bf16)")
    p.add_argument("--ds", default="examples/config/deepspeed_zero2.yaml", help="DeepSpeed config piece (yaml)")
    args = p.parse_args()
    path = _common.model_path(args.model)
    torch.manual_seed(0)
    ids = torch.randint(10, 1000, (args.rows, args.length))
    mask = torch.ones_like(ids)
    tokens = args.rows * args.length

    # Baseline: plain transformers model + torch AdamW, one optimizer step per batch.
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import shifted_token_logprobs

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = -shifted_token_logprobs(logits, ids)[:, 1:].mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step:  # the first step warms up
            times.append(time.perf_counter() - t0)
    base = tokens / (sum(times) / len(times))
    del model, opt

    import yaml

    from roll.distributed.batch import Batch
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy

    cfg = _common.worker_config(path, "deepspeed_train", stage=args.stage, micro=args.rows)
    piece = yaml.safe_load(open(args.ds))
    cfg.strategy_args.strategy_config = next(iter(piece.values()))
    args.stage = cfg.strategy_args.strategy_config["zero_optimization"]["stage"]
    cfg.training_args.bf16 = args.bf16
    strategy = DeepSpeedTrainStrategy(cfg, StrategyContext(seed=0))
    strategy.initialize()
    batch = Batch({"input_ids": ids, "attention_mask": mask, "response_mask": mask})
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        strategy.train_step(batch, nll_loss_fn)
        if step:
            times.append(time.perf_counter() - t0)
    ours = tokens / (sum(times) / len(times))
    precision = "bf16 autocast" if args.bf16 else "fp32"
    print(f"train step, {args.model}, batch {args.rows}x{args.length} {precision}, {torch.get_num_threads()} threads")
    print(f"  plain torch AdamW loop : {base:8.1f} tokens/s")
    print(f"  deepspeed_train ZeRO-{args.stage}: {ours:8.1f} tokens/s  ({ours / base:.2f}x of plain; target >= 0.9x)")


if __name__ == "__main__":
    main()
