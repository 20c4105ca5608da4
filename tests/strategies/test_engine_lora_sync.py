"""LoRA weight sync into vllm and sglang on CPU: the engines' LoRA start arguments, and the adapter path
(buckets gathered, written once as a peft folder, registered under a new id or name, the previous one removed,
every request naming the current one) against stand-ins for the engine calls. The folder the engines load is
checked with peft itself: it reproduces the trainer's log-probs. The engines run on a GPU machine only
(scripts/gpu/check_vllm.py / check_sglang.py, LoRA part)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from roll.configs.strategy_configs import parse_strategy_config
from roll.distributed.batch import Batch
from roll.strategies import sglang as sglang_strategy
from roll.strategies import vllm as vllm_strategy
from roll.strategies.adapter_folders import AdapterFolders, vllm_lora_slot
from roll.strategies.base import SamplingParams, StrategyContext
from tests.strategies.helpers import fixed_batch, worker_config
from tests.strategies.test_gpu_engines_plumbing import _FakeSGLang, _vllm, fake_vllm  # noqa: F401 (fixture)
from tests.strategies.test_lora import _infer, lora_args, make, step


@pytest.fixture(scope="module")
def trained(tiny_model_path):
    """A deepspeed_train LoRA policy after one step (B is no longer 0: the adapter changes the outputs)."""
    b = fixed_batch(seed=3)
    b.tensors["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(4, 12).contiguous()
    s = make(tiny_model_path, lora_args(tiny_model_path))
    step(s, b)
    return s


def _adapter_buckets(trained):
    sent = [t for bucket in trained.weight_buckets(adapters=True) for t in bucket]
    half = len(sent) // 2
    return [sent[:half], sent[half:]]  # two buckets: the engine must gather them before loading


def test_lora_start_arguments() -> None:
    assert [vllm_lora_slot(r) for r in (1, 4, 8, 20, 32, 300, 512, 600)] == [1, 8, 8, 32, 32, 320, 512, None]
    c = parse_strategy_config("vllm", {})
    kw = vllm_strategy.engine_kwargs(c, "/m", "bf16", 1, colocated=False, max_len=512, lora_rank=32)
    assert kw["enable_lora"] is True and kw["max_lora_rank"] == 32 and kw["max_loras"] == 1
    assert "enable_lora" not in vllm_strategy.engine_kwargs(c, "/m", "bf16", 1, colocated=False, max_len=512)
    sc = parse_strategy_config("sglang", {})
    kw = sglang_strategy.engine_kwargs(sc, "/m", "bf16", 1, colocated=False, max_len=512, lora_rank=16)
    assert kw["enable_lora"] is True and kw["max_lora_rank"] == 16 and kw["lora_target_modules"] == ["all"]
    assert "enable_lora" not in sglang_strategy.engine_kwargs(sc, "/m", "bf16", 1, colocated=False, max_len=512)


def test_when_the_engines_take_adapters(fake_vllm) -> None:  # noqa: F811
    assert _vllm(colocated=False, lora_rank=4)[0].accepts_adapters
    assert not _vllm(colocated=False)[0].accepts_adapters  # no LoRA run
    assert not _vllm(colocated=False, lora_rank=4, strategy_config={"lora_adapters": False})[0].accepts_adapters
    # no base weights to adapt: the random start, and level-2 sleep between rollouts
    assert not _vllm(colocated=False, lora_rank=4, strategy_config={"load_format": "dummy"})[0].accepts_adapters
    assert not _vllm(colocated=True, lora_rank=4, strategy_config={"sleep_level": 2})[0].accepts_adapters
    assert _vllm(colocated=True, lora_rank=4, strategy_config={"sleep_level": 1})[0].accepts_adapters
    assert not _vllm(colocated=False, lora_rank=600)[0].accepts_adapters  # above vLLM's largest LoRA slot

    def sg(rank, **config):
        cfg = worker_config("unused", "sglang")
        cfg = dataclasses.replace(cfg, strategy_args=dataclasses.replace(cfg.strategy_args, strategy_config=config))
        return sglang_strategy.SGLangStrategy(cfg, StrategyContext(role="actor_infer", lora_rank=rank))

    assert sg(4).accepts_adapters and not sg(None).accepts_adapters
    assert not sg(4, lora_adapters=False).accepts_adapters and not sg(4, load_format="dummy").accepts_adapters


def _peft_logprobs(path: str, folder: str, batch: Batch) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import forward_logprobs

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        return forward_logprobs(model, batch["input_ids"], batch["attention_mask"], None, micro_batch_size=4)


def test_vllm_adapter_sync(fake_vllm, tiny_model_path, trained) -> None:  # noqa: F811
    s, engine = _vllm(colocated=False, lora_rank=4)
    s.adapters = AdapterFolders()  # what initialize() sets up when the engine has LoRA slots
    s.generate([[5, 6]], SamplingParams(max_new_tokens=1))
    assert engine.loras_named == [None]  # before the first sync: the base model
    s.configure_adapter(trained.adapter_config())
    for bucket in _adapter_buckets(trained):
        s.load_weights(bucket)
    assert not any(c[0] in ("add_lora", "rpc") for c in engine.calls)  # nothing loads before the sync is whole
    s.finish_weight_sync()
    adds = [c for c in engine.calls if c[0] == "add_lora"]
    assert [c[1] for c in adds] == [1]
    folder = adds[0][2]
    assert sorted(os.listdir(folder)) == ["adapter_config.json", "adapter_model.safetensors"]
    batch = fixed_batch(seed=5)
    mask = batch["attention_mask"].bool()
    # the folder the engine loads holds the trained policy: peft on the base model gives the trainer's log-probs
    torch.testing.assert_close(_peft_logprobs(tiny_model_path, folder, batch)[mask],
                               trained.compute_log_probs(batch)[mask], atol=1e-5, rtol=0)

    s.generate([[5, 6], [7]], SamplingParams(max_new_tokens=1))
    s.compute_log_probs(Batch({"input_ids": torch.tensor([[3, 4]]), "attention_mask": torch.tensor([[1, 1]])}))
    assert [r.lora_int_id for r in engine.loras_named[1:]] == [1, 1, 1]  # every request names the adapter

    for bucket in _adapter_buckets(trained):  # the next sync: a new id, the old one removed with its folder
        s.load_weights(bucket)
    s.finish_weight_sync()
    assert [c[:2] for c in engine.calls if c[0] in ("add_lora", "remove_lora")] == [("add_lora", 1), ("add_lora", 2),
                                                                                   ("remove_lora", 1)]
    assert not os.path.exists(folder) and s.lora_request.lora_int_id == 2
    s.finish_weight_sync()  # no adapter arrived: nothing to register
    assert len([c for c in engine.calls if c[0] == "add_lora"]) == 2
    s.adapters.add([("base_model.model.lm_head.lora_A.default.weight", torch.zeros(4, 8))])
    with pytest.raises(ValueError, match="lm_head"):  # vLLM's prompt log-probs would leave it out
        s.finish_weight_sync()
    s.adapters.pending.clear()
    with pytest.raises(KeyError, match="not a LoRA adapter tensor"):
        s.load_weights([("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", torch.zeros(1)),
                        ("model.norm.weight", torch.ones(4))])
    s.adapters.close()


def test_sglang_adapter_sync(tiny_model_path, trained) -> None:
    cfg = worker_config("unused", "sglang")
    s = sglang_strategy.SGLangStrategy(cfg, StrategyContext(role="actor_infer", lora_rank=4))
    s.engine = engine = _FakeSGLang()
    s.adapters = AdapterFolders()
    s.configure_adapter(trained.adapter_config())
    for bucket in _adapter_buckets(trained):
        s.load_weights(bucket)
    assert not any(c[0] in ("load_lora", "update") for c in engine.calls)
    s.finish_weight_sync()
    (load,) = [c for c in engine.calls if c[0] == "load_lora"]
    batch = fixed_batch(seed=5)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(_peft_logprobs(tiny_model_path, load[2], batch)[mask],
                               trained.compute_log_probs(batch)[mask], atol=1e-5, rtol=0)
    s.generate([[4], [9]], SamplingParams(max_new_tokens=2))
    assert engine.loras_named[-1] == [load[1], load[1]]
    for bucket in _adapter_buckets(trained):
        s.load_weights(bucket)
    s.finish_weight_sync()
    kinds = [c[:2] for c in engine.calls if c[0] in ("load_lora", "unload_lora")]
    assert kinds == [("load_lora", "roll-policy-v1"), ("unload_lora", "roll-policy-v1"), ("load_lora", "roll-policy-v2")]
    assert not os.path.exists(load[2])
    s.adapters.close()




@pytest.fixture(scope="module")
def untied_model_path(tmp_path_factory):
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("untied"), tie_word_embeddings=False))


@pytest.mark.parametrize("target, names", [
    # SGLang reads target_modules only as a list of names: a regex is written as the modules it adapted
    (r".*layers\.0\.self_attn\.(q_proj|v_proj)", ["q_proj", "v_proj"]),
    # ROLL's all-embedding: peft names an embedding's adapter lora_embedding_A / _B, without a .weight
    ("all-linear,all-embedding", None),
])
def test_engine_folders_of_other_targets(untied_model_path, target, names) -> None:
    """The folder the engines load holds the trained policy for every lora_target form (peft reads it back)."""
    import json

    tiny_model_path = untied_model_path

    b = fixed_batch(seed=3)
    b.tensors["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(4, 12).contiguous()
    s = make(tiny_model_path, lora_args(tiny_model_path, target=target))
    step(s, b)
    folders = AdapterFolders()
    folders.configure(s.adapter_config())
    for bucket in _adapter_buckets(s):
        folders.add(bucket)
    _, folder = folders.publish()
    with open(os.path.join(folder, "adapter_config.json")) as f:
        written = json.load(f)["target_modules"]
    assert isinstance(written, list) and (names is None or sorted(written) == names)  # a list (peft keeps no order)
    batch = fixed_batch(seed=5)
    mask = batch["attention_mask"].bool()
    got, want = _peft_logprobs(tiny_model_path, folder, batch)[mask], s.compute_log_probs(batch)[mask]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    folders.close()


def test_embedding_adapter_on_tied_embeddings_is_refused(tiny_model_path, untied_model_path) -> None:
    """With a shared input / output weight a merge would move the head too: merged syncs and the export would not
    be the trained policy, so the combination stops at start; untied, the merged weights are the policy."""
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        make(tiny_model_path, lora_args(tiny_model_path, target="all-linear,all-embedding"))
    b = fixed_batch(seed=3)
    b.tensors["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(4, 12).contiguous()
    s = make(untied_model_path, lora_args(untied_model_path, target="all-linear,all-embedding"))
    step(s, b)
    infer = _infer(untied_model_path)
    infer.load_weights([t for bucket in s.weight_buckets(adapters=False) for t in bucket])
    mask = b["attention_mask"].bool()
    torch.testing.assert_close(infer.compute_log_probs(b)[mask], s.compute_log_probs(b)[mask], atol=1e-5, rtol=0)


def test_embedding_adapter_on_tied_embeddings_stops_at_load(tiny_model_path, untied_model_path, tmp_path) -> None:
    """With the model's config.json at hand the refusal comes at load, before any worker starts."""
    from roll.configs.errors import ConfigError
    from roll.configs.loading import load_config
    from roll.preflight import check_inputs

    def cfg(path):
        return load_config("agentic_sokoban", overrides=[f"pretrain={path}", f"output_dir={tmp_path}",
                                                         "+actor_train.model_args.lora_target='all-linear,all-embedding'"]).config

    with pytest.raises(ConfigError, match="actor_train.model_args.lora_target.*tie_word_embeddings"):
        check_inputs(cfg(tiny_model_path))
    check_inputs(cfg(untied_model_path))
