"""GPU check of deepspeed_train's offload between phases (roll/strategies/train_state_offload.py).

For each DeepSpeed config (ZeRO 0, 1, 2, 3 and the two CPU-offload pieces), on one GPU with a bf16 model:
one train step, then GPU memory allocated before the offload, after it and after the reload; then one more
step on the offloaded engine and on a twin that never offloaded, whose weights must be equal (bit for bit).
Passes when every config frees memory on offload (ZeRO-3 + offload_param excepted: nothing of it is on the
GPU), gets it back on reload, and matches its twin.

Needs: a CUDA GPU, torch, transformers, tokenizers, deepspeed.
    python scripts/gpu/check_deepspeed_offload.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from _common import emit, require, require_cuda, tiny_model
from _common import worker_config as make_config

CONFIGS = {
    "zero0": {"stage": 0},
    "zero1": {"stage": 1},
    "zero2": {"stage": 2},
    "zero3": {"stage": 3},
    "zero2_offload_optimizer": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "zero3_offload_optimizer": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
}


def main() -> None:
    require("torch", "transformers", "deepspeed")
    require_cuda()
    import torch

    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
    from roll.strategies.train_state_offload import TrainStateOffload

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp))
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, 2000, (4, 64), generator=g)
        from roll.distributed.batch import Batch

        mask = torch.ones_like(ids)
        response = torch.zeros_like(ids)
        response[:, 32:] = 1
        batch = Batch({"input_ids": ids, "attention_mask": mask, "response_mask": response,
                       "advantages": torch.ones(ids.shape), "old_logprobs": torch.zeros(ids.shape)})

        def loss_fn(micro, out, counts):
            m = micro["response_mask"].float()
            return -(out.logprobs * micro["advantages"] * m).sum() / m.sum().clamp(min=1), {}

        def make(zero):
            cfg = make_config(path, "deepspeed_train", {"zero_optimization": dict(zero), "bf16": {"enabled": True}})
            s = DeepSpeedTrainStrategy(cfg, StrategyContext(role="actor_train", seed=1))
            s.initialize()
            return s

        def gib() -> float:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated() / 2**30

        results, ok = {}, True
        for name, zero in CONFIGS.items():
            a, twin = make(zero), make(zero)
            a.train_step(batch, loss_fn)
            twin.train_step(batch, loss_fn)
            mover = TrainStateOffload(a.engine, a.device)
            before = gib()
            mover.offload()
            torch.cuda.empty_cache()
            offloaded = gib()
            kinds = sorted(mover.offloaded_kinds())
            mover.reload()
            reloaded = gib()
            a.train_step(batch, loss_fn)
            twin.train_step(batch, loss_fn)
            same = all(torch.equal(x, y) for (_, x), (_, y) in zip(sorted(a.state_dict().items()),
                                                                    sorted(twin.state_dict().items())))
            freed = before - offloaded
            passed = freed > 0 and abs(reloaded - before) < 0.05 * max(before, 1e-3) and same
            ok = ok and passed
            results[name] = {"gib_before": before, "gib_offloaded": offloaded, "gib_reloaded": reloaded,
                             "freed_gib": freed, "kinds": kinds, "next_step_equals_twin": same, "passed": passed}
            del a, twin, mover
            torch.cuda.empty_cache()
    emit("deepspeed_offload", {"configs": results}, ok)


if __name__ == "__main__":
    main()
