"""Which megatron-core layers a ``lora_target`` names: plain data and one check, so that loading a megatron
LoRA config (roll.configs) needs neither torch nor megatron."""

from __future__ import annotations

MEGATRON_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
HF_OF_MEGATRON = {
    "linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "linear_proj": ("self_attn", ("o_proj",)),
    "linear_fc1": ("mlp", ("gate_proj", "up_proj")),
    "linear_fc2": ("mlp", ("down_proj",)),
}
MEGATRON_OF_HF = {hf: mc for mc, (_, names) in HF_OF_MEGATRON.items() for hf in names}


def megatron_targets(spec: str) -> list[str]:
    """megatron-core layer names for ROLL's ``lora_target`` on megatron_train; ValueError names what cannot be
    expressed there (a part of a fused layer, a regular expression, embeddings)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if any(c in spec for c in ("*", "$", "|", "(")):
        raise ValueError("regular expressions match HF module paths; on megatron_train name the layers "
                         f"({', '.join(MEGATRON_LINEARS)}, their HF names, or all-linear)")
    out: set[str] = set()
    for name in names:
        if name in ("all-linear", "all"):
            out.update(MEGATRON_LINEARS)
        elif name in MEGATRON_LINEARS:
            out.add(name)
        elif name in MEGATRON_OF_HF:
            fused = MEGATRON_OF_HF[name]
            group = HF_OF_MEGATRON[fused][1]
            missing = [g for g in group if g not in names]
            if missing:
                raise ValueError(f"{name} is part of megatron's fused {fused} ({','.join(group)}), which takes one "
                                 f"adapter: add {','.join(missing)} or name {fused}")
            out.add(fused)
        elif name in ("all-embedding", "all-router"):
            raise ValueError(f"{name}: megatron_train adapts linear layers only (all-linear or {', '.join(MEGATRON_LINEARS)})")
        else:
            raise ValueError(f"{name!r} is not a layer megatron_train can adapt: use all-linear, "
                             f"{', '.join(MEGATRON_LINEARS)} or their HF names")
    return sorted(out)


def hf_targets(targets: list[str]) -> list[str]:
    """HF module names of the megatron layers in ``targets``."""
    return sorted(hf for mc in targets for hf in HF_OF_MEGATRON[mc][1])
