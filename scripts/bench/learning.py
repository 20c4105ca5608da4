"""The learning curve of a config (default: the embedded CPU default) with two baselines on the same seeds.

Runs the config for N steps (or reads a finished run's TensorBoard folder with --from_tensorboard) and
writes, per step, the mean episode score, success rate and valid-action rate of the training rollouts
and of validation (a fixed level set, greedy; its success with the 95% Wilson interval the run logged, drawn
as a band) as JSON and a PNG. Beside them, on exactly the episodes the run played: a policy that picks a
uniformly random move each turn (every reply valid) and the solver's optimal policy (the env's expert). For
validation these are the baselines the pipeline itself logged on its validation levels at the first step
(``val/baseline_<policy>_success`` and its interval); for the training episodes they are played here. On a GEM env the random policy is GEM's own random action (a valid
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


def rollout_curves(metrics: dict[str, float], prefix: str, tag: str) -> dict[str, Any]:
    out: dict[str, Any] = {"score": metrics.get(f"{prefix}/score", float("nan")),
                           "success": metrics.get(f"{prefix}/success", float("nan")),
                           "valid": metrics.get(f"{prefix}/{tag}/action_is_valid", float("nan"))}
    if f"{prefix}/success_ci_low" in metrics:
        out["ci"] = [metrics[f"{prefix}/success_ci_low"], metrics[f"{prefix}/success_ci_high"]]
    return out


def val_baselines(metrics: dict[str, float]) -> dict[str, dict[str, Any]]:
    """policy -> {'success', 'ci'} from the validation baselines the pipeline logged."""
    out = {}
    for policy in ("random", "solver"):
        key = f"val/baseline_{policy}_success"
        if key in metrics:
            out[policy] = {"success": metrics[key], "ci": [metrics[f"{key}_ci_low"], metrics[f"{key}_ci_high"]]}
    return out


def apart(val: list[dict[str, Any]], base: dict[str, dict[str, Any]]) -> str | None:
    """Whether the last eval's interval clears random's (on the same levels), in words."""
    if not val or "ci" not in val[-1] or "random" not in base:
        return None
    (low, high), (r_low, r_high) = val[-1]["ci"], base["random"]["ci"]
    gap = 100 * (val[-1]["success"] - base["random"]["success"])
    if low > r_high:
        return f"{gap:+.1f} points above random, intervals apart"
    if high < r_low:
        return f"{gap:+.1f} points below random, intervals apart"
    return f"{gap:+.1f} points against random, intervals overlapping: not told apart"


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


def baselines(cfg: Any, steps: list[int]) -> dict[str, dict[str, float]]:
    """policy -> means over the training episodes of ``steps`` (validation's come from the run's own log)."""
    from roll.agentic.rollout import build_slots, episode_requests

    out: dict[str, dict[str, float]] = {}
    em = cfg.train_env_manager
    slots = build_slots(cfg.custom_envs, em, cfg.seed)
    for policy in ("random", "solver") if has_solver(cfg) else ("random",):
        rng = random.Random(cfg.seed)
        episodes = []
        for step in steps:
            seen: set[tuple[int, int]] = set()
            for r in episode_requests(slots, em.max_traj_per_env, cfg.seed, "rollout", step, False):
                if policy == "solver" and (r.seed, r.slot.group_id) in seen:
                    continue  # the solver plays a group's shared level the same way every time
                seen.add((r.seed, r.slot.group_id))
                # random play: its expectation on each episode (mean of RANDOM_PLAYS games), not one draw
                for _ in range(RANDOM_PLAYS if policy == "random" else 1):
                    episodes.append(play(r.slot.entry, r.seed, policy, rng))
        out[policy] = {k: sum(e[k] for e in episodes) / len(episodes) for k in CURVES}
    return out


def from_tensorboard(folder: str, tag: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {k: {e.step: e.value for e in acc.Scalars(k)} for k in acc.Tags()["scalars"]}
    steps = sorted(scalars.get("rollout/score", {}))
    train = [{"step": s, **rollout_curves({k: v[s] for k, v in scalars.items() if s in v}, "rollout", tag)} for s in steps]
    val_steps = sorted(scalars.get("val/score", {}))
    val = [{"step": s, **rollout_curves({k: v[s] for k, v in scalars.items() if s in v}, "val", tag)} for s in val_steps]
    logged_once = {k: v[min(v)] for k, v in scalars.items() if k.startswith("val/baseline_")}
    return train, val, val_baselines(logged_once)


def plot(path: Path, title: str, train: list[dict], val: list[dict], base: dict, vbase: dict) -> bool:
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
            steps = [h["step"] for h in val]
            ax.plot(steps, [h[key] for h in val], marker="s", ms=4, color="C1", label="policy (validation, greedy)")
            if key == "success" and all("ci" in h for h in val):
                ax.fill_between(steps, [h["ci"][0] for h in val], [h["ci"][1] for h in val], color="C1", alpha=0.2,
                                label="validation 95% interval")
        for policy, style in (("random", ":"), ("solver", "--")):
            color = "gray" if policy == "random" else "green"
            if policy in base:
                ax.axhline(base[policy][key], ls=style, color=color, lw=1, label=f"{policy} moves (training episodes)")
            if key == "success" and policy in vbase:
                low, high = vbase[policy]["ci"]
                ax.axhline(vbase[policy]["success"], ls=style, color=color, lw=2,
                           label=f"{policy} moves (validation levels)")
                ax.axhspan(low, high, color=color, alpha=0.08)
        ax.set(title=labels[key], xlabel="step")
        if key != "score":
            ax.set_ylim(-0.05, 1.05)
    axes[1].legend(fontsize=7, loc="upper right")  # the success panel has every line
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config_name", default="agentic_sokoban")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval_every", type=int, default=None, help="eval_steps: validation at the steps it divides (unset: the first and the last step; a divisor of --steps minus 1 keeps the last)")
    p.add_argument("--from_tensorboard", default=None, help="plot a finished run of --config_name instead of running one")
    p.add_argument("--out", default="output/learning_curve.png")
    p.add_argument("--wall_min", type=float, default=None, help="with --from_tensorboard: the run's wall time, for the title")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from roll.configs.loading import load_config

    overrides = list(args.overrides)
    if args.from_tensorboard is None:
        every = args.eval_every or max(args.steps - 1, 1)
        overrides = [f"max_steps={args.steps}", f"eval_steps={every}", "save_steps=0", *overrides]
    cfg = load_config(args.config_name, overrides=overrides).config
    tag = cfg.train_env_manager.tags[0]
    if args.from_tensorboard is not None:
        train, val, vbase = from_tensorboard(args.from_tensorboard, tag)
        wall = args.wall_min * 60 if args.wall_min else None
    else:
        train, val, vbase = [], [], {}

        class Recorder:  # keeps the curves and still logs to the config's tracker
            def __init__(self, real: Any) -> None:
                self.real = real

            def log(self, m: dict[str, float], step: int) -> None:
                train.append({"step": step, **rollout_curves(m, "rollout", tag)})
                if "val/score" in m:
                    val.append({"step": step, **rollout_curves(m, "val", tag)})
                vbase.update(val_baselines(m))
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
               "baselines": base, "val_baselines": vbase, "val_apart": apart(val, vbase),
               "first_step": first, "last_step": last,
               "end_window": {"steps": [h["step"] for h in window], "policy": end,
                              "baselines": end_base}}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"{args.config_name}: {len(train)} steps" + (f" in {wall / 60:.1f} min" if wall else ""))
    for key in CURVES:
        if train:
            solver = f"  solver {base['solver'][key]:7.3f}" if "solver" in base else ""
            print(f"  {key:8s} first step {first[key]:7.3f}  last step {last[key]:7.3f}   random {base['random'][key]:7.3f}"
                  + solver)
    if window:
        solver = f"  solver {end_base['solver']['success']:.3f}" if "solver" in end_base else ""
        print(f"  last {len(window)} steps ({window[0]['step']}-{window[-1]['step']}): success {end['success']:.3f}  "
              f"random {end_base['random']['success']:.3f}{solver};"
              f"  valid {end['valid']:.3f}; score {end['score']:.3f}  random {end_base['random']['score']:.3f}")
    def with_ci(h: dict[str, Any]) -> str:
        return f"{h['success']:.3f}" + (f" [{h['ci'][0]:.3f}, {h['ci'][1]:.3f}]" if "ci" in h else "")

    if val:
        print(f"  validation ({cfg.val_batch_size} fixed levels, greedy): success {with_ci(val[0])} at step {val[0]['step']} -> "
              f"{with_ci(val[-1])} at step {val[-1]['step']}, valid {val[0]['valid']:.3f} -> {val[-1]['valid']:.3f}")
        for policy in vbase:
            print(f"    {policy} moves on the same levels: {with_ci(vbase[policy])}")
        verdict = apart(val, vbase)
        if verdict:
            print(f"    last eval: {verdict}")
    title = f"{args.config_name}: {Path(str(cfg.pretrain)).name}" + (f", {wall / 60:.0f} min on this machine" if wall else "")
    if plot(out, title, train, val, base, vbase):
        print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
