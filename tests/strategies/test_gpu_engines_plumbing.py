"""vllm / sglang strategies on CPU: their engine arguments, and their plumbing (row order, log-prob
positions, per-row seeds, sleep/wake and cache resets) against stand-ins for the few engine calls
they make, so it is checked where no engine is installed. vLLM's CPU build runs the same plumbing for real in
tests/vllm_cpu (all but sleep/wake, which it does not have); SGLang runs only on a GPU (scripts/gpu/)."""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from roll.configs.errors import ConfigError
from roll.configs.strategy_configs import parse_strategy_config
from roll.distributed.batch import Batch
from roll.strategies import sglang as sglang_strategy
from roll.strategies import vllm as vllm_strategy
from roll.strategies.backends import check_passthrough
from roll.strategies.base import SamplingParams, StrategyContext
from tests.strategies.helpers import worker_config


def test_vllm_engine_kwargs() -> None:
    c = parse_strategy_config("vllm", {"gpu_memory_utilization": 0.6, "block_size": 16, "load_format": "dummy",
                                       "tensor_parallel_size": 2, "swap_space": 4})
    kw = vllm_strategy.engine_kwargs(c, "/m", "bf16", 7, colocated=True, max_len=4096)
    assert kw["dtype"] == "bfloat16" and kw["seed"] == 7 and kw["tensor_parallel_size"] == 2
    assert kw["gpu_memory_utilization"] == 0.6 and kw["block_size"] == 16 and kw["load_format"] == "dummy"
    assert kw["enable_sleep_mode"] is True and kw["max_model_len"] == 4096 and kw["swap_space"] == 4
    assert kw["logprobs_mode"] == "raw_logprobs"  # log-probs before temperature, as training computes them
    assert kw["worker_extension_cls"] == "roll.strategies.vllm_worker.RollWorkerExtension"
    c2 = parse_strategy_config("vllm", {"enable_sleep_mode": False, "max_model_len": 2048})
    kw2 = vllm_strategy.engine_kwargs(c2, "/m", None, 0, colocated=True, max_len=4096)
    assert kw2["enable_sleep_mode"] is False and kw2["max_model_len"] == 2048 and "block_size" not in kw2


def test_sglang_engine_kwargs_and_sampling() -> None:
    c = parse_strategy_config("sglang", {"mem_fraction_static": 0.7, "tp_size": 2, "load_format": "dummy"})
    kw = sglang_strategy.engine_kwargs(c, "/m", "bf16", 3, colocated=True, max_len=1024)
    assert kw["tp_size"] == 2 and kw["mem_fraction_static"] == 0.7 and kw["enable_memory_saver"] is True
    assert kw["context_length"] == 1024 and kw["random_seed"] == 3 and kw["dtype"] == "bfloat16"
    greedy = sglang_strategy.sampling_dict(SamplingParams(max_new_tokens=5, temperature=0.0, top_k=50), None)
    assert greedy == {"max_new_tokens": 5, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    sampled = sglang_strategy.sampling_dict(SamplingParams(temperature=0.7, top_k=50, stop_strings=("</a>",)), 11)
    assert sampled["top_k"] == 50 and sampled["stop"] == ["</a>"] and sampled["sampling_seed"] == 11


def test_passthrough_keys_are_checked_against_the_engine() -> None:
    check_passthrough({"swap_space": 4}, {"swap_space", "enforce_eager"}, "actor_infer.strategy_args.strategy_config")
    with pytest.raises(ConfigError, match="swap_spce: is not an argument of the installed engine; did you mean 'swap_space'"):
        check_passthrough({"swap_spce": 4}, {"swap_space"}, "actor_infer.strategy_args.strategy_config")


# --- a stand-in for vLLM's AsyncLLM surface: generate (async iterator), collective_rpc, sleep/wake, cache reset


@dataclass
class _Lp:
    logprob: float


@dataclass
class _FakeAsyncLLM:
    calls: list = field(default_factory=list)
    loras_named: list = field(default_factory=list)  # the lora_request of each generate call
    payloads: list = field(default_factory=list)  # the arguments of each collective_rpc

    async def generate(self, prompt: dict, params: Any, request_id: str, lora_request: Any = None):
        ids = prompt["prompt_token_ids"]
        self.calls.append(("generate", tuple(ids), params.kw.get("seed")))
        self.loras_named.append(lora_request)
        if params.kw.get("prompt_logprobs") == 0:  # log p(x_t) = -t/10 for prompt token t
            lps = [None] + [{tok: _Lp(-t / 10)} for t, tok in enumerate(ids) if t > 0]
            yield types.SimpleNamespace(prompt_logprobs=lps, outputs=[])
            return
        n = params.kw["max_tokens"]
        tokens = [ids[-1] + 1 + i for i in range(n)]  # count up from the last prompt token
        stop = 2 in ids  # a prompt holding token 2 "hits EOS" after one token
        tokens = tokens[:1] if stop else tokens
        lps = [{tok: _Lp(-0.5 * (i + 1))} for i, tok in enumerate(tokens)]
        yield types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tokens, logprobs=lps,
                                                                   finish_reason="stop" if stop else "length")])

    async def collective_rpc(self, method: str, args: tuple = ()):
        # vLLM carries these arguments to its engine process with msgpack: a tensor inside a list arrives there as a
        # plain list (seen on vLLM 0.32), bytes arrive whole
        assert all(isinstance(a, (bytes, str, int, float)) for a in args), [type(a) for a in args]
        self.calls.append(("rpc", method, len(args[0]) if args else 0))
        self.payloads.append(args)
        return [1.0]

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    async def add_lora(self, request: Any) -> bool:
        self.calls.append(("add_lora", request.lora_int_id, request.lora_path))
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove_lora", lora_id))
        return True

    async def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def shutdown(self):
        pass


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Sampling:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    root = types.ModuleType("vllm")
    root.SamplingParams = _Sampling
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final")
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    lora = types.ModuleType("vllm.lora.request")

    @dataclass
    class _LoRARequest:  # the keyword fields of vllm.lora.request.LoRARequest that the strategy sets
        lora_name: str
        lora_int_id: int
        lora_path: str

    lora.LoRARequest = _LoRARequest
    for name, mod in {"vllm": root, "vllm.sampling_params": sp, "vllm.inputs": inputs, "vllm.lora.request": lora}.items():
        monkeypatch.setitem(sys.modules, name, mod)


