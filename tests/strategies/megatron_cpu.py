"""Run as a script: roll's megatron_train strategy end to end on CPU (world size 1, gloo) against
deepspeed_train on the same tiny model, printing the figures as one JSON line.

megatron-core targets CUDA: a few of its modules create tensors on "cuda" or ask for the current
CUDA device. For this check only, those modules see a ``torch`` whose factories put tensors on the
CPU, and the dropout RNG tracker (dropout is 0 here) is a no-op. Nothing that computes a result is
replaced: the model, the pipeline schedule, DDP, the optimizer and clipping are megatron-core's own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

CUDA_MODULES = (
    "megatron.core.optimizer.optimizer", "megatron.core.optimizer.distrib_optimizer", "megatron.core.optimizer.clip_grads",
    "megatron.core.distributed.param_and_grad_buffer", "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.finalize_model_grads", "megatron.core.pipeline_parallel.schedules",
    "megatron.core.transformer.utils", "megatron.core.utils", "megatron.core.pipeline_parallel.p2p_communication",
)
FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange")


def _on_cpu(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if "cuda" in str(kwargs.get("device", "")):
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return wrapped


class _CpuTorch(types.ModuleType):
    def __getattr__(self, name: str):
        value = getattr(torch, name)
        return _on_cpu(value) if name in FACTORIES else value


def patch_megatron_for_cpu() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # tied embeddings' first/last stage sync at build
    torch.cuda.synchronize = lambda *args, **kwargs: None  # after pipeline sends (gloo's are synchronous)
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core.tensor_parallel import random as mrandom

    moe_utils.te_general_gemm = None
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    for name in CUDA_MODULES:
        importlib.import_module(name).torch = _CpuTorch("torch")


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29651"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    patch_megatron_for_cpu()
    from roll.models.logprobs import forward_logprobs
    from roll.models.tiny import build_tiny_model
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
    from roll.strategies.megatron_train import MegatronTrainStrategy
    from tests.strategies.helpers import fixed_batch, ppo_loss_fn, with_old_logprobs, worker_config

    path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    batch = fixed_batch(rows=4, length=12)
    mask = batch["attention_mask"].clone()
    mask[2, :2] = 0  # a left-padded row too: the strategy right-aligns rows for megatron's causal mask
    batch.tensors["attention_mask"] = mask
    batch.tensors["response_mask"] = batch["response_mask"] * mask
    attended = mask.bool().clone()
    attended[:, 0] = False
    attended[2, 2] = False  # the first attended token has no log-prob and no state before it (no value)

    # no clipping: megatron-core's clipping asserts CUDA gradients (on GPU, scripts/gpu checks it)
    ctx = StrategyContext(role="actor_train", seed=0, max_grad_norm=0.0, train_calls=10)
    # eps 1e-4: Adam's step lr * g / (|g| + eps) must not turn summation-order noise on near-zero gradients
    # into +-lr jumps (which would make the megatron vs deepspeed comparison depend on the CPU)
    mcfg = worker_config(path, "megatron_train", lr=1e-2, micro=1, gas=2, eps=1e-4)
    mcfg.strategy_args.strategy_config = {"make_vocab_size_divisible_by": 128, "use_distributed_optimizer": False}
    meg = MegatronTrainStrategy(mcfg, ctx, device="cpu")
    meg.initialize()
    lp = meg.compute_log_probs(batch)

    from roll.models.loading import load_causal_lm

    hf = load_causal_lm(mcfg.model_args).eval()
    ref = forward_logprobs(hf, batch["input_ids"], batch["attention_mask"])
    synced = {n: t for bucket in meg.weight_buckets(1 << 16) for n, t in bucket}
    hf_state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    exact = synced.keys() == hf_state.keys() and all(torch.equal(synced[k], v) for k, v in hf_state.items())

    # one PPO step (4 rows: 2 optimizer steps of 2 micro-batches) on both backends
    dcfg = worker_config(path, "deepspeed_train", lr=1e-2, micro=1, gas=2, eps=1e-4)
    ds = DeepSpeedTrainStrategy(dcfg, ctx)
    ds.initialize()
    train_batch = with_old_logprobs(batch, ref)
    m_metrics = meg.train_step(train_batch, ppo_loss_fn)
    d_metrics = ds.train_step(train_batch, ppo_loss_fn)
    after_m, after_d = meg.compute_log_probs(batch), ds.compute_log_probs(batch)

    # HF export of the trained weights loads in transformers and gives megatron's log-probs
    export = Path(tempfile.mkdtemp()) / "hf"
    meg.export_hf(str(export))
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    export_diff = float((forward_logprobs(exported, batch["input_ids"], batch["attention_mask"]) - after_m)[attended]
                        .abs().max())

    # checkpoint: save, step, load, step again -> the same weights
    ckpt = tempfile.mkdtemp()
    meg.save_checkpoint(ckpt)
    meg.train_step(train_batch, ppo_loss_fn)
    first = meg.compute_log_probs(batch)
    meg.load_checkpoint(ckpt)
    restored = meg.compute_log_probs(batch)
    meg.train_step(train_batch, ppo_loss_fn)
    second = meg.compute_log_probs(batch)

    # the critic: megatron's output layer swapped for a zero-initialised value head, against deepspeed's
    from roll.algorithms.losses import value_loss

    def critic_loss(micro, out, counts):
        return value_loss(out.values, micro["values"], micro["returns"], micro["response_mask"].float(), counts=counts)

    critic_ctx = StrategyContext(role="critic", seed=0, max_grad_norm=0.0, train_calls=10)
    mcrit = MegatronTrainStrategy(worker_config(path, "megatron_train", lr=1e-2, micro=2, gas=1, eps=1e-4), critic_ctx,
                                  device="cpu")
    mcrit.config.strategy_args.strategy_config = mcfg.strategy_args.strategy_config
    mcrit.mc = meg.mc
    mcrit.initialize()
    dcrit = DeepSpeedTrainStrategy(worker_config(path, "deepspeed_train", lr=1e-2, micro=2, gas=1, eps=1e-4), critic_ctx)
    dcrit.initialize()
    values0 = mcrit.compute_values(batch)
    returns = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(5))
    critic_batch = batch | type(batch)({"values": values0, "returns": returns})
    mcrit.train_step(critic_batch, critic_loss)
    dcrit.train_step(critic_batch, critic_loss)
    values_m, values_d = mcrit.compute_values(batch), dcrit.compute_values(batch)

    # wiring: changing token t moves neither the value used at t (V(x_<t)) nor any log-prob before t
    lp_now = meg.compute_log_probs(batch)
    value_moves, logprob_moves, own_moves = [], [], []
    for t in (3, 7, 10):
        changed = type(batch)(dict(batch.tensors))
        ids = batch["input_ids"].clone()
        ids[:, t] = (ids[:, t] + 17) % 500 + 3
        changed.tensors["input_ids"] = ids
        value_moves.append(float((mcrit.compute_values(changed) - values_m)[:, : t + 1].abs().max()))
        lp_changed = meg.compute_log_probs(changed)
        logprob_moves.append(float((lp_changed - lp_now)[:, :t].abs().max()))
        own_moves.append(float((lp_changed - lp_now)[:, t].abs().max()))
    print(json.dumps({
        "logprob_max_abs_vs_hf": float((lp - ref)[attended].abs().max()),
        "padding_is_zero": bool(torch.all(lp[~mask.bool()] == 0)),
        "sync_exact": exact,
        "trained_max_abs_vs_deepspeed": float((after_m - after_d)[attended].abs().max()),
        "moved_by_training": float((after_m - lp)[attended].abs().max()),
        "grad_norm": [m_metrics["actor/grad_norm"], d_metrics["actor/grad_norm"]],
        "optimizer_steps": [m_metrics["actor/optimizer_steps"], d_metrics["actor/optimizer_steps"]],
        "hf_export_max_abs_vs_megatron": export_diff,
        "checkpoint_restores_weights": bool(torch.equal(restored, after_m)),
        "checkpoint_resume_is_exact": bool(torch.equal(first, second)),
        "critic_initial_values_zero": bool(torch.all(values0 == 0)),
        "critic_trained_max_abs_vs_deepspeed": float((values_m - values_d)[attended].abs().max()),
        "critic_moved_by_training": float(values_m[mask.bool()].abs().max()),
        "value_at_or_before_t_moves_with_token_t": max(value_moves),
        "logprob_before_t_moves_with_token_t": max(logprob_moves),
        "logprob_at_t_moves_with_token_t": min(own_moves),
    }))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
