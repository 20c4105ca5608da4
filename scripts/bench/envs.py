"""Env throughput on one core: resets/s, steps/s and reset latency per preset, plus generation
failures over many seeds, against a same-run baseline generator.

    .venv/bin/python scripts/bench/envs.py [--seeds 10000]

Baseline: the classic generator design (an exhaustive depth-first search over reverse moves to
``search_depth``, keeping the position with the highest box-swaps x displacement score, and a
failure when the room allows no displacement), run on the same rooms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.frozen_lake import FrozenLakeEnv  # noqa: E402
from envs.sokoban.env import SokobanEnv  # noqa: E402
from envs.sokoban.generation import _carve_room, generate_level  # noqa: E402
from envs.tools.countdown import CountdownEnv  # noqa: E402

PRESETS = {
    "SimpleSokoban": (SokobanEnv, dict(dim_room=(6, 6), num_boxes=1)),
    "LargerSokoban": (SokobanEnv, dict(dim_room=(10, 10), num_boxes=2, search_depth=10)),
    "SokobanDifferentGridVocab": (SokobanEnv, dict(dim_room=(6, 6), num_boxes=1, search_depth=30,
                                                    grid_lookup={0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"})),
    "FrozenLake": (FrozenLakeEnv, dict(size=4, is_slippery=False)),
    "Countdown": (CountdownEnv, dict()),
}
ACTIONS = {
    SokobanEnv: ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"],
    FrozenLakeEnv: ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"],
    CountdownEnv: ['<tool_call>{"name": "calculate", "arguments": {"expression": "1 + 2 * 3"}}</tool_call>'],
}


def bench_preset(name: str, seeds: int) -> dict[str, float]:
    cls, kwargs = PRESETS[name]
    env = cls(max_steps=10**9, **kwargs)
    times, failures, tries = [], 0, []
    for seed in range(seeds):
        t0 = time.perf_counter()
        try:
            env.reset(seed=seed)
        except Exception:  # noqa: BLE001 - a benchmark counts failures instead of stopping
            failures += 1
            continue
        times.append(time.perf_counter() - t0)
        tries.append(getattr(env, "generation_tries", 1))
    actions = ACTIONS[cls]
    env.reset(seed=0)
    n_steps = 20000
    t0 = time.perf_counter()
    for i in range(n_steps):
        _, _, terminated, truncated, _ = env.step(actions[i % len(actions)])
        if terminated or truncated:
            env.reset(seed=i)
    step_time = (time.perf_counter() - t0) / n_steps
    return {
        "reset_median_ms": statistics.median(times) * 1e3,
        "reset_p99_ms": statistics.quantiles(times, n=100)[98] * 1e3,
        "resets_per_s": len(times) / sum(times),
        "steps_per_s": 1.0 / step_time,
        "failures": failures,
        "mean_rooms_per_level": statistics.mean(tries),
    }


def baseline_room(dim, num_boxes, search_depth, rng: random.Random) -> bool:
    """Exhaustive DFS reverse play on one room from the same carving; True when it found a level."""
    h, w = dim
    walls = _carve_room(h, w, num_boxes, rng)
    floor = [i for i, x in enumerate(walls) if not x]
    if len(floor) < num_boxes + 1:
        return False
    picks = rng.sample(floor, num_boxes + 1)
    targets, player = picks[:num_boxes], picks[num_boxes]
    offsets = (-w, w, -1, 1)
    best = [0]
    seen = set()

    def score(boxes, swaps):
        return swaps * sum(abs(b // w - t // w) + abs(b % w - t % w) for b, t in zip(boxes, targets))

    def dfs(player, boxes, swaps, last_pulled, depth):
        state = (player, boxes)
        if state in seen or depth > search_depth:
            return
        seen.add(state)
        best[0] = max(best[0], score(boxes, swaps))
        box_set = set(boxes)
        for d in offsets:
            nxt = player + d
            if walls[nxt] or nxt in box_set:
                continue
            dfs(nxt, boxes, swaps, last_pulled, depth + 1)
            behind = player - d
            if behind in box_set:
                i = boxes.index(behind)
                pulled = boxes[:i] + (player,) + boxes[i + 1:]
                dfs(nxt, pulled, swaps + (last_pulled != i), i, depth + 1)

    sys.setrecursionlimit(10000)
    dfs(player, tuple(targets), 0, -1, 0)
    return best[0] > 0


def bench_baseline(dim, num_boxes, search_depth, seeds, max_rooms=64) -> dict[str, float]:
    """Per level, drawing rooms until one works (as our generator does); rejected rooms counted."""
    times, rooms, failures = [], [], 0
    for seed in range(seeds):
        rng = random.Random(seed)
        t0 = time.perf_counter()
        n = 1
        while not baseline_room(dim, num_boxes, search_depth, rng):
            if n == max_rooms:
                failures += 1
                break
            n += 1
        times.append(time.perf_counter() - t0)
        rooms.append(n)
    rejected = 1 - seeds / sum(rooms)
    return {"median_ms": statistics.median(times) * 1e3, "rejected": rejected, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10000)
    parser.add_argument("--baseline-seeds", type=int, default=1000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    print(f"envs benchmark: {args.seeds} seeds per preset, one core, Python {sys.version.split()[0]}")
    print(f"{'preset':28s} {'reset p50 ms':>12s} {'reset p99 ms':>12s} {'resets/s':>10s} {'steps/s':>10s} {'failures':>8s} {'rooms/level':>11s}")
    for name in PRESETS:
        r = bench_preset(name, args.seeds)
        print(f"{name:28s} {r['reset_median_ms']:12.3f} {r['reset_p99_ms']:12.3f} {r['resets_per_s']:10.0f} "
              f"{r['steps_per_s']:10.0f} {r['failures']:8d} {r['mean_rooms_per_level']:11.2f}")
    print(f"\nbaseline generator (exhaustive DFS reverse play), {args.baseline_seeds} seeds, per level:")
    for name, dim, nb, depth in [("SimpleSokoban", (6, 6), 1, 100), ("LargerSokoban", (10, 10), 2, 10)]:
        b = bench_baseline(dim, nb, depth, args.baseline_seeds)
        ours = []
        for seed in range(args.baseline_seeds):
            t0 = time.perf_counter()
            generate_level(dim, nb, depth, seed)
            ours.append(time.perf_counter() - t0)
        print(f"{name:28s} baseline median {b['median_ms']:.3f} ms (rooms rejected {b['rejected']:.1%}, "
              f"failures {b['failures']}); ours, generation only: {statistics.median(ours) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
