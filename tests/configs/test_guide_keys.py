"""Every key documented in ROLL's configuration guide is accepted with its meaning."""

import re
from pathlib import Path

import pytest

from roll.configs.docs import render_markdown
from roll.configs.errors import ConfigError
from roll.configs.loading import load_config

from .conftest import REPO, write

# Each key the guide documents, with a value to set and where it must land in the typed config.
PIPELINE_KEYS = {
    "exp_name": "guide_run", "seed": 7, "rpc_timeout": 60, "logging_dir": "./o/logs", "output_dir": "./o",
    "render_save_dir": "./o/render", "system_envs": {"USE_MODELSCOPE": "1"}, "track_with": "stdout",
    "tracker_kwargs": {"log_dir": "./o/tb"}, "num_gpus_per_node": 1, "max_steps": 3, "save_steps": 2,
    "logging_steps": 1, "eval_steps": 2, "resume_from_checkpoint": False, "checkpoint_config": {"type": "file_system"},
    "rollout_batch_size": 4, "val_batch_size": 4, "prompt_length": 128, "response_length": 128, "sequence_length": 256,
    "local_rank": -1, "num_nodes": 1, "generate_opt_level": 1, "is_num_return_sequences_expand": False,
    "max_running_requests": 32, "is_use_additional_prompts": False, "max_additional_running_prompts": 4,
    "num_return_sequences_in_group": 1, "ppo_epochs": 2, "max_grad_norm": 0.5, "l2": 0.0, "lambd": 0.9,
    "gamma": 0.99, "kl_penalty": "mse", "init_kl_coef": 0.0, "kl_horizon": 500, "use_reward_scaling": True,
    "add_len_reward": False, "reward_clip": 5.0, "difficulty_loss_weight": False, "length_loss_weight": False,
    "use_reward_norm": True, "whiten_rewards": True, "whiten_advantages": True, "advantage_clip": 0.2,
    "adv_estimator": "grpo", "reward_norm": "group", "reward_shift": True, "reward_scale": False,
    "add_token_level_kl": False, "critic_warmup": 1, "use_kl_loss": False, "kl_loss_coef": 0.1,
    "entropy_loss_coef": 0.01, "sft_loss_coef": 0.1, "use_topr_loss": True, "rl_loss_coef": 0.9,
    "dual_clip_loss": True, "loss_agg_mode": "token-mean",
}
WORKER_KEYS = {  # per role, dotted under the role
    "world_size": 1, "device_mapping": "list(range(0,1))", "num_gpus_per_worker": 1, "model_update_frequency": 2,
    "infer_batch_size": 4, "model_args.dtype": "bf16", "model_args.disable_gradient_checkpointing": True,
    "data_args.template": "native", "data_args.file_name": "train.json", "data_args.prompt": "instruction",
    "training_args.learning_rate": 2.0e-6, "training_args.weight_decay": 0.01,
    "training_args.per_device_train_batch_size": 2, "training_args.gradient_accumulation_steps": 2,
    "training_args.warmup_steps": 5,
}
INFER_KEYS = {"generating_args.max_new_tokens": 64, "generating_args.temperature": 0.7, "data_args.messages": "messages"}
ENV_MANAGER_KEYS = {  # the guide's names, including its aliases env_groups / n_groups
    "env_groups": 2, "group_size": 2, "tags": ["SimpleSokoban"], "n_groups": [2], "max_traj_per_env": 3,
    "format_penalty": -0.1, "worker_cls": "my.pkg.EnvWorker",
}
STRATEGY_CONFIG_KEYS = {
    "megatron_train": {
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 1,
        "context_parallel_size": 1, "virtual_pipeline_model_parallel_size": None, "sequence_parallel": True,
        "recompute_granularity": "selective", "moe_layer_recompute": False, "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": True, "moe_shared_expert_overlap": False, "overlap_grad_reduce": True,
    },
    "vllm": {"gpu_memory_utilization": 0.6, "block_size": 16, "max_model_len": 8000, "load_format": "dummy"},
    "sglang": {"mem_fraction_static": 0.7, "load_format": "dummy"},
}


def _nest(flat):
    out = {}
    for dotted, value in flat.items():
        node = out
        *head, leaf = dotted.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


