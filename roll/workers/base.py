"""What every role worker has: process-group set-up, its strategy, memory, health."""

from __future__ import annotations

import gc
import os
import socket
import time
from typing import Any

from roll.strategies.base import StrategyContext
from roll.strategies.registry import default_registry


class RoleWorker:
    def __init__(self, role: str, rank: int, world_size: int, worker_config: Any, settings: dict[str, Any]) -> None:
        self.role, self.rank, self.world_size = role, rank, world_size
        self.config = worker_config
        self.settings = settings
        self.strategy: Any = None
        import torch

        # Ray gives fractional-CPU actors OMP_NUM_THREADS=1; the Cluster sets the variable for this worker
        # (every thread's pool starts from it) and this covers the constructing thread.
        torch.set_num_threads(max(1, int(settings.get("threads_per_worker") or (os.cpu_count() or 1))))

    def master_address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return socket.gethostbyname(socket.gethostname()), port

    def setup_distributed(self, addr: str, port: int) -> None:
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")

    def context(self) -> StrategyContext:
        s = self.settings
        return StrategyContext(role=self.role, rank=self.rank, world_size=self.world_size, seed=s.get("seed", 42),
                               max_grad_norm=s.get("max_grad_norm", 1.0),
                               train_calls=s.get("train_calls", {}).get(self.role, 1000),
                               colocated=self.role in s.get("colocated_roles", ()),
                               max_sequence_length=s.get("sequence_length"), lora_rank=s.get("lora_rank"))

    def initialize(self) -> None:
        cls = default_registry().resolve(self.config.strategy_args.strategy_name, self.role)
        self.strategy = cls(self.config, self.context())
        self.strategy.initialize()

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """(data-parallel rank, data-parallel size, whether this rank's results are kept): every rank
        is its own replica unless the strategy says otherwise (megatron model parallelism)."""
        info = getattr(self.strategy, "data_parallel_info", None)
        return info() if info is not None else (self.rank, self.world_size, True)

    def release(self) -> None:
        """Free what outlives the process (shared-memory buffers) before the actor is killed; atexit hooks do not
        run when Ray kills an actor."""

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def ping(self, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        return self.rank

    def offload(self) -> dict[str, float]:
        self.strategy.offload()
        return self.memory()

    def reload(self) -> dict[str, float]:
        self.strategy.reload()
        return self.memory()

    def memory(self) -> dict[str, float]:
        """Resident memory of this process (and GPU memory where there is one), in GiB."""
        import resource

        import torch

        gc.collect()
        out = {f"memory/{self.role}_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
        if torch.cuda.is_available():
            out[f"memory/{self.role}_gpu_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
        return out
