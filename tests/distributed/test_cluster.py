"""Role workers on Ray (CPU, tiny model): colocation, dispatch, weight sync, failures, data parallel."""

import re
import threading
import time

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.distributed.cluster import Cluster, RpcTimeoutError, WorkerDiedError
from roll.distributed.resources import ResourceManager, ray_init
from roll.workers import ActorInferWorker, ActorTrainWorker

from ..strategies.helpers import SGD_LIKE, fixed_batch, sgd_step, with_old_logprobs, worker_config

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
    assert re.search(r"actor_infer rank 0 on node 0 \(\w{8}@[\d.]+\) died during ping", str(errors[0])), errors[0]


def test_rpc_timeout_names_role_and_method(resources, tiny_model_path):
    infer = cluster("reference", ActorInferWorker, worker_config(tiny_model_path, "hf_infer"), [0], resources)
    infer.rpc_timeout = 1.0
    with pytest.raises(RpcTimeoutError, match=r"reference rank 0 on node 0 \(\w{8}@[\d.]+\): ping did not finish within rpc_timeout=1.0s"):
        infer.call("ping", 5)
    infer.shutdown()


def _same_update(single, double, batch, loss=LOSS):
    """Train both clusters one step on ``batch`` (SGD-like settings); return their updates and metrics."""
    old = single.dispatch("compute_log_probs", batch)["old_logprobs"]
    torch.testing.assert_close(old, double.dispatch("compute_log_probs", batch)["old_logprobs"], atol=1e-6, rtol=0)
    full = with_old_logprobs(batch, old)
    before = single.call_rank0("state_dict")
    m1 = single.dispatch("train_step", full, loss)
    m2 = double.dispatch("train_step", full, loss)
    d1 = sgd_step(before, single.call_rank0("state_dict"))
    d2 = sgd_step(before, double.call_rank0("state_dict"))
    rank0, rank1 = double.call("state_dict")
    assert all(torch.equal(rank0[n], rank1[n]) for n in rank0)  # data-parallel replicas stay identical
    return d1, d2, m1, m2, full


def test_two_data_parallel_workers_equal_one_worker(resources, tiny_model_path):
    """World size 2 (gloo) on a global batch of 4 rows = world size 1 on the same 4 rows: the same SGD step
    (the all-reduced gradient), compared tightly, and the same logged metrics."""
    batch = train_batch(seed=5)
    single = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=2, **SGD_LIKE), [0], resources)
    double = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=1, **SGD_LIKE), [0, 1], resources)
    d1, d2, m1, m2, _ = _same_update(single, double, batch)
    assert max(float(d.abs().max()) for d in d1.values()) > 1e-3  # a real step
    for name in d1:
        torch.testing.assert_close(d2[name], d1[name], atol=1e-6, rtol=0, msg=name)
    for key in ("actor/pg_loss", "actor/loss", "actor/ratio_mean", "actor/pg_clipfrac"):  # one rank vs two: one value
        assert m2[0][key] == pytest.approx(m1[0][key], abs=1e-6), key
    single.shutdown()
    double.shutdown()


def test_rows_that_do_not_divide_over_ranks_do_not_hang(resources, tiny_model_path):
    """5 rows over 2 ranks: every rank runs the same micro-batches and steps (before, the rank with 3 rows ran
    one more mini-batch and waited in its collective until rpc_timeout). The update equals one rank's on the
    same 5 rows."""
    batch = fixed_batch(rows=5, seed=9)
    single = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=3, **SGD_LIKE), [0],
                     resources, rpc_timeout=120)
    double = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=2, **SGD_LIKE), [0, 1],
                     resources, rpc_timeout=120)
    d1, d2, m1, m2, full = _same_update(single, double, batch)
    for name in d1:
        torch.testing.assert_close(d2[name], d1[name], atol=1e-6, rtol=0, msg=name)
    assert m2[0]["actor/pg_loss"] == pytest.approx(m1[0]["actor/pg_loss"], abs=1e-6)
    double.shutdown()
    # mini-batches of 2 rows per rank: 2 optimizer steps on both ranks
    steps = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, micro=2, gas=1), [0, 1], resources,
                    rpc_timeout=120)
    metrics = steps.dispatch("train_step", full, LOSS)
    assert [m["actor/optimizer_steps"] for m in metrics] == [2.0, 2.0]
    steps.shutdown()
    # ZeRO-3 gathers parameters inside every forward: 3 and 2 rows in passes of 2 would meet 2 vs 1 times
    z3 = cluster("actor_train", ActorTrainWorker, worker_config(tiny_model_path, stage=3, infer_batch_size=2), [0, 1],
                 resources, rpc_timeout=120)
    # (the untrained model's log-probs, taken by the one-rank cluster before its step)
    torch.testing.assert_close(z3.dispatch("compute_log_probs", batch)["old_logprobs"], full["old_logprobs"], atol=1e-5, rtol=0)
    z3.shutdown()
    single.shutdown()


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


class _Raises:
    def fail(self):
        from roll.configs.errors import ConfigError

        raise ConfigError("actor_train.strategy_args.strategy_name", "a worker-side check failed")


def test_a_config_error_raised_in_a_worker_reaches_the_driver_as_itself(resources):
    import ray

    from roll.configs.errors import ConfigError

    actor = ray.remote(_Raises).options(num_cpus=0.0001).remote()
    with pytest.raises(ConfigError) as e:
        ray.get(actor.fail.remote(), timeout=60)
    assert e.value.path == "actor_train.strategy_args.strategy_name" and e.value.message == "a worker-side check failed"
    ray.kill(actor)
