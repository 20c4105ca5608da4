"""A Cluster: one role's Ray actors, called by the driver as one object (single controller).

``call`` runs a method on every rank with the same arguments; ``dispatch`` splits a Batch over
the data-parallel ranks (balanced by tokens, equal row counts: shorter parts are padded with rows of
zero loss weight) and gathers the result back in row order. Every
call is bounded by ``rpc_timeout``; a dead worker or a timeout raises an error naming the role,
the rank and the method.
"""

from __future__ import annotations

import logging
from typing import Any

from roll.distributed.batch import Batch
from roll.distributed.resources import ResourceManager

log = logging.getLogger(__name__)


STARTUP_TIMEOUT = 600.0  # starting a worker process (imports, Ray scheduling), separate from rpc_timeout


def plan_dispatch(layout: list[tuple[int, int, bool]]) -> tuple[int, list[int]]:
    """From each rank's (data-parallel rank, data-parallel size, answers): the data-parallel size
    and, per data-parallel rank in order, the worker rank whose result is kept."""
    sizes = {size for _, size, _ in layout}
    if len(sizes) != 1:
        raise RuntimeError(f"ranks disagree on the data-parallel size: {sorted(sizes)}")
    (dp_size,) = sizes
    collectors: dict[int, int] = {}
    for rank, (dp_rank, _, answers) in enumerate(layout):
        if answers:
            if dp_rank in collectors:
                raise RuntimeError(f"data-parallel rank {dp_rank} has two answering ranks: {collectors[dp_rank]}, {rank}")
            collectors[dp_rank] = rank
    if sorted(collectors) != list(range(dp_size)):
        raise RuntimeError(f"data-parallel ranks without an answering rank: {sorted(set(range(dp_size)) - set(collectors))}")
    return dp_size, [collectors[d] for d in range(dp_size)]


