"""ROLL's multi-node launch contract: the same command on every node, told apart by environment variables.

``WORLD_SIZE`` (nodes, > 1 to take this path), ``RANK`` (this node, 0..WORLD_SIZE-1), ``MASTER_ADDR`` and
``MASTER_PORT`` (the Ray head's address: rank 0's machine and the port its GCS listens on).

- Rank 0 uses the Ray head at that address when one answers, else starts one (``ray start --head --block``
  as its child), waits up to ``node_join_timeout`` seconds for WORLD_SIZE device nodes, drives the run, and
  stops the head it started when the run ends.
- A rank > 0 waits up to ``node_join_timeout`` seconds for the head, joins it (``ray start --address
  --block``), stays while the head answers, then stops its node and exits 0.

Every node is started with the label ``roll-node-rank=RANK`` (config node k is the node of RANK k) and, on a
machine without GPU, ``num_gpus_per_node`` ``roll_device`` slots. Ray's token authentication stays on: every
node needs the same token, as ``RAY_AUTH_TOKEN`` or a file named by ``RAY_AUTH_TOKEN_PATH``; running without
one needs ``RAY_AUTH_MODE=disabled`` set by the user.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from roll.configs.errors import ConfigError
from roll.distributed.resources import DEVICE_RESOURCE, RANK_LABEL

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often a rank > 0 checks that the head still answers
GONE_AFTER = 3  # consecutive failed checks before the head counts as gone


class LaunchError(RuntimeError):
    """A node could not join or start the cluster; the message is one line naming the address."""


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> LaunchEnv | None:
        """The launch contract's variables, or None when WORLD_SIZE is unset or 1 (a one-node run)."""
        size = environ.get("WORLD_SIZE")
        if size is None or size.strip() in ("", "1"):
            return None
        try:
            world_size, rank = int(size), int(environ.get("RANK", "0"))
            port = int(environ.get("MASTER_PORT", "6379"))
        except ValueError:
            raise LaunchError(f"WORLD_SIZE, RANK and MASTER_PORT must be integers, got WORLD_SIZE={size!r} "
                              f"RANK={environ.get('RANK')!r} MASTER_PORT={environ.get('MASTER_PORT')!r}") from None
        if world_size < 1 or not 0 <= rank < world_size:
            raise LaunchError(f"RANK must be in 0..WORLD_SIZE-1, got RANK={rank} WORLD_SIZE={world_size}")
        addr = environ.get("MASTER_ADDR")
        if not addr:
            raise LaunchError("WORLD_SIZE > 1 needs MASTER_ADDR: the address of rank 0's machine")
        return cls(rank, world_size, addr, port)


def check_auth(environ: Mapping[str, str]) -> None:
    """Every node must present the same Ray token; without one Ray would make a different token per node and
    refuse the joins. Authentication is never turned off here: RAY_AUTH_MODE=disabled is the user's choice."""
    if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    if environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    raise LaunchError("a multi-node launch needs the cluster's Ray token on every node: export the same "
                      "RAY_AUTH_TOKEN (e.g. from `python -c 'import secrets; print(secrets.token_hex(32))'`) or "
                      "RAY_AUTH_TOKEN_PATH on each, or RAY_AUTH_MODE=disabled to run without authentication")


def check_nodes_enough(mappings: dict[str, list[int]], num_gpus_per_node: int, world_size: int) -> None:
    """The device_mapping fits WORLD_SIZE nodes of num_gpus_per_node devices (checked before any node starts)."""
    owner = {d: role for role, devices in mappings.items() for d in devices}
    if owner and max(owner) >= world_size * num_gpus_per_node:
        d = max(owner)
        raise ConfigError(f"{owner[d]}.device_mapping", f"device {d} is on node {d // num_gpus_per_node} "
                          f"(num_gpus_per_node={num_gpus_per_node}), but WORLD_SIZE={world_size} nodes are launched")