# What the guide config sets without effect here: keys ROLL itself leaves unused in agentic runs, dataset keys,
# role keys set on roles that do not read them, and prompt/response lengths beside sequence_length.
EXPECTED_INERT = {
    "checkpoint_config", "use_reward_scaling", "use_reward_norm", "max_additional_running_prompts",
    "prompt_length", "response_length",
    "actor_train.data_args.file_name", "actor_train.data_args.prompt",
    "actor_infer.data_args.file_name", "actor_infer.data_args.messages",
    "actor_infer.model_update_frequency", "actor_infer.model_args.disable_gradient_checkpointing",
    "actor_infer.infer_batch_size", "actor_infer.training_args.learning_rate", "actor_infer.training_args.weight_decay",
    "actor_infer.training_args.per_device_train_batch_size", "actor_infer.training_args.gradient_accumulation_steps",
    "actor_infer.training_args.warmup_steps",
}


def _guide_config(train_strategy="deepspeed_train", infer_strategy="hf_infer", infer_config=None, train_config=None):
    actor_train = _nest(WORKER_KEYS) | {"strategy_args": {"strategy_name": train_strategy, "strategy_config": train_config}}
    infer = {k: v for k, v in WORKER_KEYS.items() if not k.startswith("data_args.prompt")} | INFER_KEYS
    actor_infer = _nest(infer) | {"strategy_args": {"strategy_name": infer_strategy, "strategy_config": infer_config}}
    env_manager = dict(ENV_MANAGER_KEYS)
    return PIPELINE_KEYS | {
        "reward_normalization": {"grouping": "state", "method": "identity"},  # reward_norm above is the one normalisation
        "custom_envs": {"SimpleSokoban": {"env_type": "sokoban", "env_config": {"dim_room": [6, 6]}}},
        "train_env_manager": env_manager,
        "val_env_manager": env_manager | {"env_groups": 4, "group_size": 1, "n_groups": [4], "max_traj_per_env": -1},
        "actor_train": actor_train,
        "actor_infer": actor_infer,
    }


def _load(tmp_path: Path, data) -> object:
    write(tmp_path / "guide.yaml", _yaml(data))
    loaded = load_config("guide", tmp_path)
    # every key without effect is named in the warning, and only those
    assert set(loaded.inert) == EXPECTED_INERT, sorted(set(loaded.inert) ^ EXPECTED_INERT)
    return loaded.config


def test_every_guide_key_is_accepted_and_lands(tmp_path):
    cfg = _load(tmp_path, _guide_config())
    for key, value in PIPELINE_KEYS.items():
        assert getattr(cfg, key) == value, key
    for role in ("actor_train", "actor_infer"):
        worker = getattr(cfg, role)
        for dotted, value in WORKER_KEYS.items():
            if role == "actor_infer" and dotted == "data_args.prompt":
                continue
            obj = worker
            for part in dotted.split("."):
                obj = getattr(obj, part)
            expected = [0] if dotted == "device_mapping" else value
            assert obj == expected, f"{role}.{dotted}"
    assert cfg.actor_infer.generating_args.max_new_tokens == 64
    assert cfg.actor_infer.generating_args.temperature == 0.7
    assert cfg.actor_infer.data_args.messages == "messages"
    em = cfg.train_env_manager
    assert (em.num_env_groups, em.group_size, em.tags, em.num_groups_partition) == (2, 2, ["SimpleSokoban"], [2])
    assert (em.max_traj_per_env, em.format_penalty, em.worker_cls) == (3, -0.1, "my.pkg.EnvWorker")
    assert cfg.reward_normalization.grouping == "state" and cfg.reward_normalization.method == "identity"


@pytest.mark.parametrize(
    "role, strategy",
    [("actor_train", "megatron_train"), ("actor_infer", "vllm"), ("actor_infer", "sglang")],
)
def test_strategy_config_keys_reach_the_strategy(tmp_path, role, strategy):
    sc = STRATEGY_CONFIG_KEYS[strategy]
    data = _guide_config(
        train_strategy=strategy if role == "actor_train" else "deepspeed_train",
        infer_strategy=strategy if role == "actor_infer" else "hf_infer",
        train_config=sc if role == "actor_train" else None,
        infer_config=sc if role == "actor_infer" else None,
    )
    cfg = _load(tmp_path, data)
    got = getattr(cfg, role).strategy_args.strategy_config
    assert sc.items() <= got.items()
    # engines get the tensor parallel size from num_gpus_per_worker, as in ROLL
    assert set(got) - set(sc) <= ({"tensor_parallel_size"} if role == "actor_infer" else set())
    if role == "actor_infer":
        assert got["tensor_parallel_size"] == cfg.actor_infer.num_gpus_per_worker