def last_line(e: BaseException) -> str:
    """The last non-empty line of an error's text: for an error raised in a Ray worker, the error itself (its text
    opens with the remote traceback)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


def _node_id(_actor: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


class WorkerDiedError(RuntimeError):
    pass


class RpcTimeoutError(TimeoutError):
    pass


class Pending:
    """The result of a cluster call that is still running; ``result()`` waits for it (once)."""

    def __init__(self, finish: Any) -> None:
        self._finish, self._done, self._value = finish, False, None

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self._finish(), True
        return self._value


class Cluster:
    def __init__(
        self,
        role: str,
        worker_cls: type,
        worker_config: Any,
        resources: ResourceManager,
        settings: dict[str, Any],
        rpc_timeout: float = 3600.0,
    ) -> None:
        import ray

        self.role = role
        self.rpc_timeout = rpc_timeout
        self._layout: list[tuple[int, int, bool]] | None = None  # per rank: (dp rank, dp size, answers)
        devices = worker_config.device_mapping
        per = worker_config.num_gpus_per_worker
        self.world_size = len(devices) // per
        env = {str(k): str(v) for k, v in (settings.get("system_envs") or {}).items()}
        env.update({str(k): str(v) for k, v in worker_config.system_envs.items()})
        threads = settings.get("threads_per_worker")
        if threads:
            # Ray gives actors OMP_NUM_THREADS=1, and actor methods run on threads that never called
            # torch.set_num_threads: the variable is what every thread's torch pool starts from.
            env.setdefault("OMP_NUM_THREADS", str(threads))
        remote_cls = ray.remote(worker_cls)
        self.workers = []
        self.nodes = []  # per rank: the config node its devices are on (index into resources.nodes)
        for rank in range(self.world_size):
            rank_devices = devices[rank * per:(rank + 1) * per]
            self.nodes.append(resources.placement(rank_devices).node)
            options = resources.actor_options(rank_devices, env)
            self.workers.append(
                remote_cls.options(name=None, max_concurrency=4, **options).remote(role, rank, self.world_size, worker_config, settings)
            )
        # Every rank joins one process group (DeepSpeed needs it even with one rank).
        addr, port = self._get(self.workers[0].master_address.remote(), 0, "master_address", STARTUP_TIMEOUT)
        for rank, w in enumerate(self.workers):
            self._get(w.setup_distributed.remote(addr, port), rank, "setup_distributed", STARTUP_TIMEOUT)
        # where each rank runs, as Ray reports it (a death names the node)
        # (asked through Ray's own __ray_call__: a user's worker_cls need not define a method for it)
        self.node_ids = [self._get(w.__ray_call__.remote(_node_id), rank, "node_id", STARTUP_TIMEOUT)
                         for rank, w in enumerate(self.workers)]
        by_id = {n.node_id: n for n in resources.nodes}
        self.where = [f"node {k} ({by_id[i].describe() if i in by_id else i[:8]})" for k, i in zip(self.nodes, self.node_ids)]

    # --- calls
    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method`` on every rank with the same arguments; results in rank order."""
        refs = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        return [self._get(ref, rank, method) for rank, ref in enumerate(refs)]

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs)[0]

    def dispatch(self, method: str, batch: Batch, *args: Any, **kwargs: Any) -> Any:
        """Split ``batch`` over the data-parallel ranks and run ``method`` on each part (ranks of one
        model-parallel replica get the same part). Batch results are gathered back into row order
        from one rank per replica; other results (metrics) come back as a list, one per replica."""
        return self.dispatch_async(method, batch, *args, **kwargs).result()

    def dispatch_async(self, method: str, batch: Batch, *args: Any, **kwargs: Any) -> Pending:
        """``dispatch`` started without waiting: the workers run while the driver goes on; ``.result()``
        waits for them and gathers as ``dispatch`` does."""
        if self._layout is None:
            self._layout = self.call("data_parallel_info")
        dp_size, collectors = plan_dispatch(self._layout)
        parts = batch.split_equal(dp_size)
        refs = [getattr(w, method).remote(parts[dp_rank], *args, **kwargs)
                for w, (dp_rank, _, _) in zip(self.workers, self._layout)]

        def gather() -> Any:
            results = [self._get(ref, rank, method) for rank, ref in enumerate(refs)]
            results = [results[rank] for rank in collectors]
            if not all(isinstance(r, Batch) for r in results):
                return results
            for part, result in zip(parts, results):
                result.meta["_row_order"] = part.meta["_row_order"]
            return Batch.gather(results)

        return Pending(gather)

    def _get(self, ref: Any, rank: int, method: str, timeout: float | None = None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        timeout = self.rpc_timeout if timeout is None else timeout
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            raise RpcTimeoutError(f"{self.role} rank {rank}{self._on(rank)}: {method} did not finish within "
                                  f"rpc_timeout={timeout}s") from None
        except RayActorError as e:
            raise WorkerDiedError(f"{self.role} rank {rank}{self._on(rank)} died during {method}: "
                                  f"{str(e).splitlines()[0]}") from None

    def _on(self, rank: int) -> str:
        where = getattr(self, "where", None)  # not yet known while the workers start
        return f" on {where[rank]}" if where and rank < len(where) else ""

    def dead_ranks(self, timeout: float = 30.0) -> list[int]:
        """Ranks whose worker is gone (its process or its node died); a slow answer is not a death."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        dead = []
        for rank, w in enumerate(self.workers):
            try:
                ray.get(w.ping.remote(), timeout=timeout)
            except RayActorError:
                dead.append(rank)
            except GetTimeoutError:
                pass
        return dead

    def shutdown(self) -> None:
        import ray

        try:  # a worker that cannot answer is killed all the same
            ray.get([w.release.remote() for w in self.workers], timeout=30)
        except Exception:  # noqa: BLE001 - shutdown goes on whatever the workers' state
            pass
        for w in self.workers:
            ray.kill(w)
        self.workers = []
