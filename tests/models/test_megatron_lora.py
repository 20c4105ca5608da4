"""LoRA on megatron's fused layers: ROLL's lora_target read for megatron_train, and the exact conversion of a
fused layer's adapter to HF's per-projection adapters (pure: no megatron-core import)."""

import pytest
import torch

from roll.configs.megatron_targets import hf_targets, megatron_targets
from roll.models.megatron_convert import GPTLayout, hf_to_megatron, megatron_to_hf
from roll.models.megatron_lora import lora_to_hf
from roll.models.tiny import build_tiny_model


def test_targets_for_megatron():
    assert megatron_targets("all-linear") == ["linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"]
    assert megatron_targets("q_proj,k_proj,v_proj,down_proj") == ["linear_fc2", "linear_qkv"]
    assert megatron_targets("linear_qkv, linear_proj") == ["linear_proj", "linear_qkv"]
    assert hf_targets(["linear_fc1", "linear_proj"]) == ["gate_proj", "o_proj", "up_proj"]
    with pytest.raises(ValueError, match="add up_proj"):
        megatron_targets("gate_proj")
    with pytest.raises(ValueError, match="regular expressions"):
        megatron_targets(".*proj")
    with pytest.raises(ValueError, match="not a layer"):
        megatron_targets("lm_head")


def test_a_fused_adapter_is_exactly_the_hf_adapters_it_converts_to(tmp_path):
    """W + s B A on megatron's fused qkv / fc1, converted to HF, equals each HF projection's W + s B_part A."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tiny"), dtype=torch.float32)
    layout = GPTLayout.from_hf_config(model.config, fused_norms=False)
    hf = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    mc = hf_to_megatron(hf, layout)
    gen, r, scale = torch.Generator().manual_seed(0), 3, 2.0
    a, b = {}, {}
    for key, w in mc.items():
        if key.endswith(("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")):
            a[key] = torch.randn(r, w.shape[1], generator=gen)
            b[key] = torch.randn(w.shape[0], r, generator=gen)
    merged = megatron_to_hf({k: w + scale * b[k] @ a[k] if k in a else w for k, w in mc.items()}, layout)
    adapters = lora_to_hf(a, b, layout)
    assert len(adapters) == 2 * 7 * layout.num_layers  # q k v o gate up down, A and B each
    for name, w in hf.items():
        prefix = f"base_model.model.{name.removesuffix('.weight')}"
        if f"{prefix}.lora_A.default.weight" in adapters:
            w = w + scale * adapters[f"{prefix}.lora_B.default.weight"] @ adapters[f"{prefix}.lora_A.default.weight"]
        torch.testing.assert_close(merged[name], w, rtol=0, atol=1e-5)
