"""The learning curve of a config (default: the embedded CPU default) with two baselines on the same seeds.

Runs the config for N steps (or reads a finished run's TensorBoard folder with --from_tensorboard) and
writes, per step, the mean episode score, success rate and valid-action rate of the training rollouts
and of validation (a fixed seed set, greedy) as JSON and a PNG. Beside them, on exactly the episodes the
run played: a policy that picks a uniformly random move each turn (every reply valid) and the solver's
optimal policy (the env's expert). On a GEM env the random policy is GEM's own random action (a valid
reply drawn by the env, e.g. a random number in \boxed{} for GuessTheNumber); GEM's envs have no expert,
so there is no solver line.

    .venv/bin/python scripts/bench/learning.py --steps 20 --out docs/learning_curve.png [key=value ...]
    .venv/bin/python scripts/bench/learning.py --from_tensorboard output/agentic_sokoban/tensorboard
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import _common  # (also puts the repo on sys.path)

CURVES = ("score", "success", "valid")
RANDOM_PLAYS = 16


def rollout_curves(metrics: dict[str, float], prefix: str, tag: str) -> dict[str, float]:
    return {"score": metrics.get(f"{prefix}/score", float("nan")),
            "success": metrics.get(f"{prefix}/success", float("nan")),
            "valid": metrics.get(f"{prefix}/{tag}/action_is_valid", float("nan"))}


def play(entry: dict[str, Any], seed: int, policy: str, rng: random.Random) -> dict[str, float]:
    """One episode of ``policy`` ('random' or 'solver') on the env ``entry`` with ``seed``."""
    from envs.registration import make_env

    env = make_env(entry["env_type"], entry.get("entry_point"), **entry["env_config"])
    env.reset(seed=seed)
    total, valid, turns, success = 0.0, 0, 0, 0.0
    for _ in range(int(entry.get("max_steps", 10))):
        if hasattr(env, "random_action"):  # a GEM env: its own random valid reply
            reply = env.random_action(rng.randrange(2**31))
        else:
            action = rng.choice(list(env.action_vocabulary())) if policy == "random" else env.expert_action()
            reply = env.answer_text(action)
        _, reward, terminated, truncated, info = env.step(reply)
        total += reward
        turns += 1
        valid += int(info["metrics"]["action_is_valid"])
        success = info["metrics"]["success"]
        if terminated or truncated:
            break
    return {"score": total, "success": success, "valid": valid / max(turns, 1)}


def has_solver(cfg: Any) -> bool:
    from envs.gem_adapter import is_gem_id

    entry = cfg.custom_envs[cfg.train_env_manager.tags[0]]
    return not (entry.entry_point is None and is_gem_id(entry.env_type))


def baselines(cfg: Any, steps: list[int]) -> dict[str, dict[str, dict[str, float]]]:
    """policy -> {'train': mean over the training episodes of ``steps``, 'val': mean over the val seeds}."""
    from roll.agentic.rollout import build_slots, episode_requests

    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy in ("random", "solver") if has_solver(cfg) else ("random",):
        rng = random.Random(cfg.seed)
        out[policy] = {}
        for mode, em, fixed in (("train", cfg.train_env_manager, False), ("val", cfg.val_env_manager, True)):
            slots = build_slots(cfg.custom_envs, em, cfg.seed)
            name = "rollout" if mode == "train" else "val"
            episodes = []
            for step in steps if mode == "train" else [0]:
                seen: set[tuple[int, int]] = set()
                for r in episode_requests(slots, em.max_traj_per_env, cfg.seed, name, step, fixed):
                    if policy == "solver" and (r.seed, r.slot.group_id) in seen:
                        continue  # the solver plays a group's shared level the same way every time
                    seen.add((r.seed, r.slot.group_id))
                    # random play: its expectation on each episode (mean of RANDOM_PLAYS games), not one draw
                    for _ in range(RANDOM_PLAYS if policy == "random" else 1):
                        episodes.append(play(r.slot.entry, r.seed, policy, rng))
            out[policy][mode] = {k: sum(e[k] for e in episodes) / len(episodes) for k in CURVES}
    return out


def from_tensorboard(folder: str, tag: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {k: {e.step: e.value for e in acc.Scalars(k)} for k in acc.Tags()["scalars"]}
    steps = sorted(scalars.get("rollout/score", {}))
    train = [{"step": s, **rollout_curves({k: v[s] for k, v in scalars.items() if s in v}, "rollout", tag)} for s in steps]
    val_steps = sorted(scalars.get("val/score", {}))
    val = [{"step": s, **rollout_curves({k: v[s] for k, v in scalars.items() if s in v}, "val", tag)} for s in val_steps]
    return train, val


def plot(path: Path, title: str, train: list[dict], val: list[dict], base: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'roll[plot]'): only the JSON is written")
        return False
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    labels = {"score": "mean episode score", "success": "success rate", "valid": "valid-action rate"}
    for ax, key in zip(axes, CURVES):
        ax.plot([h["step"] for h in train], [h[key] for h in train], marker="o", ms=3, label="policy (training episodes)")
        if val:
            ax.plot([h["step"] for h in val], [h[key] for h in val], marker="s", ms=4, label="policy (validation, greedy)")
        for policy, style in (("random", ":"), ("solver", "--")):
            if policy not in base:
                continue
            ax.axhline(base[policy]["train"][key], ls=style, color="gray" if policy == "random" else "green",
                       label=f"{policy} moves (same episodes)")
        ax.set(title=labels[key], xlabel="step")
        if key != "score":
            ax.set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config_name", default="agentic_sokoban")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval_every", type=int, default=5)
    p.add_argument("--from_tensorboard", default=None, help="plot a finished run of --config_name instead of running one")
    p.add_argument("--out", default="output/learning_curve.png")
    p.add_argument("--wall_min", type=float, default=None, help="with --from_tensorboard: the run's wall time, for the title")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from roll.configs.loading import load_config

    overrides = list(args.overrides)
    if args.from_tensorboard is None:
        overrides = [f"max_steps={args.steps}", f"eval_steps={args.eval_every}", "save_steps=0", *overrides]
    cfg = load_config(args.config_name, overrides=overrides).config
    tag = cfg.train_env_manager.tags[0]
    if args.from_tensorboard is not None:
        train, val = from_tensorboard(args.from_tensorboard, tag)
        wall = args.wall_min * 60 if args.wall_min else None
    else:
        train, val = [], []

        class Recorder:  # keeps the curves and still logs to the config's tracker
            def __init__(self, real: Any) -> None:
                self.real = real

            def log(self, m: dict[str, float], step: int) -> None:
                train.append({"step": step, **rollout_curves(m, "rollout", tag)})
                if "val/score" in m:
                    val.append({"step": step, **rollout_curves(m, "val", tag)})
                print(json.dumps({"step": step, "train": train[-1], "val": val[-1] if val and val[-1]["step"] == step else None}), flush=True)
                self.real.log(m, step)

            def log_episode(self, *a: Any) -> None:
                self.real.log_episode(*a)

            def close(self) -> None:
                self.real.close()

        wall = _common.run_pipeline(cfg, Recorder)
    base = baselines(cfg, [h["step"] for h in train])
    # one step is 2-4 levels: "at the end" is also read over the last quarter of the steps (at least 4), against
    # the baselines on exactly those steps' episodes
    window = train[-max(4, len(train) // 4):]
    end = {k: sum(h[k] for h in window) / len(window) for k in CURVES} if window else {}
    end_base = baselines(cfg, [h["step"] for h in window]) if window else {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    first, last = (train[0], train[-1]) if train else ({}, {})
    summary = {"config": args.config_name, "steps": len(train), "wall_s": wall, "train": train, "val": val,
               "baselines": base, "first_step": first, "last_step": last,
               "end_window": {"steps": [h["step"] for h in window], "policy": end,
                              "baselines": {p: end_base[p]["train"] for p in end_base}}}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"{args.config_name}: {len(train)} steps" + (f" in {wall / 60:.1f} min" if wall else ""))
    for key in CURVES:
        if train:
            solver = f"  solver {base['solver']['train'][key]:7.3f}" if "solver" in base else ""
            print(f"  {key:8s} first step {first[key]:7.3f}  last step {last[key]:7.3f}   random {base['random']['train'][key]:7.3f}"
                  + solver)
    if window:
        solver = f"  solver {end_base['solver']['train']['success']:.3f}" if "solver" in end_base else ""
        print(f"  last {len(window)} steps ({window[0]['step']}-{window[-1]['step']}): success {end['success']:.3f}  "
              f"random {end_base['random']['train']['success']:.3f}{solver};"
              f"  valid {end['valid']:.3f}; score {end['score']:.3f}  random {end_base['random']['train']['score']:.3f}")
    if val:
        solver = f"  solver {base['solver']['val']['success']:.3f}" if "solver" in base else ""
        print(f"  validation (fixed seeds): success {val[0]['success']:.3f} -> {val[-1]['success']:.3f}, "
              f"valid {val[0]['valid']:.3f} -> {val[-1]['valid']:.3f}   random {base['random']['val']['success']:.3f}" + solver)
    title = f"{args.config_name}: {Path(str(cfg.pretrain)).name}" + (f", {wall / 60:.0f} min on this machine" if wall else "")
    if plot(out, title, train, val, base):
        print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