@pytest.mark.parametrize(
    "key, values",
    [
        ("kl_penalty", ["kl", "abs", "mse"]),
        ("adv_estimator", ["reinforce", "grpo"]),
        ("reward_norm", ["batch", "group", "running", None]),
        ("loss_agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
        ("track_with", ["wandb", "tensorboard", "stdout"]),
    ],
)
def test_every_documented_option_value_is_accepted(tmp_path, key, values):
    for value in values:
        cfg = _load(tmp_path, _guide_config() | {key: value})
        assert getattr(cfg, key) == value


@pytest.mark.parametrize("grouping", ["state", "batch", "inductive", "traj_group_id", "tags"])
@pytest.mark.parametrize("method", ["asym_clip", "identity", "mean_std"])
def test_reward_normalization_options(tmp_path, grouping, method):
    data = _guide_config() | {"reward_norm": None, "reward_normalization": {"grouping": grouping, "method": method}}
    cfg = _load(tmp_path, data)
    assert (cfg.reward_normalization.grouping, cfg.reward_normalization.method) == (grouping, method)


@pytest.mark.parametrize("key, value, message", [
    ("l2", 0.01, "no L2 term"),
    ("kl_penalty", "full", "whole vocabulary"),
    ("kl_loss_type", "full", "whole vocabulary"),
    ("max_steps", -1, "must be >= 1"),
])
def test_values_that_would_change_training_unhonoured_are_refused(tmp_path, key, value, message):
    write(tmp_path / "guide.yaml", _yaml(_guide_config() | {key: value}))
    with pytest.raises(ConfigError, match=message) as e:
        load_config("guide", tmp_path)
    assert e.value.path == key


def test_two_reward_normalisations_are_refused(tmp_path):
    data = _guide_config() | {"reward_normalization": {"grouping": "traj_group_id", "method": "mean_std"}}
    write(tmp_path / "guide.yaml", _yaml(data))  # reward_norm: group is also set
    with pytest.raises(ConfigError, match="two reward normalisations"):
        load_config("guide", tmp_path)


GUIDE = REPO.parent / "shared" / "seeds" / "roll_config_guide.zh.md"
GUIDE_KEYS = REPO / "tests" / "fixtures" / "roll_guide" / "documented_keys.txt"


def _guide_keys_from(text: str) -> set[str]:
    return set(re.findall(r"^\s*-\s*`([a-z_0-9.]+)`", text, flags=re.M))


@pytest.mark.skipif(not GUIDE.is_file(), reason="the seed guide lives beside the checkout only in the project workspace")
def test_the_vendored_key_list_matches_the_guide():
    assert set(GUIDE_KEYS.read_text().split()) == _guide_keys_from(GUIDE.read_text())


def test_this_test_covers_every_key_the_guide_documents():
    """Walk the guide's own key list (vendored) so a key added to it cannot go untested."""
    documented = set(GUIDE_KEYS.read_text().split())
    assert len(documented) > 80  # the whole list, not an empty file
    covered = set(PIPELINE_KEYS) | set(WORKER_KEYS) | set(INFER_KEYS) | set(ENV_MANAGER_KEYS)
    covered |= {f"{section}.{k}" for section in ("model_args", "data_args", "generating_args", "strategy_args", "training_args")
                for k in ("dtype", "disable_gradient_checkpointing", "template", "file_name", "prompt", "messages",
                          "max_new_tokens", "temperature", "strategy_name", "strategy_config",
                          "per_device_train_batch_size", "gradient_accumulation_steps")}
    covered |= {k for sc in STRATEGY_CONFIG_KEYS.values() for k in sc}
    covered |= {"grouping", "method", "env_groups", "n_groups"}
    missing = {k for k in documented if k not in covered and k.split(".")[-1] not in covered}
    assert not missing, f"guide keys without a test: {sorted(missing)}"


def test_docs_match_the_schema():
    docs = (REPO / "docs" / "config.md").read_text()
    assert docs == render_markdown(), "docs/config.md is stale: run `python -m roll.configs.docs > docs/config.md`"