def _vllm(colocated: bool, lora_rank: int | None = None,
          strategy_config: dict | None = None) -> tuple[vllm_strategy.VLLMStrategy, _FakeAsyncLLM]:
    from roll.strategies.async_runner import LoopThread

    cfg = worker_config("unused", "vllm")
    if strategy_config:
        cfg = dataclasses.replace(cfg, strategy_args=dataclasses.replace(cfg.strategy_args, strategy_config=strategy_config))
    s = vllm_strategy.VLLMStrategy(cfg, StrategyContext(role="actor_infer", colocated=colocated, lora_rank=lora_rank))
    s.engine, s.runner = _FakeAsyncLLM(), LoopThread()
    return s, s.engine


def test_vllm_generate_keeps_row_order_seeds_rows_and_reports_finish(fake_vllm: None) -> None:
    s, engine = _vllm(colocated=False)
    out = s.generate([[5, 6], [2, 9], [5, 6]], SamplingParams(max_new_tokens=3, temperature=1.0, seed=100))
    assert [g.token_ids for g in out] == [[7, 8, 9], [10], [7, 8, 9]]
    assert out[0].logprobs == [-0.5, -1.0, -1.5] and out[1].logprobs == [-0.5]
    assert [g.finish_reason for g in out] == ["length", "stop", "length"]
    seeds = sorted(c[2] for c in engine.calls if c[0] == "generate")
    assert seeds == [100, 101, 102]  # identical prompts of a group must not share a sampling seed


def test_vllm_log_probs_land_on_the_attended_positions(fake_vllm: None) -> None:
    s, _ = _vllm(colocated=False)
    batch = Batch({"input_ids": torch.tensor([[3, 4, 5, 0], [0, 7, 8, 9]]),
                   "attention_mask": torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])})
    lp = s.compute_log_probs(batch)
    assert torch.allclose(lp, torch.tensor([[0.0, -0.1, -0.2, 0.0], [0.0, 0.0, -0.1, -0.2]]))