def head_answers(addr: str, port: int, timeout: float = 2.0) -> bool:
    """Whether something listens at the head's GCS address."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_head(env: LaunchEnv, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not head_answers(env.master_addr, env.master_port):
        if time.monotonic() > deadline:
            raise LaunchError(f"rank {env.rank}: no Ray head answered at {env.address} within {timeout:g} s "
                              f"(node_join_timeout); is rank 0 running, and MASTER_ADDR/MASTER_PORT right?")
        time.sleep(POLL_S)


def ray_start_command(env: LaunchEnv, num_gpus_per_node: int, use_gpu: bool, head: bool) -> list[str]:
    """``ray start --block`` for this node: its rank as a label, device slots on a CPU machine."""
    ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray") or "ray"
    cmd = [ray, "start", "--block", "--disable-usage-stats", f"--labels={RANK_LABEL}={env.rank}"]
    if head:
        cmd += ["--head", f"--port={env.master_port}", f"--node-ip-address={env.master_addr}",
                "--include-dashboard=false"]
    else:
        cmd += [f"--address={env.address}"]
    if not use_gpu:
        cmd += ["--resources=" + json.dumps({DEVICE_RESOURCE: num_gpus_per_node})]
    store_mb = os.environ.get("ROLL_OBJECT_STORE_MB")
    if store_mb:
        cmd += [f"--object-store-memory={int(store_mb) << 20}"]
    return cmd


def _node_env() -> dict[str, str]:
    env = dict(os.environ)
    if env.get("RAY_AUTH_MODE") is None and (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
        env["RAY_AUTH_MODE"] = "token"  # the token given is used, not a per-machine one
    return env


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM lets ``ray start --block`` drain and stop its node's processes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_nodes(env: LaunchEnv, timeout: float) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        ranks = sorted({int(r) for n in alive if str(r := (n.get("Labels") or {}).get(RANK_LABEL, "")).isdigit()})
        if len(alive) >= env.world_size:
            log.info("all %d nodes joined the Ray cluster at %s", env.world_size, env.address)
            return
        if time.monotonic() > deadline:
            missing = sorted(set(range(env.world_size)) - set(ranks))
            raise LaunchError(f"rank 0: only {len(alive)} of WORLD_SIZE={env.world_size} nodes joined the Ray "
                              f"head at {env.address} within {timeout:g} s (node_join_timeout); missing RANK {missing}")
        time.sleep(POLL_S)


@contextmanager
def head_node(env: LaunchEnv, num_gpus_per_node: int, use_gpu: bool, timeout: float) -> Iterator[str]:
    """Rank 0: a Ray head at MASTER_ADDR:MASTER_PORT (started here unless one answers), this driver connected
    to it and every node joined; yields the address. A head started here is stopped on the way out."""
    # this driver presents the token too; Ray reads the mode from the environment when it is first imported
    os.environ.update({k: v for k, v in _node_env().items() if k == "RAY_AUTH_MODE"})
    import ray

    proc = None
    if not head_answers(env.master_addr, env.master_port):
        cmd = ray_start_command(env, num_gpus_per_node, use_gpu, head=True)
        log.info("rank 0: starting the Ray head: %s", " ".join(cmd))
        proc = _spawn(cmd, env)
    try:
        deadline = time.monotonic() + timeout
        while not head_answers(env.master_addr, env.master_port):
            if proc is not None and proc.poll() is not None:
                raise LaunchError(f"rank 0: `ray start --head` at {env.address} exited with code {proc.returncode}: "
                                  f"{_last_line(proc)}")
            if time.monotonic() > deadline:
                raise LaunchError(f"rank 0: the Ray head at {env.address} did not answer within {timeout:g} s")
            time.sleep(0.5)
        ray.init(address=env.address, ignore_reinit_error=True, log_to_driver=True)
        _wait_nodes(env, max(1.0, deadline - time.monotonic()))
        yield env.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if proc is not None:
            _stop(proc)


def run_worker_node(env: LaunchEnv, num_gpus_per_node: int, use_gpu: bool, timeout: float) -> int:
    """A rank > 0: join the head, stay while it answers, then stop this node. Returns the exit code (0)."""
    wait_for_head(env, timeout)
    cmd = ray_start_command(env, num_gpus_per_node, use_gpu, head=False)
    log.info("rank %d: joining the Ray head at %s", env.rank, env.address)
    proc = _spawn(cmd, env)
    misses = 0
    try:
        while misses < GONE_AFTER:
            time.sleep(POLL_S)
            if proc.poll() is not None and head_answers(env.master_addr, env.master_port):
                raise LaunchError(f"rank {env.rank}: `ray start --address={env.address}` exited with code "
                                  f"{proc.returncode} while the head still runs: {_last_line(proc)}")
            misses = 0 if head_answers(env.master_addr, env.master_port) else misses + 1
    finally:
        _stop(proc)
    log.info("rank %d: the head at %s is gone (the driver finished); node stopped", env.rank, env.address)
    return 0


def _spawn(cmd: list[str], env: LaunchEnv) -> subprocess.Popen:
    """``ray start --block`` with its output in a file (a pipe nobody reads would fill and stall it)."""
    path = Path(tempfile.gettempdir()) / f"roll-ray-start-rank{env.rank}-{env.master_port}.log"
    with open(path, "w") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=_node_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


def _last_line(proc: subprocess.Popen) -> str:
    path = getattr(proc, "log_path", None)
    text = path.read_text(errors="replace") if path is not None and path.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{lines[-1][:300]} (log: {path})" if lines else f"(no output; log: {path})"
