"""Rollout throughput: SimpleSokoban trajectories with SmolLM2 + hf_infer on CPU, against plain
model.generate calls on batches of the same sizes and lengths, in the same run.

    .venv/bin/python scripts/bench/rollout.py [--trajectories 32 --actions 5 --step-tokens 64]
"""

from __future__ import annotations

import argparse
import time

import _common
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--trajectories", type=int, default=32)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--actions", type=int, default=5)
    p.add_argument("--step-tokens", type=int, default=64)
    args = p.parse_args()
    path = _common.model_path(args.model)
    from roll.agentic.conversation import ChatTemplate
    from roll.agentic.generation import RequestBatcher
    from roll.agentic.rollout import local_factory, make_rollout
    from roll.configs.loading import load_config
    from roll.strategies.hf_infer import HFInferStrategy

    groups = args.trajectories // args.group_size
    cfg = load_config("agentic_sokoban", overrides=[
        f"rollout_batch_size={args.trajectories}", f"train_env_manager.num_env_groups={groups}",
        f"train_env_manager.group_size={args.group_size}", f"train_env_manager.num_groups_partition=[{groups}]",
        f"max_actions_per_traj={args.actions}", f"max_tokens_per_step={args.step_tokens}", "render_save_dir=null",
        "sequence_length=4096"]).config
    infer = HFInferStrategy(_common.worker_config(path, "hf_infer"))
    infer.initialize()
    calls: list[tuple[list[list[int]], int, list[int]]] = []

    def backend(rank, prompts, params):
        out = infer.generate(prompts, params)
        calls.append((prompts, params.max_new_tokens, [len(g.token_ids) for g in out]))
        return out

    template = ChatTemplate(infer.tokenizer, args.model)
    template.check_prefix_preserving()
    batcher = RequestBatcher(backend, 1, max_batch_size=args.trajectories, max_wait_s=0.05)
    rollout = make_rollout(cfg, "train", template,
                           lambda params, frames: local_factory(template, batcher.generate, params, cfg.sequence_length, frames),
                           batcher.take_stats)
    t0 = time.perf_counter()
    result = rollout.collect(args.trajectories, step=0)
    wall = time.perf_counter() - t0
    tokens = sum(sum(n) for _, _, n in calls)

    # Baseline: the same batches through plain model.generate, each generating as long as its longest row.
    model, pad = infer.model, infer.tokenizer.pad_token_id
    t0 = time.perf_counter()
    for prompts, _, lengths in calls:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad)
        att = torch.zeros_like(ids)
        for i, pr in enumerate(prompts):
            ids[i, width - len(pr):] = torch.tensor(pr)
            att[i, width - len(pr):] = 1
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max(lengths), min_new_tokens=max(lengths),
                           do_sample=True, pad_token_id=pad)
    base_wall = time.perf_counter() - t0
    m = result.metrics
    ours, base = tokens / wall, tokens / base_wall
    print(f"rollout, {args.model}, {args.trajectories} SimpleSokoban trajectories (groups of {args.group_size}), "
          f"<= {args.actions} actions x {args.step_tokens} tokens, {torch.get_num_threads()} threads")
    print(f"  rollout wall {wall:.1f} s, {tokens} generated tokens, {len(calls)} generate calls")
    print(f"  plain model.generate on the same batches: {base:7.1f} tokens/s")
    print(f"  rollout (env managers + batcher + hf_infer): {ours:7.1f} tokens/s  ({ours / base:.2f}x; target >= 0.9x)")
    print(f"  env time share {m['rollout/env_time_share']:.3%}, mean batch per generate call {m['rollout/mean_generate_batch']:.1f}, "
          f"turn latency p50 {m['rollout/turn_latency_p50_s']:.2f} s / p99 {m['rollout/turn_latency_p99_s']:.2f} s")
    print(f"  score {m['rollout/score']:.3f}, success {m['rollout/success']:.3f}, "
          f"valid actions {m['rollout/SimpleSokoban/action_is_valid']:.3f}")


if __name__ == "__main__":
    main()
