"""One step of the default config: time per phase and the pipeline overhead (the share of step
time outside generation, forward and backward compute).

    .venv/bin/python scripts/bench/pipeline_step.py [--config_name agentic_sokoban] [key=value ...]
"""

from __future__ import annotations

import argparse

import _common  # noqa: F401  (puts the repo on sys.path)

PHASES = ("weight_sync", "rollout", "eval", "reference", "old_log_probs", "values", "advantages", "critic_train",
          "actor_train", "checkpoint")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config_name", default="agentic_sokoban")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from roll.agentic.pipeline import AgenticPipeline
    from roll.configs.loading import load_config

    cfg = load_config(args.config_name, overrides=["max_steps=1", "eval_steps=0", "save_steps=0", "track_with=stdout",
                                                    "render_save_dir=null", *args.overrides]).config
    pipeline = AgenticPipeline(cfg)
    try:
        m = pipeline.run()
    finally:
        pipeline.shutdown()
    step = m["time/step"]
    print(f"pipeline step, {args.config_name}: {step:.1f} s")
    for phase in PHASES:
        if f"time/{phase}" in m:
            print(f"  {phase:14s} {m[f'time/{phase}']:8.2f} s  ({m[f'time/{phase}'] / step:6.1%})")
    generate = m.get("rollout/generated_tokens", 0.0) / max(m.get("rollout/generate_tokens_per_s", 1e-9), 1e-9)
    compute = sum(m.get(f"time/{k}", 0.0) for k in ("reference", "old_log_probs", "values", "critic_train", "actor_train"))
    env = m.get("rollout/env_time_share", 0.0) * m.get("time/rollout", 0.0)
    rollout_other = max(0.0, m.get("time/rollout", 0.0) - generate)
    print(f"  generation inside rollout ~{generate:.2f} s (rollout wall minus it: {rollout_other:.2f} s, env time {env:.3f} s)")
    overhead = max(0.0, step - compute - min(generate, m.get("time/rollout", 0.0)))
    print(f"  overhead (step time outside generation, forward and backward): {overhead:.2f} s = {overhead / step:.1%} "
          f"(target < 10%)")


if __name__ == "__main__":
    main()
