"""Shared by the learning test and scripts/bench/learning.py: a tiny model learning the digits env."""

from roll.configs.loading import load_config

from .helpers import tiny_overrides


def digits_config(model_path, tmp_path, steps=8, lr=1e-2, *extra):
    return load_config("agentic_sokoban", overrides=digits_overrides(model_path, tmp_path, steps, lr, *extra)).config


def digits_overrides(model_path, tmp_path, steps=8, lr=1e-2, *extra):
    return tiny_overrides(
        model_path, tmp_path,
        f"max_steps={steps}", "eval_steps=0", "save_steps=0", "track_with=stdout", "adv_estimator=grpo",
        "+custom_envs.Digits.env_type=digits", "+custom_envs.Digits.max_steps=1", "+custom_envs.Digits.max_tokens_per_step=8",
        "train_env_manager.tags=[Digits]", "val_env_manager.tags=[Digits]", "train_env_manager.format_penalty=0.0",
        "rollout_batch_size=32", "train_env_manager.num_env_groups=4", "train_env_manager.group_size=8",
        "train_env_manager.num_groups_partition=[4]", "actor_train.training_args.per_device_train_batch_size=8",
        f"actor_train.training_args.learning_rate={lr}", "render_save_dir=null", "whiten_advantages=false",
        "actor_infer.generating_args.temperature=1.0", *extra,
    )
