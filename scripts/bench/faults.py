"""A short run (tiny model) on an env that raises on 30% of its steps and hangs on 2%: every step must
complete, and every lost episode be counted. Prints the counts.

    .venv/bin/python scripts/bench/faults.py [--steps 20] [--raise_rate 0.3] [--hang_rate 0.02]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _common


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--raise_rate", type=float, default=0.3)
    p.add_argument("--hang_rate", type=float, default=0.02)
    p.add_argument("--env_step_timeout", type=float, default=1.0)
    args = p.parse_args()
    from roll.configs.loading import load_config
    from roll.utils.tracking import Tracker

    work = Path(tempfile.mkdtemp(prefix="roll-faults-"))
    model = _common.model_path("tiny")
    env = (f"{{inner: sokoban, raise_rate: {args.raise_rate}, hang_rate: {args.hang_rate}, hang_s: 3600, "
           "inner_config: {dim_room: [6, 6], num_boxes: 1, max_steps: 3, format_penalty: -0.1}}")
    cfg = load_config("agentic_sokoban", overrides=[
        f"pretrain={model}", f"output_dir={work}/out", f"logging_dir={work}/logs", "render_save_dir=null",
        f"max_steps={args.steps}", "save_steps=0", "eval_steps=0", "track_with=stdout", "num_demonstrations=0",
        "rollout_batch_size=8", "train_env_manager.num_env_groups=2", "train_env_manager.group_size=4",
        "+custom_envs.Faulty.env_type=faulty", "+custom_envs.Faulty.max_steps=3", "+custom_envs.Faulty.max_tokens_per_step=8",
        f"+custom_envs.Faulty.env_config={env}", "train_env_manager.tags=[Faulty]",
        f"train_env_manager.env_step_timeout={args.env_step_timeout}", "train_env_manager.max_env_retries=3",
        "train_env_manager.group_size_redundancy=2",
        "actor_infer.model_args.dtype=fp32", "actor_train.training_args.bf16=false",
        "actor_train.training_args.per_device_train_batch_size=4", "actor_train.training_args.gradient_accumulation_steps=2",
    ]).config
    totals = {"steps": 0, "env_errors": 0.0, "episodes_trained": 0.0, "redundant_left_out": 0.0, "incomplete_groups": 0.0}

    class Count(Tracker):
        def log(self, m: dict[str, float], step: int) -> None:
            totals["steps"] += 1
            totals["env_errors"] += m.get("rollout/env_errors", 0.0)
            totals["episodes_trained"] += m.get("rollout/trajectories", 0.0)
            totals["redundant_left_out"] += m.get("rollout/redundant_left_out", 0.0)
            totals["incomplete_groups"] += m.get("rollout/groups_incomplete", 0.0)

    wall = _common.run_pipeline(cfg, lambda _: Count())
    print(f"faults bench: {totals['steps']} of {args.steps} steps completed in {wall:.0f} s "
          f"(env raising on {args.raise_rate:.0%} of steps, hanging on {args.hang_rate:.0%}, env_step_timeout {args.env_step_timeout} s)")
    print(f"  episodes trained on       {totals['episodes_trained']:.0f}")
    print(f"  lost episode attempts     {totals['env_errors']:.0f}  (each raised or hung; counted in rollout/env_errors)")
    print(f"  redundant episodes unused {totals['redundant_left_out']:.0f}")
    print(f"  partial groups used       {totals['incomplete_groups']:.0f}")


if __name__ == "__main__":
    main()
