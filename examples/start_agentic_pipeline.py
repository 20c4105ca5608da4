"""Start an agentic RL run.

    python examples/start_agentic_pipeline.py --config_name agentic_sokoban
    python examples/start_agentic_pipeline.py --config_path examples/config \
        --config_name agentic_sokoban_vllm_deepspeed max_steps=200 seed=7
"""

import sys
from pathlib import Path

from roll.cli import main

if __name__ == "__main__":
    # ROLL-style --config_path values (relative to examples/) also resolve.
    sys.exit(main(search_roots=[Path(__file__).resolve().parent]))
