"""ROLL keys accepted for compatibility but without effect here.

A config written for ROLL loads unchanged: each key below is accepted, and the loader emits one
warning naming every such key it saw. A key that is neither in the schema nor listed here is an
error. ``docs/config.md`` lists these keys (generated from this table).
"""

from __future__ import annotations

# section -> {key: why it has no effect here}
NO_EFFECT: dict[str, dict[str, str]] = {
    "pipeline": {
        "base_dir": "outputs go under output_dir",
        "rollout_dump_dir": "rollout dumping is not implemented",
        "rollout_mock": "rollout dump/mock replay is not implemented",
        "profiler_timeline": "use the per-phase timings in the metrics instead",
        "profiler_memory": "there is no memory profiler",
        "profiler_output_dir": "no profiler output",
        "length_profiler_dir": "no profiler output",
        "report_length_and_rewards": "lengths and rewards are always logged",
        "is_offload_states": "colocated roles always offload between phases",
        "is_offload_optimizer_states_in_train_step": "optimizer offload comes from the DeepSpeed config",
        "model_update_buffer_size_mb": "weight sync uses its own bucket size",
        "model_download_type": "models load from local folders, GGUF files or the HF hub",
        "user_defined_rollout_loop_cls": "use env_manager_cls / worker_cls",
        "val_prompt_length": "validation uses prompt_length",
        "val_sequence_length": "validation uses sequence_length",
        "force_disable_old_logprobs_recompute": "the training forward's log-probs serve as old log-probs exactly "
        "when that is exact (see enable_old_logprobs_recompute), never otherwise",
        "train_infer_correction": "train/infer mismatch correction is not implemented",
        "offload_backend": "offload uses the strategy's own mechanism",
    },
    "worker": {
        "name": "the role name comes from the config section",
        "pg_variant": "the loss is chosen by the top-level loss keys",
        "backend_timeout": "collectives use torch.distributed's default timeout",
        "max_concurrency": "actor concurrency is set by the scheduler",
        "use_dynamic_batching_in_train": "micro-batches are cut by row count (per_device_train_batch_size)",
        "max_tokens_per_microbatch_in_train": "micro-batches are cut by row count (per_device_train_batch_size)",
        "sequence_length_round_in_train": "no sequence-length rounding",
        "use_dynamic_batching_in_infer": "log-prob passes are cut by row count (infer_batch_size)",
        "max_tokens_per_microbatch_in_infer": "log-prob passes are cut by row count (infer_batch_size)",
        "sequence_length_round_in_infer": "no sequence-length rounding",
        "offload_nccl": "no NCCL buffer offload",
        "use_sequence_packing": "sequence packing is not implemented",
        "sequence_packing_args": "sequence packing is not implemented",
        "logits_in_fp32": "log-probs are always computed in fp32",
        "apply_loss_scale": "losses are always normalised by global token/sequence counts",
    },
    "model_args": {
        "lora_target": "LoRA is not implemented",
        "lora_rank": "LoRA is not implemented",
        "lora_alpha": "LoRA is not implemented",
        "lora_dropout": "LoRA is not implemented",
        "ulysses_size": "Ulysses sequence parallel is not implemented",
        "freeze_module_prefix": "module freezing is not implemented",
        "flash_attn": "use attn_implementation",
        "model_config_kwargs": "model config overrides are not implemented",
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
        "min_new_tokens": "not supported by every backend",
        "length_penalty": "beam search is not used for RL rollouts",
        "early_stopping": "beam search is not used for RL rollouts",
    },
    "env_manager": {
        "name": "the manager name comes from the config section",
        "llm_proxy": "the policy is always actor_infer",
        "group_filter_cls": "group filtering is not implemented",
        "model_args": "env managers use actor_infer's tokenizer",
    },
    "custom_env": {
        "use_thread_lock": "env generation is re-entrant; no lock is needed",
        "max_env_step_concurrent": "env steps are scheduled by the rollout scheduler",
    },
    "reward_normalization": {},
}
