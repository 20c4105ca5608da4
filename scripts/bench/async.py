"""Asynchronous training (async_generation_ratio 0, 1, 2) on the same config and seeds, same run:
step time, each phase's busy share, and the overlap achieved (time generation and training were both
busy / wall time).

    .venv/bin/python scripts/bench/async.py [--config_name agentic_sokoban] [--steps 4] [--ratios 0 1 2] [key=value ...]

actor_infer goes on its own device slot (1) so the roles may run at once; on a 2-core CPU they still
share the cores, so the overlap shows up more than the speed-up.
"""

from __future__ import annotations

import argparse
import time

import _common

TRAINING = ("reference", "old_log_probs", "values", "critic_train", "actor_train")


def intervals(steps: dict[int, dict[str, float]], names: tuple[str, ...]) -> list[tuple[float, float]]:
    out = []
    for m in steps.values():
        for name in names:
            if f"time/{name}_began_s" in m:
                out.append((m[f"time/{name}_began_s"], m[f"time/{name}_ended_s"]))
    return out


def busy(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of ``spans`` clipped to [lo, hi], as sorted disjoint intervals."""
    merged: list[list[float]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def overlap(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in x for c, d in y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config_name", default="agentic_sokoban")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ratios", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from roll.configs.loading import load_config
    from roll.utils.tracking import Tracker

    class Recorder(Tracker):
        def __init__(self, inner):
            self.steps, self.inner = {}, inner

        def log(self, metrics, step):
            self.steps[step] = dict(metrics)

        def log_episode(self, *a, **k):
            pass

        def close(self):
            self.inner.close()

    rows = []
    for ratio in args.ratios:
        cfg = load_config(args.config_name, overrides=[
            f"max_steps={args.steps}", "eval_steps=0", "save_steps=0", "track_with=stdout", "render_save_dir=null",
            "actor_infer.device_mapping=[1]", f"async_generation_ratio={ratio}", "seed=1", *args.overrides]).config
        holder = {}

        def wrap(tracker, holder=holder):
            holder["r"] = Recorder(tracker)
            return holder["r"]

        start = time.perf_counter()
        _common.run_pipeline(cfg, wrap)
        wall = time.perf_counter() - start
        steps = holder["r"].steps
        measured = {s: m for s, m in steps.items() if s > 0}  # step 0 has no rollout ahead of it
        lo = min(m["time/weight_sync_began_s"] for m in measured.values())
        hi = max(m["time/actor_train_ended_s"] for m in measured.values())
        gen = busy(intervals(steps, ("train",)), lo, hi)
        train = busy(intervals(steps, TRAINING), lo, hi)
        span = hi - lo
        rows.append((ratio, span / len(measured), sum(b - a for a, b in gen) / span, sum(b - a for a, b in train) / span,
                     overlap(gen, train) / span, max(m.get("async/staleness_max", 0.0) for m in steps.values()), wall))
    print(f"async training, {args.config_name}, steps 1..{args.steps - 1} measured (step 0 has nothing ahead of it)")
    print("  ratio  step s  generation busy  training busy  both busy  max staleness  run wall s")
    base = rows[0][1]
    for ratio, step, g, t, both, stale, wall in rows:
        print(f"  {ratio:5d}  {step:6.1f}  {g:15.0%}  {t:13.0%}  {both:9.0%}  {stale:13.0f}  {wall:10.1f}"
              f"   ({base / step:.2f}x of ratio {rows[0][0]})")


if __name__ == "__main__":
    main()