def test_vllm_colocated_sleep_wake_and_sync(fake_vllm: None) -> None:
    s, engine = _vllm(colocated=True)
    s.offload()
    s.offload()  # already asleep: no second call
    s.load_weights([("model.norm.weight", torch.ones(4))])  # wakes the weights only, then resets the cache
    s.generate([[1]], SamplingParams(max_new_tokens=1))  # wakes the KV cache
    kinds = [c[:2] for c in engine.calls if c[0] != "generate"]
    assert kinds == [("sleep", 1), ("wake_up", ("weights",)), ("rpc", "roll_load_weights"), ("reset_prefix_cache",),
                     ("wake_up", None)]
    s2, engine2 = _vllm(colocated=False)
    s2.offload()
    assert engine2.calls == []  # not colocated: the engine keeps its memory


def test_vllm_weight_bucket_reaches_the_worker_whole(fake_vllm: None) -> None:
    """A bucket crosses collective_rpc as bytes and the worker extension hands the model's load_weights the same
    names, dtypes and values."""
    from roll.strategies.vllm_worker import RollWorkerExtension

    s, engine = _vllm(colocated=False)
    sent = [("model.norm.weight", torch.randn(4)), ("model.embed_tokens.weight", torch.randn(6, 4).bfloat16()),
            ("model.layers.0.mlp.up_proj.weight", torch.arange(24.0).view(8, 3)[::2])]  # a strided view
    s.load_weights(sent)
    (payload,) = engine.payloads[-1]

    class _Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))
            self.got: dict = {}

        def load_weights(self, weights):
            self.got = dict(weights)

    worker = RollWorkerExtension()
    worker.model_runner = types.SimpleNamespace(model=_Model())
    assert worker.roll_load_weights(payload) == 3
    got = worker.model_runner.model.got
    assert sorted(got) == sorted(n for n, _ in sent)
    for name, tensor in sent:
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)


class _FakeSGLang:
    def __init__(self) -> None:
        self.calls: list = []
        self.loras_named: list = []  # the lora_path of each generate call

    def generate(self, input_ids, sampling_params, return_logprob, logprob_start_len=None, lora_path=None):
        self.calls.append(("generate", len(input_ids)))
        self.loras_named.append(lora_path)
        if logprob_start_len == 0:
            return [{"meta_info": {"input_token_logprobs": [(None, ids[0], None)] + [(-0.1 * t, tok, None)
                                                                                    for t, tok in enumerate(ids) if t]}}
                    for ids in input_ids]
        return [{"meta_info": {"output_token_logprobs": [(-0.25, ids[-1] + 1, None), (-0.75, 2, None)],
                               "finish_reason": {"type": "stop", "matched": 2}}} for ids in input_ids]

    def load_lora_adapter(self, lora_name: str, lora_path: str):
        self.calls.append(("load_lora", lora_name, lora_path))
        return types.SimpleNamespace(success=True, error_message=None)

    def unload_lora_adapter(self, lora_name: str):
        self.calls.append(("unload_lora", lora_name))
        return types.SimpleNamespace(success=True, error_message=None)

    def update_weights_from_tensor(self, named_tensors, flush_cache):
        self.calls.append(("update", len(named_tensors), flush_cache))

    def release_memory_occupation(self):
        self.calls.append(("release",))

    def resume_memory_occupation(self):
        self.calls.append(("resume",))


def test_sglang_plumbing() -> None:
    cfg = worker_config("unused", "sglang")
    s = sglang_strategy.SGLangStrategy(cfg, StrategyContext(role="actor_infer", colocated=True))
    s.engine = engine = _FakeSGLang()
    out = s.generate([[4], [9]], SamplingParams(max_new_tokens=2))
    assert [g.token_ids for g in out] == [[5, 2], [10, 2]] and out[0].logprobs == [-0.25, -0.75]
    assert out[0].finish_reason == "stop"
    batch = Batch({"input_ids": torch.tensor([[0, 3, 4]]), "attention_mask": torch.tensor([[0, 1, 1]])})
    assert torch.allclose(s.compute_log_probs(batch), torch.tensor([[0.0, 0.0, -0.1]]))
    s.offload()
    s.load_weights([("a", torch.zeros(1))])
    assert engine.calls[-3:] == [("release",), ("resume",), ("update", 1, True)]


@pytest.mark.parametrize("script", ["check_vllm.py", "check_sglang.py", "check_megatron.py"])
def test_gpu_checks_stop_with_a_clear_message_without_cuda(script: str) -> None:
    import subprocess
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check itself is what runs here")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "scripts/gpu" / script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "needs a CUDA GPU and this machine has none" in run.stderr
    compile(Path(root / "scripts/gpu/_inference_check.py").read_text(), "_inference_check.py", "exec")
