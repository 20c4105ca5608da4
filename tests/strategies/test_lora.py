"""LoRA (peft) and freezing in deepspeed_train, the adapter sync to hf_infer, the reference as the base
model, adapter checkpoints and the merged export, on the tiny model."""

import dataclasses

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.configs.schema import ModelArgs
from roll.models.export import export_merged
from roll.models.logprobs import forward_logprobs
from roll.models.lora import base_name, target_modules
from roll.strategies.base import StrategyContext
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.strategies.hf_infer import HFInferStrategy
from roll.workers.actor_train import make_actor_loss_fn

from .helpers import fixed_batch, with_old_logprobs, worker_config

LOSS = make_actor_loss_fn(ActorLossConfig(agg_mode="token-mean"))


def lora_args(path, **kw):
    return ModelArgs(model_name_or_path=path, dtype="fp32", disable_gradient_checkpointing=True,
                     lora_target=kw.pop("target", "all-linear"), lora_rank=4, lora_alpha=8, **kw)


def make(path, model_args=None, stage=0, lr=5e-2):
    cfg = worker_config(path, stage=stage, lr=lr, micro=2, gas=2)
    if model_args is not None:
        cfg = dataclasses.replace(cfg, model_args=model_args)
    s = DeepSpeedTrainStrategy(cfg, StrategyContext(role="actor_train", seed=1))
    s.initialize()
    return s


def params(s):
    return {n: p.detach().clone() for n, p in s.engine.module.named_parameters()}


def step(s, batch):
    return s.train_step(with_old_logprobs(batch, s.compute_log_probs(batch)), LOSS)


@pytest.fixture(scope="module")
def batch():
    b = fixed_batch(seed=3)
    b.tensors["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(4, 12).contiguous()
    return b


def test_roll_target_syntax(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    linear = target_modules("all-linear", model)
    assert "q_proj" in linear and "down_proj" in linear and "lm_head" not in linear
    assert target_modules("q_proj, v_proj", model) == ["q_proj", "v_proj"]
    assert target_modules(".*layers\\.0.*(q|v)_proj", model) == ".*layers\\.0.*(q|v)_proj"  # a regex stays one


@pytest.mark.parametrize("stage", [0, 2])
def test_only_the_adapter_changes_after_a_step(tiny_model_path, batch, stage):
    s = make(tiny_model_path, lora_args(tiny_model_path), stage=stage)
    before = params(s)
    step(s, batch)
    after = params(s)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    lora = {n for n in before if ".lora_" in n}
    assert changed and changed <= lora
    if stage == 0:  # (ZeRO-2 keeps flat partitions of the same tensors)
        named = dict(s.engine.module.named_parameters())
        in_optimizer = {id(p) for g in s.optimizer.param_groups for p in g["params"]}
        assert in_optimizer and all(id(named[n]) in in_optimizer for n in lora) and len(in_optimizer) == len(lora)
    assert any(".lora_B." in n for n in changed)  # B starts at 0: the first step moves it


def test_freeze_module_prefix_freezes_those_weights(tiny_model_path, batch):
    s = make(tiny_model_path, ModelArgs(model_name_or_path=tiny_model_path, dtype="fp32", disable_gradient_checkpointing=True,
                                        freeze_module_prefix="model.embed_tokens,model.layers.0."))
    before = params(s)
    step(s, batch)
    after = params(s)
    frozen = [n for n in before if n.startswith(("model.embed_tokens", "model.layers.0."))]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in before if n.startswith("model.layers.1."))
    in_optimizer = {id(p) for g in s.optimizer.param_groups for p in g["params"]}
    named = dict(s.engine.module.named_parameters())
    assert not any(id(named[n]) in in_optimizer for n in frozen)  # no optimizer state for frozen weights


@pytest.fixture(scope="module")
def trained(tiny_model_path, batch):
    s = make(tiny_model_path, lora_args(tiny_model_path))
    step(s, batch)
    return s


def _infer(path):
    s = HFInferStrategy(worker_config(path, "hf_infer"))
    s.initialize()
    return s


def test_inference_matches_the_trainer_after_an_adapter_sync(tiny_model_path, batch, trained):
    infer = _infer(tiny_model_path)
    infer.configure_adapter(trained.adapter_config())
    sent = [t for bucket in trained.weight_buckets(adapters=True) for t in bucket]
    assert sent and all(".lora_" in n for n, _ in sent)
    assert sum(t.numel() for _, t in sent) < 0.2 * sum(p.numel() for p in trained.engine.module.parameters())
    infer.load_weights(sent)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(infer.compute_log_probs(batch)[mask], trained.compute_log_probs(batch)[mask], atol=1e-5, rtol=0)


def test_inference_matches_the_trainer_after_a_merged_sync(tiny_model_path, batch, trained):
    infer = _infer(tiny_model_path)
    merged = [t for bucket in trained.weight_buckets(adapters=False) for t in bucket]
    assert not any(".lora_" in n or "base_layer" in n for n, _ in merged)
    infer.load_weights(merged)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(infer.compute_log_probs(batch)[mask], trained.compute_log_probs(batch)[mask], atol=1e-5, rtol=0)


def test_the_reference_is_the_base_model(tiny_model_path, batch, trained):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = forward_logprobs(base, batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(trained.compute_log_probs(batch, adapters=False)[mask], plain[mask], atol=1e-6, rtol=0)
    assert (trained.compute_log_probs(batch)[mask] - plain[mask]).abs().max() > 1e-4  # the adapter does move the policy


def test_adapter_checkpoint_resumes_bit_exactly_and_exports_a_merged_model(tiny_model_path, batch, tmp_path):
    a = make(tiny_model_path, lora_args(tiny_model_path))
    step(a, batch)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    files = {p.name: p.stat().st_size for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    assert "adapter_model.safetensors" in files
    base_bytes = sum(p.numel() * 4 for p in a.engine.module.parameters() if not p.requires_grad)
    assert sum(files.values()) < base_bytes  # the frozen base weights are not in the checkpoint
    b = make(tiny_model_path, lora_args(tiny_model_path))
    b.load_checkpoint(str(tmp_path / "ckpt"))
    step(a, batch)
    step(b, batch)
    pa, pb = params(a), params(b)
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    # the exported merged model (peft from outside, merged) reproduces the policy saved in the checkpoint
    out = export_merged(tmp_path / "ckpt", tmp_path / "merged", base=tiny_model_path)
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    c = make(tiny_model_path, lora_args(tiny_model_path))
    c.load_checkpoint(str(tmp_path / "ckpt"))
    with torch.no_grad():
        exported = forward_logprobs(merged, batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(exported[mask], c.compute_log_probs(batch)[mask], atol=1e-5, rtol=0)


def test_base_names_of_peft_parameters():
    assert base_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert base_name("base_model.model.lm_head.weight") == "lm_head.weight"
