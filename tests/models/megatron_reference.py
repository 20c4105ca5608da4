"""Run as a script: load HF weights converted by roll into megatron-core's own GPTModel (built by
roll's megatron_train model builder, local layers) and print the largest logit difference to HF.

megatron-core assumes CUDA in a few places; tests/strategies/megatron_cpu.py says what this CPU-only
check replaces (nothing that computes the result).
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(kinds: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29541"), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state

    from tests.strategies.megatron_cpu import patch_megatron_for_cpu

    patch_megatron_for_cpu()
    parallel_state.initialize_model_parallel(1, 1)

    from roll.configs.strategy_configs import MegatronConfig
    from roll.models.megatron_convert import hf_to_megatron
    from roll.strategies.megatron_model import build_gpt_model, layout_for
    from tests.models.test_megatron_convert import _hf_tensors, _model

    result = {}
    for kind in kinds:
        hf = _model(kind).eval()
        mc = MegatronConfig(make_vocab_size_divisible_by=8)
        model = build_gpt_model(hf.config, mc, "fp32", use_te=False, cpu_init=True).eval()
        converted = hf_to_megatron(_hf_tensors(hf), layout_for(hf.config, mc, use_te=False))
        own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        names_match = sorted(own) == sorted(converted)
        shapes_match = names_match and all(own[k].shape == converted[k].shape for k in own)
        model.load_state_dict(converted, strict=False)
        ids = torch.randint(0, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
        pos = torch.arange(9).expand(2, 9)
        causal = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1)[None, None].expand(2, 1, 9, 9)
        with torch.no_grad():
            ours = model(ids, pos, attention_mask=causal)[..., : hf.config.vocab_size]
            ref = hf(ids).logits
        result[kind] = {"names_match": names_match, "shapes_match": shapes_match,
                        "max_abs_diff": float((ours - ref).abs().max())}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
