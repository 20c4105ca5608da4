"""Command line of ``examples/start_agentic_pipeline.py``: load, validate, print, then run."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from roll.configs.errors import ConfigError

EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def parse_args(argv: Sequence[str], rollout_only: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="start_agentic_rollout_pipeline.py" if rollout_only else "start_agentic_pipeline.py",
        description="Play gym-style text environments with an LLM policy and keep the rollouts (no training)."
        if rollout_only else "Train an LLM policy with RL on gym-style text environments.",
        epilog="Trailing key=value arguments are Hydra overrides, e.g. max_steps=3 actor_train.training_args.learning_rate=1e-5",
    )
    parser.add_argument("--config_path", default=None, help="config folder, relative to the working directory (default: examples/config)")
    parser.add_argument("--config_name", default="agentic_sokoban", help="config file name without .yaml")
    parser.add_argument("--dry_run", action="store_true", help="load, validate and print the resolved config, then exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value")
    return parser.parse_args(argv)


def config_to_yaml(config: object) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(dataclasses.asdict(config)))


def main(argv: Sequence[str] | None = None, *, search_roots: Sequence[Path] = (), rollout_only: bool = False) -> int:
    """Load, check and print a config, then train on it (``rollout_only``: play its envs, train nothing)."""
    args = parse_args(sys.argv[1:] if argv is None else argv, rollout_only)
    from roll.configs.loading import load_config
    from roll.preflight import check_inputs

    try:
        loaded = load_config(args.config_name, args.config_path, args.overrides, search_roots=search_roots,
                             rollout_only=rollout_only)
        if args.dry_run:  # a real run checks the same in the pipeline's preflight, before Ray starts
            check_inputs(loaded.config, rollout_only)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    warning = loaded.warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"# resolved config: {loaded.config_dir / loaded.config_name}.yaml", flush=True)
    print(config_to_yaml(loaded.config), flush=True)
    if args.dry_run:
        return 0
    from roll.agentic.env_managers.base import EpisodeCrash
    from roll.agentic.rollout import RolloutFailure
    from roll.distributed.cluster import RpcTimeoutError, WorkerDiedError, last_line
    from roll.distributed.launch import LaunchError
    from roll.utils.checkpoint import CheckpointError

    try:
        return launch_and_train(loaded.config, rollout_only)
    except LaunchError as e:  # a node that cannot start or join: one line naming the address
        print(f"launch error: {e}", file=sys.stderr)
        return 1
    except (WorkerDiedError, RpcTimeoutError) as e:  # a role worker (or its node) lost mid-run
        print(f"worker error: {e}", file=sys.stderr)
        return 1
    except CheckpointError as e:  # a checkpoint that does not load although it matches its manifest
        print(f"checkpoint error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the workers are stopped, no unfinished checkpoint is left
        print(f"interrupted: stopped at Ctrl-C; complete checkpoints stay in {loaded.config.output_dir}/checkpoints",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # a full disk, a folder that became unwritable (here or in a worker)
        text = last_line(e)
        print(f"system error: {text if ':' in text else f'{type(e).__name__}: {text}'}", file=sys.stderr)
        return 1
    except ConfigError as e:  # found at start-up, before any worker ran (e.g. a GPU backend without a GPU)
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except (RolloutFailure, EpisodeCrash) as e:  # no data to train on, or a failure outside the envs: one line
        print(f"rollout error: {e}", file=sys.stderr)
        return 1


def launch_and_train(config: object, rollout_only: bool = False) -> int:
    """Train here, or under ROLL's multi-node launch contract (WORLD_SIZE > 1): rank 0 drives the run on the
    Ray head, the other ranks join it and wait (``roll.distributed.launch``)."""
    import logging
    import os

    from roll.configs.schema import ROLES
    from roll.distributed.launch import LaunchEnv, check_auth, check_nodes_enough, head_node, run_worker_node

    env = LaunchEnv.from_environ(os.environ)
    if env is None:
        return train(config, rollout_only)
    import torch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("roll").setLevel(logging.INFO)
    check_auth(os.environ)
    mappings = {r: getattr(config, r).device_mapping for r in ROLES
                if getattr(config, r, None) is not None and isinstance(getattr(config, r).device_mapping, list)}
    check_nodes_enough(mappings, config.num_gpus_per_node, env.world_size)
    use_gpu = torch.cuda.is_available()
    if env.rank > 0:
        return run_worker_node(env, config.num_gpus_per_node, use_gpu, config.node_join_timeout)
    with head_node(env, config.num_gpus_per_node, use_gpu, config.node_join_timeout):
        return train(config, rollout_only)


def train(config: object, rollout_only: bool = False) -> int:
    """Run the pipeline (or the rollout-only one) on a loaded config; say where the outputs are."""
    import logging

    from roll.agentic.pipeline import AgenticPipeline
    from roll.agentic.rollout_pipeline import AgenticRolloutPipeline

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("roll").setLevel(logging.INFO)
    pipeline = (AgenticRolloutPipeline if rollout_only else AgenticPipeline)(config)
    try:
        final = pipeline.run()
    finally:
        pipeline.shutdown()
    score = {k: round(v, 4) for k, v in final.items() if k in ("rollout/score", "rollout/success", "time/step")}
    print(f"roll: finished {config.max_steps} steps; last step {score}", flush=True)
    saved = f"rollout rows in {config.rollout_dump_dir}" if rollout_only else f"checkpoints in {config.output_dir}/checkpoints"
    print(f"roll: metrics in {config.tracker_kwargs.get('log_dir') or config.logging_dir} ({config.track_with}); "
          f"{saved}; rendered trajectories in {config.render_save_dir}", flush=True)
    return 0
