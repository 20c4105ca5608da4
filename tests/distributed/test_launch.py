"""ROLL's multi-node launch contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the rules, then the real thing,
two `ray start` nodes on 127.0.0.1 driven by those variables through the command line users run."""

import os
import secrets
import socket
import subprocess
import sys
import time

import pytest

from roll.configs.errors import ConfigError
from roll.configs.loading import load_config
from roll.distributed.launch import LaunchEnv, LaunchError, check_auth, check_nodes_enough, ray_start_command

from ..configs.conftest import REPO
from ..configs.test_roll_examples import roll_examples  # noqa: F401 - the fixture: ROLL's examples/ layout
from ..pipeline.helpers import tiny_overrides


def test_the_contract_is_read_from_the_environment():
    assert LaunchEnv.from_environ({}) is None and LaunchEnv.from_environ({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = LaunchEnv.from_environ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "6400"})
    assert env == LaunchEnv(1, 2, "10.1.2.3", 6400) and env.address == "10.1.2.3:6400"
    with pytest.raises(LaunchError, match="RANK must be in 0..WORLD_SIZE-1, got RANK=2 WORLD_SIZE=2"):
        LaunchEnv.from_environ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h"})
    with pytest.raises(LaunchError, match="needs MASTER_ADDR"):
        LaunchEnv.from_environ({"WORLD_SIZE": "2", "RANK": "0"})
    with pytest.raises(LaunchError, match="must be integers"):
        LaunchEnv.from_environ({"WORLD_SIZE": "two", "MASTER_ADDR": "h"})


def test_authentication_is_never_turned_off_silently():
    for ok in ({"RAY_AUTH_TOKEN": "x" * 64}, {"RAY_AUTH_TOKEN_PATH": "/t"}, {"RAY_AUTH_MODE": "disabled"}):
        check_auth(ok)
    with pytest.raises(LaunchError, match="export the same RAY_AUTH_TOKEN"):
        check_auth({})


def test_nodes_start_with_their_rank_and_device_slots():
    env = LaunchEnv(1, 2, "10.1.2.3", 6400)
    cmd = ray_start_command(env, 4, use_gpu=False, head=False)
    assert "--address=10.1.2.3:6400" in cmd and "--labels=roll-node-rank=1" in cmd and "--block" in cmd
    assert '--resources={"roll_device": 4}' in cmd
    head = ray_start_command(LaunchEnv(0, 2, "10.1.2.3", 6400), 4, use_gpu=True, head=True)
    assert "--head" in head and "--port=6400" in head and not any(c.startswith("--resources") for c in head)


def test_roll_multi_node_demo_loads_and_needs_its_two_nodes(roll_examples):  # noqa: F811 - the imported fixture
    cfg = load_config("agent_val_frozen_lake_multi_nodes_demo", str(roll_examples / "agentic_demo")).config
    mappings = {r: getattr(cfg, r).device_mapping for r in ("actor_train", "actor_infer", "reference")
                if getattr(cfg, r) is not None}
    check_nodes_enough(mappings, cfg.num_gpus_per_node, 2)
    with pytest.raises(ConfigError, match=r"device_mapping: device 3 is on node 1 \(num_gpus_per_node=2\), but "
                                          r"WORLD_SIZE=1 nodes are launched"):
        check_nodes_enough(mappings, cfg.num_gpus_per_node, 1)


# --- two real nodes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(rank, port, overrides, world_size=2, **extra):
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "ROLL_OBJECT_STORE_MB": "128", **extra}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban",
                             *overrides], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_ray_start_nodes_run_a_split_pipeline_and_both_exit_zero(tiny_model_path, tmp_path):
    port, token = free_port(), secrets.token_hex(32)
    overrides = tiny_overrides(tiny_model_path, tmp_path, "max_steps=1", "eval_steps=0", "num_gpus_per_node=1",
                               "actor_train.device_mapping=[0]", "actor_infer.device_mapping=[1]", "node_join_timeout=120")
    worker = launch(1, port, overrides, RAY_AUTH_TOKEN=token)  # first: it waits for the head
    time.sleep(2)
    driver = launch(0, port, overrides, RAY_AUTH_TOKEN=token)
    try:
        out, _ = driver.communicate(timeout=900)
        worker_out, _ = worker.communicate(timeout=180)  # leaves once the head is gone
    finally:
        for p in (driver, worker):
            p.kill()
    assert driver.returncode == 0, out[-4000:]
    assert worker.returncode == 0, worker_out[-4000:]
    assert "all 2 nodes joined the Ray cluster" in out and "roll: finished 1 steps" in out
    assert "placement: actor_train ranks on node 0 (" in out and "placement: actor_infer ranks on node 1 (" in out
    assert f"the head at 127.0.0.1:{port} is gone" in worker_out


@pytest.mark.slow
def test_a_rank_that_cannot_reach_the_head_stops_in_one_line_naming_it(tiny_model_path, tmp_path):
    port = free_port()  # nothing listens there
    overrides = tiny_overrides(tiny_model_path, tmp_path, "node_join_timeout=3")
    proc = launch(1, port, overrides, RAY_AUTH_TOKEN=secrets.token_hex(32))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    line = [x for x in out.splitlines() if x.startswith("launch error:")]
    assert line == [f"launch error: rank 1: no Ray head answered at 127.0.0.1:{port} within 3 s (node_join_timeout); "
                    "is rank 0 running, and MASTER_ADDR/MASTER_PORT right?"], out[-2000:]


@pytest.mark.slow
def test_rank_zero_without_its_nodes_and_a_launch_without_a_token_stop_in_one_line(tiny_model_path, tmp_path):
    port = free_port()
    overrides = tiny_overrides(tiny_model_path, tmp_path, "node_join_timeout=8")
    proc = launch(0, port, overrides, RAY_AUTH_TOKEN=secrets.token_hex(32))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-2000:]
    assert (f"launch error: rank 0: only 1 of WORLD_SIZE=2 nodes joined the Ray head at 127.0.0.1:{port} within"
            in out), out[-2000:]
    assert "missing RANK [1]" in out
    time.sleep(2)
    assert not socket.socket().connect_ex(("127.0.0.1", port)) == 0, "the head it started is still up"

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    proc = subprocess.run([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban",
                           *overrides], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**env, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert proc.returncode == 1 and "launch error: a multi-node launch needs the cluster's Ray token" in proc.stderr
