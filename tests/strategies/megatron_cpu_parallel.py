"""Run as a script: megatron_train with 2 ranks on CPU (gloo) in four layouts, tensor parallel 2,
pipeline parallel 2 (also with 2 virtual stages each) and data parallel 2, each against deepspeed_train with one rank on the whole
batch. Prints one JSON line of figures per layout. See megatron_cpu.py for what is patched."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

import numpy as np
import torch
import torch.multiprocessing as mp

# Adam's first step is lr x g / (|g| + eps): with a tiny eps, gradients near 0 flip between +-lr on
# summation-order noise (two half-batch sums vs one); a larger eps keeps the comparison about the math.
ADAM_EPS = 1e-4

LAYOUTS = {
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "pp2vpp2": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
    "dp2": {},
}


def _batch():
    from tests.strategies.helpers import fixed_batch

    b = fixed_batch(rows=4, length=12)
    b.tensors["attention_mask"][2, :2] = 0  # one left-padded row
    b.tensors["response_mask"] = b["response_mask"] * b["attention_mask"]
    return b


def _worker(rank: int, port: int, path: str, layout: dict, ref: np.ndarray, queue: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0")
    from tests.strategies.megatron_cpu import patch_megatron_for_cpu

    patch_megatron_for_cpu()
    from roll.strategies.base import StrategyContext
    from roll.strategies.megatron_train import MegatronTrainStrategy
    from tests.strategies.helpers import ppo_loss_fn, with_old_logprobs, worker_config

    cfg = worker_config(path, "megatron_train", lr=1e-2, micro=1, gas=2)
    cfg.training_args.adam_epsilon = ADAM_EPS
    cfg.strategy_args.strategy_config = {**layout, "make_vocab_size_divisible_by": 8, "use_distributed_optimizer": False}
    ctx = StrategyContext(role="actor_train", rank=rank, world_size=2, seed=0, max_grad_norm=0.0, train_calls=10)
    s = MegatronTrainStrategy(cfg, ctx, device="cpu")
    s.initialize()
    batch = _batch()
    info = s.data_parallel_info()
    lp = s.compute_log_probs(batch)
    synced = {n: t.numpy() for bucket in s.weight_buckets(1 << 16) for n, t in bucket}
    train = with_old_logprobs(batch, torch.from_numpy(ref))
    dp_rank, dp_size, _ = info
    if dp_size > 1:  # as Cluster.dispatch does: each data-parallel rank trains on its part
        train = train.split(dp_size)[dp_rank]
    s.train_step(train, ppo_loss_fn)
    after = s.compute_log_probs(batch)
    queue.put((rank, info, lp.numpy(), after.numpy(), synced))
    torch.distributed.barrier()


def attended_positions(batch) -> torch.Tensor:
    """Where _batch's rows have a log-prob: attended, not a row's first attended token."""
    attended = batch["attention_mask"].bool().clone()
    attended[:, 0] = False
    attended[2, 2] = False
    return attended


def run_two_ranks(worker, *args) -> list:
    """Run ``worker(rank, port, *args, queue)`` in two spawned processes; what each put on the queue, by rank."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=worker, args=(r, port, *args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results: list = []
    deadline = time.monotonic() + 600
    while len(results) < len(procs):  # a rank that dies fails the run at once, not after the whole timeout
        try:
            results.append(queue.get(timeout=2))
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"a rank exited with {dead[0]}" if dead else "ranks did not answer within 600 s") from None
    for p in procs:
        p.join(timeout=120)
    return sorted(results, key=lambda r: r[0])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    from roll.models.loading import load_causal_lm
    from roll.models.logprobs import forward_logprobs
    from roll.models.tiny import build_tiny_model
    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
    from tests.strategies.helpers import ppo_loss_fn, with_old_logprobs, worker_config

    os.environ["MASTER_PORT"] = str(_free_port())  # the one-rank DeepSpeed reference's own process group
    path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", num_layers=4))  # 4: two stages x two chunks
    batch = _batch()
    dcfg = worker_config(path, "deepspeed_train", lr=1e-2, micro=1, gas=2)
    hf = load_causal_lm(dcfg.model_args).eval()
    ref = forward_logprobs(hf, batch["input_ids"], batch["attention_mask"])
    hf_state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    # the one-rank reference step: micro 1 x grad_accum 2 on 4 rows = 2 optimizer steps; with 2
    # data-parallel ranks each takes 2 rows per step, so the reference step takes all 4 at once
    refs = {}
    for gas in (2, 4):
        dcfg = worker_config(path, "deepspeed_train", lr=1e-2, micro=1, gas=gas)
        dcfg.training_args.adam_epsilon = ADAM_EPS
        ds = DeepSpeedTrainStrategy(dcfg, StrategyContext(role="actor_train", seed=0, max_grad_norm=0.0, train_calls=10))
        ds.initialize()
        ds.train_step(with_old_logprobs(batch, ref), ppo_loss_fn)
        refs[gas] = ds.compute_log_probs(batch)
    attended = attended_positions(batch)
    for name, layout in LAYOUTS.items():
        results = run_two_ranks(_worker, path, layout, ref.numpy())
        collectors = [r for r in results if r[1][2]]
        expected = refs[4] if name == "dp2" else refs[2]
        figures = {
            "layout": name,
            "data_parallel_info": [list(r[1]) for r in results],
            "logprob_max_abs_vs_hf": max(float((torch.from_numpy(r[2]) - ref)[attended].abs().max()) for r in collectors),
            "sync_exact": bool(results[0][4].keys() == hf_state.keys() and all(
                np.array_equal(results[0][4][k], v.numpy()) for k, v in hf_state.items())),
            "trained_max_abs_vs_deepspeed": max(float((torch.from_numpy(r[3]) - expected)[attended].abs().max())
                                                for r in collectors),
            "moved_by_training": float((expected - ref)[attended].abs().max()),
        }
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
