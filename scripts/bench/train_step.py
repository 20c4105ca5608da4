"""deepspeed_train (ZeRO-2, CPU) training throughput against a plain torch AdamW loop, same model,
same batch, same run. With --lora: full-parameter training against LoRA (rank --rank on all linear
layers) on the same batch, each in its own process: tokens/s, peak memory (RSS), and what a weight
sync moves (bytes, and the time to gather and copy it into the shared-memory buffer).

    .venv/bin/python scripts/bench/train_step.py [--model smollm2|tiny|PATH] [--rows 4 --length 256 --steps 3] [--lora]
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
    p.add_argument("--lora", action="store_true", help="compare full-parameter training with LoRA instead")
    p.add_argument("--rank", type=int, default=32, help="LoRA rank (with --lora)")
    p.add_argument("--logits", action="store_true",
                   help="compare whole-row logits with chunked log-probs, each with and without gradient checkpointing")
    p.add_argument("--one", help=argparse.SUPPRESS)  # one side of --lora / --logits, in its own process
    args = p.parse_args()
    if args.lora:
        return compare_lora(args)
    if args.logits:
        return compare_logits(args)
    if args.one:
        return one_side(args)
    path = _common.model_path(args.model)
    torch.manual_seed(0)
    from transformers import AutoConfig

    ids = torch.randint(10, min(1000, AutoConfig.from_pretrained(path).vocab_size), (args.rows, args.length))
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


    cfg = _common.worker_config(path, "deepspeed_train", stage=args.stage, micro=args.rows)
    piece = yaml.safe_load(open(args.ds))
    cfg.strategy_args.strategy_config = next(iter(piece.values()))
    args.stage = cfg.strategy_args.strategy_config["zero_optimization"]["stage"]
    cfg.training_args.bf16 = args.bf16
    strategy, seconds = timed_strategy(cfg, ids, mask, args.steps)
    ours = tokens / seconds
    precision = "bf16 autocast" if args.bf16 else "fp32"
    print(f"train step, {args.model}, batch {args.rows}x{args.length} {precision}, {torch.get_num_threads()} threads")
    print(f"  plain torch AdamW loop : {base:8.1f} tokens/s")
    print(f"  deepspeed_train ZeRO-{args.stage}: {ours:8.1f} tokens/s  ({ours / base:.2f}x of plain; target >= 0.9x)")


def timed_strategy(cfg, ids: torch.Tensor, mask: torch.Tensor, steps: int):
    """A deepspeed_train strategy for ``cfg`` and its mean seconds per train step (after one warm-up step)."""
    from roll.distributed.batch import Batch
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy

    strategy = DeepSpeedTrainStrategy(cfg, StrategyContext(seed=0))
    strategy.initialize()
    batch = Batch({"input_ids": ids, "attention_mask": mask, "response_mask": mask})
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        strategy.train_step(batch, nll_loss_fn)
        if step:
            times.append(time.perf_counter() - t0)
    return strategy, sum(times) / len(times)


def one_side(args: argparse.Namespace) -> None:
    """Train ``args.one`` (full or lora) and print one JSON line: tokens/s, peak RSS, sync bytes and time."""
    import dataclasses
    import json
    import resource

    from transformers import AutoConfig

    from roll.distributed.weight_transport import SharedWeightsSender

    path = _common.model_path(args.model)
    torch.manual_seed(0)
    ids = torch.randint(10, min(1000, AutoConfig.from_pretrained(path).vocab_size), (args.rows, args.length))
    mask = torch.ones_like(ids)
    cfg = _common.worker_config(path, "deepspeed_train", stage=args.stage, micro=args.rows)
    cfg.training_args.bf16 = args.bf16
    if args.one.startswith(("whole", "chunked")):  # --logits: which log-prob path, with or without checkpointing
        kind, checkpointing = args.one.split("-")
        cfg.model_args = dataclasses.replace(cfg.model_args, disable_gradient_checkpointing=checkpointing == "nogc")
        import roll.strategies.deepspeed_train as ds_train

        # whole: the model's [B, T, V] logits at any size; chunked: chunks at any size
        ds_train.chunking_pays = lambda *a: kind == "chunked"
    if args.one == "lora":
        cfg.model_args = dataclasses.replace(cfg.model_args, lora_target="all-linear", lora_rank=args.rank,
                                             lora_alpha=args.rank)
    strategy, seconds = timed_strategy(cfg, ids, mask, args.steps)
    adapters = args.one == "lora"  # hf_infer takes the adapter alone
    sender = SharedWeightsSender()
    t0 = time.perf_counter()
    sender.prepare(strategy.weight_sizes(adapters))
    sent = 0
    for bucket in strategy.weight_buckets(adapters=adapters):
        sender.write(bucket)
        sent += sum(t.numel() * t.element_size() for _, t in bucket)
    sync_s = time.perf_counter() - t0
    sender.close()
    print(json.dumps({"tok_s": args.rows * args.length / seconds, "sync_bytes": sent, "sync_s": sync_s,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def compare_lora(args: argparse.Namespace) -> None:
    out = _sides(args, ("full", "lora"))
    full, lora = out["full"], out["lora"]
    print(f"LoRA vs full, {args.model}, batch {args.rows}x{args.length}, rank {args.rank} on all linear layers, "
          f"ZeRO-{args.stage}, {torch.get_num_threads()} threads")
    print(f"  train step : full {full['tok_s']:8.1f} tok/s | LoRA {lora['tok_s']:8.1f} tok/s  ({lora['tok_s'] / full['tok_s']:.2f}x)")
    print(f"  peak RSS   : full {full['peak_rss_mb']:8.0f} MB    | LoRA {lora['peak_rss_mb']:8.0f} MB")
    print(f"  weight sync: full {full['sync_bytes'] / 2**20:8.1f} MiB in {full['sync_s']:.3f} s | "
          f"LoRA adapter {lora['sync_bytes'] / 2**20:8.1f} MiB in {lora['sync_s']:.3f} s")


def _sides(args: argparse.Namespace, sides: tuple[str, ...]) -> dict[str, dict]:
    """Each side of a comparison in its own process (peak memory is per process): its JSON line."""
    import json
    import subprocess
    import sys

    out = {}
    for side in sides:
        cmd = [sys.executable, __file__, "--one", side, "--model", args.model, "--rows", str(args.rows), "--length",
               str(args.length), "--steps", str(args.steps), "--stage", str(args.stage), "--rank", str(args.rank)]
        cmd += ["--bf16"] if args.bf16 else []
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[side] = json.loads([line for line in res.stdout.splitlines() if line.startswith("{")][-1])
    return out


def compare_logits(args: argparse.Namespace) -> None:
    sides = ("whole-gc", "chunked-gc", "whole-nogc", "chunked-nogc")
    out = _sides(args, sides)
    base = out["whole-gc"]
    print(f"log-probs from whole logits vs chunked (the head + fp32 log-softmax over pieces of positions), {args.model}, "
          f"batch {args.rows}x{args.length} {'bf16 autocast' if args.bf16 else 'fp32'}, ZeRO-{args.stage}, "
          f"{torch.get_num_threads()} threads")
    for side in sides:
        r = out[side]
        print(f"  {side:13s}: {r['tok_s']:8.1f} tok/s ({r['tok_s'] / base['tok_s']:.2f}x)   peak RSS {r['peak_rss_mb']:7.0f} MB")


if __name__ == "__main__":
    main()
