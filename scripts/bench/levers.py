"""One lever at a time against the default, on the same seeds: does it make the 135M policy beat random moves?

Each lever is a set of overrides on the embedded CPU default (``agentic_sokoban``), run for the same number of
steps with validation (64 fixed levels, greedy) at the first, middle and last step. The table, read from each
run's TensorBoard folder, gives the validation success at the first and last eval with its 95% Wilson
interval, random moves on exactly those levels (logged by the run), whether the intervals are apart, training
success over the last quarter, the share of moves that moved, the median step time and the share of the run's
time validation cost (the extra time of the steps that ran it, over the median of those that did not).

    .venv/bin/python scripts/bench/levers.py                        # every lever, one after another
    .venv/bin/python scripts/bench/levers.py --only base group8      # some of them
    .venv/bin/python scripts/bench/levers.py --table_only            # the table of runs already under --root
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

COMMON = ["max_steps=21", "eval_steps=10", "save_steps=0"]
LEVERS: dict[str, list[str]] = {
    "base": [],
    # DAPO's asymmetric clip; with ppo_epochs 1 the ratio is 1 at the only update, so two epochs let it act
    "clip_higher": ["ppo_epochs=2", "use_pg_clip_range=true", "pg_clip_low=0.2", "pg_clip_high=0.28"],
    # step-wise credit: GiGPO on the step manager (one training row per turn)
    "gigpo": ["adv_estimator=gigpo", "env_manager_cls=roll.agentic.env_managers.step.StepEnvManager"],
    # larger groups: 1 group of 8 episodes per level instead of 2 x 4
    "group8": ["train_env_manager.num_env_groups=1", "train_env_manager.group_size=8",
               "train_env_manager.num_groups_partition=[1]"],
    # LoRA at a larger learning rate
    "lora": ["actor_train.model_args.lora_target=all-linear", "actor_train.model_args.lora_rank=32",
             "actor_train.model_args.lora_alpha=32", "actor_train.training_args.learning_rate=2e-4"],
    # a KL anchor to the starting policy
    "kl": ["use_kl_loss=true", "kl_loss_coef=0.05", "+reference.device_mapping=[0]",
           "+reference.strategy_args.strategy_name=hf_infer", "+reference.model_args.dtype=bf16"],
    # every move shown in the opening examples, drawn from each episode's seed (one fixed set ends every
    # conversation with the same answer, which the 135M policy then repeats)
    "examples_per_episode": ["num_demonstrations=4", "demonstrations_per_episode=true"],
    # a space between a board row's cells, so that each cell is one token (SmolLM2 merges runs of cells)
    "cell_separator": ["grid_cell_separator=' '"],
    # a line under each board with the (row, column) of the player and the key cells, so no counting is needed
    "describe_positions": ["grid_describe_positions=true"],
    # ROLL's board: without the default's line saying how far the key cells lie from the player
    "no_offsets": ["grid_describe_offsets=false"],
    # the second env: FrozenLake (its random baseline is low)
    "frozen_lake": ["--config_name", "agentic_frozen_lake"],
}


def run(name: str, root: Path, extra: list[str]) -> float:
    overrides = list(LEVERS[name])
    config = ["--config_name", "agentic_sokoban"]
    if overrides[:1] == ["--config_name"]:
        config, overrides = overrides[:2], overrides[2:]
    out = root / name
    cmd = [sys.executable, "examples/start_agentic_pipeline.py", *config, *COMMON, f"output_dir={out}",
           f"exp_name=levers_{name}", *overrides, *extra]
    print(f"[levers] {name}: {' '.join(cmd[2:])}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, cwd=Path(__file__).resolve().parents[2])
    wall = time.perf_counter() - start
    print(f"[levers] {name}: exit {code} after {wall / 60:.1f} min", flush=True)
    return wall


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {k: {e.step: e.value for e in acc.Scalars(k)} for k in acc.Tags()["scalars"]}


def row(name: str, s: dict[str, dict[int, float]]) -> dict[str, Any]:
    steps = sorted(s.get("rollout/success", {}))
    evals = sorted(s.get("val/success", {}))
    if not steps:
        return {"lever": name, "steps": 0}

    def val(step: int) -> str:
        return f"{s['val/success'][step]:.3f} [{s['val/success_ci_low'][step]:.3f}, {s['val/success_ci_high'][step]:.3f}]"

    rand = {k: next(iter(s[f"val/baseline_random_success{k}"].values()), float("nan")) for k in ("", "_ci_low", "_ci_high")}
    last = evals[-1] if evals else None
    effective = next((k for k in s if k.startswith("rollout/") and k.endswith("/action_is_effective")), None)
    quarter = steps[-max(1, len(steps) // 4):]
    times = s.get("time/step", {})
    plain = [t for k, t in times.items() if k not in evals]
    median = statistics.median(plain) if plain else float("nan")
    extra = sum(max(times[k] - median, 0.0) for k in evals if k in times)
    out = {"lever": name, "steps": len(steps),
           "val first": val(evals[0]) if evals else "-", "val last": f"{val(last)} (step {last})" if evals else "-",
           "random": f"{rand['']:.3f} [{rand['_ci_low']:.3f}, {rand['_ci_high']:.3f}]",
           "gap": f"{100 * (s['val/success'][last] - rand['']):+.1f}" if evals else "-",
           "apart": "yes" if evals and (s["val/success_ci_low"][last] > rand["_ci_high"]
                                        or s["val/success_ci_high"][last] < rand["_ci_low"]) else "no",
           "train success, last quarter": f"{statistics.mean(s['rollout/success'][k] for k in quarter):.3f}",
           "effective moves": (f"{s[effective][steps[0]]:.2f} -> {s[effective][steps[-1]]:.2f}" if effective else "-"),
           "median step": f"{median:.0f} s",
           "eval share": f"{100 * extra / max(sum(times.values()), 1e-9):.0f}%"}
    return out


def table(root: Path, names: list[str]) -> None:
    rows = []
    for name in names:
        folder = root / name / "tensorboard"
        if folder.is_dir():
            rows.append(row(name, scalars(folder)))
    if not rows:
        print(f"no runs under {root}")
        return
    keys = list(max(rows, key=len))
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "-")) for k in keys) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=sorted(LEVERS), default=None)
    p.add_argument("--root", default="output/levers")
    p.add_argument("--table_only", action="store_true")
    p.add_argument("overrides", nargs="*", help="added to every run (e.g. seed=7)")
    args = p.parse_args()
    names = args.only or list(LEVERS)
    root = Path(args.root).resolve()
    if not args.table_only:
        for name in names:
            run(name, root, args.overrides)
    table(root, names)


if __name__ == "__main__":
    main()
