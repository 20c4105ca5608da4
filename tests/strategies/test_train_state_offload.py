"""deepspeed_train's offload between phases, run through DeepSpeed's real bookkeeping on CPU: for each ZeRO
stage and CPU-offload piece, the state kinds DeepSpeed marks offloaded are the documented ones, the tensors
were copied to other buffers (the host copies), and after the reload the next update is exactly that of a twin
that never offloaded. The device-to-host copy itself needs a GPU: scripts/gpu/check_deepspeed_offload.py."""

import pytest
import torch

from roll.strategies.base import StrategyContext
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.strategies.train_state_offload import TrainStateOffload, move_storages, offload_kinds

from .helpers import fixed_batch, ppo_loss_fn, with_old_logprobs, worker_config

CASES = {
    "zero0": ({"stage": 0}, set()),
    "zero1": ({"stage": 1}, {"hp_params", "lp_params", "lp_grads", "optim_states"}),
    "zero2": ({"stage": 2}, {"hp_params", "lp_params", "lp_grads", "optim_states"}),
    "zero3": ({"stage": 3}, {"lp_params", "lp_grads", "contiguous_grad_buffer"}),
    "zero2_offload_optimizer": ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, {"lp_params", "lp_grads"}),
    "zero3_offload_optimizer": ({"stage": 3, "offload_optimizer": {"device": "cpu"}}, {"lp_params", "contiguous_grad_buffer"}),
}


def make(path, zero, lora=False):
    cfg = worker_config(path, stage=zero["stage"])
    cfg.strategy_args.strategy_config = {"zero_optimization": dict(zero)}
    if lora:
        cfg.model_args.lora_target = "all-linear"
        cfg.model_args.lora_rank = 4
    s = DeepSpeedTrainStrategy(cfg, StrategyContext(role="actor_train", seed=1))
    s.initialize()
    return s


def step(s, seed):
    batch = fixed_batch(seed=seed)
    s.train_step(with_old_logprobs(batch, s.compute_log_probs(batch)), ppo_loss_fn)


def weights(s):
    return {n: t.clone() for n, t in s.state_dict().items()}


def storage_ptrs(s):
    """Where each tensor the engine trains with lives now."""
    opt = s.engine.optimizer
    tensors = [p for p in s.engine.module.parameters()]
    for name in ("single_partition_of_fp32_groups", "bit16_groups_flat", "fp16_partitioned_groups_flat",
                 "fp32_partitioned_groups_flat"):
        tensors += list(getattr(opt, name, []) or [])
    if hasattr(opt, "lp_param_buffer"):
        tensors.append(opt.lp_param_buffer)
    inner = getattr(opt, "optimizer", opt)
    tensors += [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
    return {id(t): t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_offload_moves_the_documented_state_and_the_next_update_is_unchanged(tiny_model_path, case):
    zero, kinds = CASES[case]
    a, twin = make(tiny_model_path, zero), make(tiny_model_path, zero)
    step(a, 1)
    step(twin, 1)
    mover = TrainStateOffload(a.engine, "cpu")
    assert set(mover.kinds) == kinds
    before = storage_ptrs(a)
    mover.offload()
    assert mover.offloaded_kinds() == kinds
    after = storage_ptrs(a)
    moved = {k for k in before if k in after and after[k] != before[k]}
    assert moved, "nothing was copied to a host buffer"
    if zero["stage"] == 0:  # the storage mover: every parameter and every moment
        assert moved == set(before)
    mover.reload()
    assert mover.offloaded_kinds() == set()
    torch.testing.assert_close(weights(a), weights(twin), atol=0, rtol=0)
    step(a, 2)
    step(twin, 2)
    torch.testing.assert_close(weights(a), weights(twin), atol=0, rtol=0)
    batch = fixed_batch(seed=5)
    torch.testing.assert_close(a.compute_log_probs(batch), twin.compute_log_probs(batch), atol=0, rtol=0)


def test_offload_param_leaves_nothing_for_deepspeed_to_move():
    assert offload_kinds(3, cpu_optimizer=True, offload_param=True, fused_adam=False) == ()
    assert offload_kinds(3, cpu_optimizer=False, offload_param=False, fused_adam=True) == (
        "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer", "optim_states")


def test_a_frozen_base_moves_by_storage_under_zero2(tiny_model_path):
    """LoRA's frozen base is in no DeepSpeed buffer: it moves by storage, and the adapter's update is unchanged."""
    a, twin = make(tiny_model_path, {"stage": 2}, lora=True), make(tiny_model_path, {"stage": 2}, lora=True)
    step(a, 1)
    step(twin, 1)
    frozen = [p for p in a.engine.module.parameters() if not p.requires_grad]
    assert frozen
    ptrs = [p.untyped_storage().data_ptr() for p in frozen]
    mover = TrainStateOffload(a.engine, "cpu")
    mover.offload()
    assert all(p.untyped_storage().data_ptr() != q for p, q in zip(frozen, ptrs))
    mover.reload()
    step(a, 2)
    step(twin, 2)
    torch.testing.assert_close(weights(a), weights(twin), atol=0, rtol=0)


def test_views_of_one_storage_stay_views_of_one_storage():
    flat = torch.arange(10.0)
    a, b = flat[:4].view(2, 2), flat[4:]
    move_storages([a, b, flat], "cpu")
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    flat[0] = 100.0
    assert a[0, 0] == 100.0 and b.storage_offset() == 4 and torch.equal(b, torch.arange(4.0, 10.0))
