"""Play a config's training envs with its policy (actor_infer) and keep the rollouts; train nothing.

    python examples/start_agentic_rollout_pipeline.py --config_path qwen2.5-0.5B-agentic \
        --config_name agentic_rollout_sokoban rollout_dump_dir=./output/rollouts

Each step plays rollout_batch_size episodes; metrics go to the tracker, rows to rollout_dump_dir.
"""

import sys
from pathlib import Path

from roll.cli import main

if __name__ == "__main__":
    sys.exit(main(search_roots=[Path(__file__).resolve().parent], rollout_only=True))
