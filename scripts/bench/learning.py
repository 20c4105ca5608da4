"""SmolLM2 (or any config) for N steps: success rate and reward per step, plotted to a PNG.

    .venv/bin/python scripts/bench/learning.py --steps 20 --out output/learning.png [key=value ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _common  # noqa: F401


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config_name", default="agentic_sokoban")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default="output/learning.png")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from roll.agentic.pipeline import AgenticPipeline
    from roll.configs.loading import load_config

    cfg = load_config(args.config_name, overrides=[f"max_steps={args.steps}", "eval_steps=0", "save_steps=0",
                                                    "track_with=stdout", *args.overrides]).config
    pipeline = AgenticPipeline(cfg)
    history: list[dict[str, float]] = []

    class Keep:
        def log(self, m, step):
            history.append({"step": step, "score": m.get("rollout/score", 0.0), "success": m.get("rollout/success", 0.0),
                            "valid": m.get(f"rollout/{cfg.train_env_manager.tags[0]}/action_is_valid", 0.0)})
            print(json.dumps(history[-1]), flush=True)

        def close(self):
            pass

    pipeline.tracker = Keep()
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.with_suffix(".json")).write_text(json.dumps(history, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'roll[plot]'); the curve is in {out.with_suffix('.json')}")
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    steps = [h["step"] for h in history]
    ax[0].plot(steps, [h["score"] for h in history], marker="o")
    ax[0].set(title="mean episode reward", xlabel="step")
    ax[1].plot(steps, [h["success"] for h in history], marker="o", label="success")
    ax[1].plot(steps, [h["valid"] for h in history], marker="x", label="valid actions")
    ax[1].set(title="rates", xlabel="step", ylim=(-0.05, 1.05))
    ax[1].legend()
    fig.suptitle(f"{args.config_name}: {cfg.actor_train.model_args.model_name_or_path}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
