import copy

import torch

from roll.algorithms.losses import ActorLossConfig, actor_loss
from roll.configs.schema import ModelArgs, StrategyArgs, TrainingArgs, WorkerConfig
from roll.distributed.batch import Batch


def worker_config(path, strategy="deepspeed_train", stage=0, lr=1e-2, micro=2, gas=2, model_type=None, dtype="fp32",
                  eps=1e-8, infer_batch_size=3, schedule="constant", bf16=False):
    sc = {"zero_optimization": {"stage": stage}} if strategy == "deepspeed_train" else None
    return WorkerConfig(
        model_args=ModelArgs(model_name_or_path=path, dtype=dtype, disable_gradient_checkpointing=True, model_type=model_type),
        training_args=TrainingArgs(learning_rate=lr, per_device_train_batch_size=micro, gradient_accumulation_steps=gas,
                                   adam_epsilon=eps, lr_scheduler_type=schedule, bf16=bf16),
        strategy_args=StrategyArgs(strategy, sc),
        infer_batch_size=infer_batch_size,
    )


# Adam's first step is lr * g / (|g| + eps). With eps far above every |g| it is lr / eps * g: a plain SGD
# step, linear in the gradient, so two runs that sum the same gradient in another order agree to rounding
# (a tiny eps turns that rounding noise on near-zero gradients into +-lr jumps, differently on each CPU).
SGD_LIKE = {"lr": 1e4, "eps": 1e4}  # a step of ~1 x gradient


def sgd_step(before: dict, after: dict) -> dict:
    """The update of each weight (after - before), in units of the gradient for SGD_LIKE settings."""
    return {name: after[name] - before[name] for name in before}


def fixed_batch(rows=4, length=12, seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, length), generator=g)
    attention = torch.ones(rows, length, dtype=torch.long)
    attention[1, -3:] = 0  # right padding on one row
    response = torch.zeros(rows, length, dtype=torch.long)
    response[:, length // 2:] = 1
    response = response * attention
    return Batch({"input_ids": ids, "attention_mask": attention, "response_mask": response,
                  "advantages": torch.ones(rows, length), "old_logprobs": torch.zeros(rows, length)})


def ppo_loss_fn(micro, out, counts):
    """PPO surrogate with the batch's advantages and old log-probs (old = current at step 0)."""
    cfg = ActorLossConfig(agg_mode="token-mean")
    old = micro["old_logprobs"]
    return actor_loss(out.logprobs, old, micro["advantages"], micro["response_mask"].float(), cfg, counts=counts)


def with_old_logprobs(batch, logprobs):
    b = copy.copy(batch)
    b.tensors = dict(batch.tensors, old_logprobs=logprobs)
    return b


def subprocess_env(root) -> dict:
    """Environment for a check run in its own process: the repo importable, and a free MASTER_PORT
    (a DeepSpeed test in this process may hold the inherited one)."""
    import os
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "MASTER_PORT": str(port)}


def assert_greedy_matches_a_plain_forward(model, prompt: list[int], token_ids: list[int], logprobs: list[float]) -> None:
    """Greedy tokens and their log-probs from an engine equal one forward of the prompt and those tokens."""
    seq = torch.tensor([prompt + token_ids])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0, len(prompt) - 1: -1]
    assert logits.argmax(-1).tolist() == token_ids
    torch.testing.assert_close(torch.tensor(logprobs), torch.log_softmax(logits, -1).gather(
        -1, torch.tensor(token_ids)[:, None])[:, 0], atol=1e-5, rtol=0)
