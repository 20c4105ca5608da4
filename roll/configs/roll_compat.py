"""ROLL keys this project does not implement: accepted without effect, or refused.

``NO_EFFECT``: keys that change neither the loss, the sampled data nor the model (profiling,
offload and scheduling switches). A config that sets one loads; the loader prints one warning
naming every such key with the reason. ``REFUSED``: keys that would change training if they
worked; a config that sets one (to anything but its off value) stops at load with one line naming
the key and what to use instead. A key that is in neither table nor the schema is an error.
``docs/config.md`` lists both tables (generated from them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# section -> {key: why it has no effect here}
NO_EFFECT: dict[str, dict[str, str]] = {
    "pipeline": {
        "base_dir": "outputs go under output_dir",
        "profiler_timeline": "use the per-phase timings in the metrics instead",
        "profiler_memory": "there is no memory profiler",
        "profiler_output_dir": "no profiler output",
        "length_profiler_dir": "no profiler output",
        "report_length_and_rewards": "lengths and rewards are always logged",
        "is_offload_states": "colocated roles on a GPU always offload between phases (docs/backends.md lists what moves)",
        "is_offload_optimizer_states_in_train_step": "optimizer offload comes from the DeepSpeed config",
        "model_update_buffer_size_mb": "weight sync uses its own bucket size",
        "model_download_type": "models load from local folders, GGUF files or the HF hub",
        "user_defined_rollout_loop_cls": "ROLL reads it in its RLVR sampling scheduler only, not in agentic runs; "
        "agentic rollouts are customised with env_manager_cls / worker_cls",
        "offload_backend": "offload uses the strategy's own mechanism",
    },
    "worker": {
        "name": "the role name comes from the config section",
        "backend_timeout": "collectives use torch.distributed's default timeout",
        "max_concurrency": "actor concurrency is set by the scheduler",
        "offload_nccl": "no NCCL buffer offload",
        "use_sequence_packing": "sequence packing is not implemented",
        "sequence_packing_args": "sequence packing is not implemented",
        "logits_in_fp32": "log-probs are always computed in fp32",
    },
    "model_args": {
        "ulysses_size": "Ulysses sequence parallel is not implemented",
        "flash_attn": "use attn_implementation",
    },
    "training_args": {
        "seed": "the top-level seed is used",
        "max_steps": "derived from the top-level max_steps",
        "output_dir": "the top-level output_dir is used",
        "logging_steps": "the top-level logging_steps is used",
        "save_steps": "the top-level save_steps is used",
    },
    "data_args": {
        "dataset_dir": "agentic training reads no dataset",
        "preprocessing_num_workers": "agentic training reads no dataset",
    },
    "generating_args": {
        "length_penalty": "beam search is not used for RL rollouts",
        "early_stopping": "beam search is not used for RL rollouts",
    },
    "env_manager": {
        "name": "the manager name comes from the config section",
        "model_args": "env managers use actor_infer's tokenizer",
    },
    "custom_env": {
        "use_thread_lock": "our envs are re-entrant, and GEM envs always run their calls under one lock (they draw "
        "from Python's global random)",
    },
    "reward_normalization": {},
}


def _off(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values or v == {} or v == []


@dataclass(frozen=True)
class Refusal:
    """A ROLL key that would change training: refused at load unless ``is_off(value)``."""

    reason: str
    is_off: Callable[[Any], bool]


# section -> {key: refusal}
REFUSED: dict[str, dict[str, Refusal]] = {
    "pipeline": {
        "force_disable_old_logprobs_recompute": Refusal(
            "it makes ROLL reuse the training forward's log-probs as old log-probs even where they differ (several "
            "optimizer steps per rollout); here they are reused only where that is exact (enable_old_logprobs_recompute)",
            _off(False, None)),
    },
    "worker": {
        "apply_loss_scale": Refusal(
            "losses here are always normalised by the global batch's token/sequence counts, which is what true "
            "(ROLL's default) means; false would change the gradient scale", _off(True, None)),
    },
    "model_args": {
        "additional_target": Refusal(
            "modules trained in full beside LoRA adapters are not shipped; remove the key", _off(None, "", [])),
        "model_config_kwargs": Refusal(
            "overriding the model's config is not shipped: the model loads with its own config; remove the key",
            _off(None)),
    },
    "generating_args": {
        "min_new_tokens": Refusal("a minimum generation length is not shipped (it changes the sampled data); remove "
                                  "the key or set it to 0", _off(None, 0)),
    },
    "env_manager": {
        "llm_proxy": Refusal(
            "only the policy (actor_infer) answers the envs here; an openai or random proxy is not shipped",
            lambda v: v is None or (isinstance(v, dict) and v.get("proxy_type", "policy") == "policy")),
    },
}
