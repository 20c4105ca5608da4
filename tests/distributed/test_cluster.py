"""Role workers on Ray (CPU, tiny model): colocation, dispatch, weight sync, failures, data parallel."""

import threading
import time

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.distributed.cluster import Cluster, RpcTimeoutError, WorkerDiedError
from roll.distributed.resources import ResourceManager, ray_init
from roll.workers import ActorInferWorker, ActorTrainWorker

from ..strategies.helpers import fixed_batch, with_old_logprobs, worker_config

pytestmark = pytest.mark.slow

LOSS = ActorLossConfig(agg_mode="token-mean")


@pytest.fixture(scope="module")
def resources():
    import ray

    ray_init(num_cpus=2, object_store_mb=256)
    rm = ResourceManager([0, 1], num_gpus_per_node=2, use_gpu=False)
    yield rm
    rm.shutdown()
    ray.shutdown()


def cluster(role, cls, cfg, devices, resources, rpc_timeout=300.0, **settings):
    cfg.device_mapping = devices
    c = Cluster(role, cls, cfg, resources, {"seed": 7, "threads_per_worker": 1, **settings}, rpc_timeout=rpc_timeout)
    c.call("initialize")
    return c


def train_batch(seed=0):
    b = fixed_batch(rows=4, seed=seed)
    return b


@pytest.mark.parametrize("transport", ["auto", "object_store"])
def test_colocated_train_and_infer_sync(resources, tiny_model_path, transport):
    train = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, stage=2), [0], resources)
    infer = cluster("actor_infer", ActorInferWorker, worker_config(tiny_model_path, "hf_infer"), [0], resources)
    batch = train_batch()
    old = train.dispatch("compute_log_probs", batch)["old_logprobs"]
    assert torch.allclose(old, infer.dispatch("compute_log_probs", batch)["infer_logprobs"], atol=1e-5)
    metrics = train.dispatch("train_step", with_old_logprobs(batch, old), LOSS)
    assert metrics[0]["actor/optimizer_steps"] == 1.0
    stats = train.call("sync_weights", infer.workers, 50_000, transport)
    assert stats[0]["weight_sync/bytes"] > 0
    torch.testing.assert_close(train.dispatch("compute_log_probs", batch)["old_logprobs"],
                               infer.dispatch("compute_log_probs", batch)["infer_logprobs"], atol=1e-5, rtol=0)
    train.shutdown()
    infer.shutdown()


def test_a_worker_killed_mid_call_names_its_role(resources, tiny_model_path):
    import ray

    infer = cluster("actor_infer", ActorInferWorker, worker_config(tiny_model_path, "hf_infer"), [0], resources)
    errors = []

    def call():
        try:
            infer.call("ping", 60)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.0)
    ray.kill(infer.workers[0])
    t.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], WorkerDiedError)
    assert "actor_infer rank 0 died during ping" in str(errors[0])


def test_rpc_timeout_names_role_and_method(resources, tiny_model_path):
    infer = cluster("reference", ActorInferWorker, worker_config(tiny_model_path, "hf_infer"), [0], resources)
    infer.rpc_timeout = 1.0
    with pytest.raises(RpcTimeoutError, match="reference rank 0: ping did not finish within rpc_timeout=1.0s"):
        infer.call("ping", 5)
    infer.shutdown()


def test_two_data_parallel_workers_equal_one_worker(resources, tiny_model_path):
    """World size 2 (gloo) on a global batch of 4 rows = world size 1 on the same 4 rows."""
    batch = train_batch(seed=5)
    single = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=2), [0], resources)
    double = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=1), [0, 1], resources)
    old = single.dispatch("compute_log_probs", batch)["old_logprobs"]
    torch.testing.assert_close(old, double.dispatch("compute_log_probs", batch)["old_logprobs"], atol=1e-6, rtol=0)
    full = with_old_logprobs(batch, old)
    single.dispatch("train_step", full, LOSS)
    double.dispatch("train_step", full, LOSS)
    a = single.call_rank0("state_dict")
    b = double.call_rank0("state_dict")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0, msg=name)
    rank0, rank1 = double.call("state_dict")
    assert all(torch.equal(rank0[n], rank1[n]) for n in rank0)  # data-parallel replicas stay identical
    single.shutdown()
    double.shutdown()


class _TensorParallelPair:
    """Two ranks of one model replica (as megatron with TP 2 reports itself): both get the same rows,
    rank 0 answers."""

    def __init__(self, role, rank, world_size, worker_config, settings):
        self.rank = rank
        self.seen = 0

    def master_address(self):
        return "127.0.0.1", 0

    def setup_distributed(self, addr, port):
        pass

    def data_parallel_info(self):
        return 0, 1, self.rank == 0

    def tag(self, batch):
        from roll.distributed.batch import Batch

        self.seen = len(batch)
        return Batch({"rank": torch.full((len(batch),), self.rank), "ids": batch["input_ids"][:, 0]})

    def rows_seen(self):
        return self.seen


def test_dispatch_sends_a_replica_the_same_rows_and_keeps_one_answer(resources):
    cfg = worker_config("unused")
    cfg.device_mapping = [0, 1]
    c = Cluster("actor_train", _TensorParallelPair, cfg, resources, {"threads_per_worker": 1}, rpc_timeout=60)
    batch = fixed_batch(rows=4)
    out = c.dispatch("tag", batch)
    assert out["rank"].tolist() == [0, 0, 0, 0]  # the answering rank's rows only
    assert out["ids"].tolist() == batch["input_ids"][:, 0].tolist()  # in the original order
    assert c.call("rows_seen") == [4, 4]  # both tensor-parallel ranks computed on all rows
    c.shutdown()
