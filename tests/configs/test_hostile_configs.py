"""Configs written to break the loader (issue 29): wrong types, NaN / inf / negative / huge numbers, class paths
of the wrong kind, templates that would blow up when rendered, YAML bombs and deep nesting. Each must stop
--dry_run with exit 2 and one line naming the key (or FILE:LINE:COL), no traceback, in under 5 s."""

import time

import gymnasium as gym
import pytest

from roll.cli import main

HUGE = str(10**89)


class HangingResetEnv(gym.Env):
    """An env whose reset never returns (the start-up env check must not wait for it)."""

    def __init__(self, **_config):
        self.observation_space = self.action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        time.sleep(3600)

# (override, the key the line must name)
NUMBERS = [
    (f"{key}={value}", key)
    for key in ("pg_clip", "pg_clip_low", "pg_clip_high", "init_kl_coef", "kl_loss_coef", "entropy_loss_coef",
                "sft_loss_coef", "rl_loss_coef", "gamma", "lambd", "reward_clip", "advantage_clip", "value_clip",
                "target_kl")
    for value in ("nan", "inf", "-1")
] + [
    ("kl_horizon=0", "kl_horizon"),
    ("gamma=1.5", "gamma"),
    ("lambd=2", "lambd"),
    ("pg_clip_low=1.5", "pg_clip_low"),
    ("train_env_manager.format_penalty=nan", "train_env_manager.format_penalty"),
    ("train_env_manager.format_penalty=0.5", "train_env_manager.format_penalty"),
    ("train_env_manager.max_env_num_per_worker=-1", "train_env_manager.max_env_num_per_worker"),
    ("custom_env.SimpleSokoban.max_env_step_concurrent=-1", "custom_envs.SimpleSokoban.max_env_step_concurrent"),
    ("seed=-1", "seed"),
    ("seed=18446744073709551616", "seed"),
    ("critic_warmup=-1", "critic_warmup"),
    ("max_ckpt_to_keep=-1", "max_ckpt_to_keep"),
    ("actor_train.model_args.lora_dropout=1.5", "actor_train.model_args.lora_dropout"),
    ("actor_train.model_args.lora_dropout=-0.1", "actor_train.model_args.lora_dropout"),
    ("+train_infer_correction.is_weight.upper_bound=-1", "train_infer_correction.is_weight.upper_bound"),
    (f"rollout_batch_size={HUGE}", "rollout_batch_size"),
    (f"max_steps={HUGE}", "max_steps"),
    (f"actor_train.training_args.per_device_train_batch_size={HUGE}", "per_device_train_batch_size"),
    ("actor_train.device_mapping='[1234567890123456789012]'", "actor_train.device_mapping"),
    ("actor_train.training_args.learning_rate=inf", "actor_train.training_args.learning_rate"),
    ("actor_train.training_args.adam_epsilon=0", "actor_train.training_args.adam_epsilon"),
    ("actor_infer.generating_args.top_p=0", "actor_infer.generating_args.top_p"),
    ("actor_infer.generating_args.repetition_penalty=nan", "actor_infer.generating_args.repetition_penalty"),
    ("step_reward_gamma=-0.5", "step_reward_gamma"),
    ("rpc_timeout=nan", "rpc_timeout"),
    ("node_join_timeout=0", "node_join_timeout"),
    ("env_monitor.hung_timeout=-3", "env_monitor.hung_timeout"),
    ("train_env_manager.episode_timeout=inf", "train_env_manager.episode_timeout"),
]

KINDS = [
    ("actor_train.worker_cls=os.system", "actor_train.worker_cls"),
    ("actor_train.worker_cls=subprocess.Popen", "actor_train.worker_cls"),
    ("actor_infer.worker_cls=builtins.exec", "actor_infer.worker_cls"),
    ("train_env_manager.env_manager_cls=builtins.eval", "train_env_manager.env_manager_cls"),
    ("train_env_manager.worker_cls=os.system", "train_env_manager.worker_cls"),
    ("train_env_manager.group_filter_cls=os.system", "train_env_manager.group_filter_cls"),
    ("train_env_manager.group_filter_cls=collections.OrderedDict", "train_env_manager.group_filter_cls"),
    ("actor_train.strategy_args.strategy_name=os.system", "actor_train.strategy_args.strategy_name"),
    ("actor_train.strategy_args.strategy_name=collections.OrderedDict", "actor_train.strategy_args.strategy_name"),
    ("custom_env.SimpleSokoban.env_manager_cls=os.system", "custom_envs.SimpleSokoban.env_manager_cls"),
    ("custom_env.SimpleSokoban.env_type=subprocess:Popen", "custom_envs.SimpleSokoban.env_type"),
    ("custom_env.SimpleSokoban.env_type=os.system", "custom_envs.SimpleSokoban.env_type"),
    ("custom_envs.SimpleSokoban.env_type=builtins.dict", "custom_envs.SimpleSokoban.env_type"),
]

SHAPES = [
    ("actor_infer.strategy_args=hf_infer", "actor_infer.strategy_args"),
    ("actor_train.training_args=3", "actor_train.training_args"),
    ("custom_env.SimpleSokoban=abc", "custom_envs.SimpleSokoban"),
    ("env_monitor=true", "env_monitor"),
    ("custom_env.SimpleSokoban.agent_template='{observation:>99999999999999999999}'",
     "custom_envs.SimpleSokoban.agent_template"),
    ("custom_env.SimpleSokoban.agent_template='{observation!z}'", "custom_envs.SimpleSokoban.agent_template"),
    ("custom_env.SimpleSokoban.agent_template='{observation.__class__}'", "custom_envs.SimpleSokoban.agent_template"),
    ("custom_env.SimpleSokoban.agent_template='{observation[0]}'", "custom_envs.SimpleSokoban.agent_template"),
]

MEANINGS = [
    ("reward_normalization.grouping=traj_grup_id", "reward_normalization.grouping"),
    ("actor_train.model_args.attn_implementation=flash", "actor_train.model_args.attn_implementation"),
    ("actor_infer.generating_args.stop_strings=['']", "actor_infer.generating_args.stop_strings"),
    ("custom_env.SimpleSokoban.env_config.search_depth=1e12", "custom_envs.SimpleSokoban.env_config"),
    ("sokoban_blocked_move_penalty=nan", "custom_envs.SimpleSokoban.env_config"),
    ("grid_cell_separator=_", "custom_envs.SimpleSokoban.env_config"),  # a symbol: the board would not parse back
    ("grid_describe_positions=maybe", "custom_envs.SimpleSokoban.env_config"),
    ("grid_describe_offsets=2", "custom_envs.SimpleSokoban.env_config"),
    ("output_dir=/proc/roll_out", "output_dir"),
]

OVERRIDES = NUMBERS + KINDS + SHAPES + MEANINGS


@pytest.mark.parametrize("override, key", OVERRIDES, ids=[o[0][:50] for o in OVERRIDES])
def test_a_hostile_override_is_one_line_naming_its_key(override, key, capsys):
    start = time.perf_counter()
    assert main(["--config_name", "agentic_sokoban", "--dry_run", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and key in err and "\n" not in err and "Traceback" not in err, err
    assert time.perf_counter() - start < 5


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nexp_name: bomb\n"


# (file text, what the line must say)
FILES = {
    "alias_bomb": (_bomb(), "alias_bomb.yaml:"),
    "deep_flow": ("exp_name: x\nseed: " + "[" * 5000 + "]" * 5000 + "\n", "deep_flow.yaml:"),
    "deep_block": ("exp_name: x\n" + "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
                   "deep_block.yaml:"),
    "scalar": ("just a string\n", "scalar.yaml:1:1: YAML: the top level must be a mapping"),
    "a_list": ("- 1\n- 2\n", "a_list.yaml:1:1: YAML: the top level must be a mapping"),
    "big_string": ("exp_name: '" + "x" * (10 << 20) + "'\n", "big_string.yaml:1:1: YAML: the file has"),
    "many_small_keys": ("".join(f"k{i}: {i}\n" for i in range(30_000)), "many_small_keys.yaml:1:1: YAML: holds more"),
    "many_keys": ("".join(f"key_{i}: {i}\n" for i in range(120_000)), "many_keys.yaml:1:1: YAML: the file has"),
    "nan_seed": ("defaults:\n  - agentic_sokoban\n  - _self_\nseed: .nan\n", "config error: seed: "),
    "huge_int": (f"defaults:\n  - agentic_sokoban\n  - _self_\nrollout_batch_size: {HUGE}\n", "rollout_batch_size"),
    "popen_entry_point": ("defaults:\n  - agentic_sokoban\n  - _self_\ncustom_envs:\n  SimpleSokoban:\n"
                          "    env_type: my_env\n    entry_point: subprocess:Popen\n    max_tokens_per_step: 8\n"
                          "    env_config: {args: [touch, PWNED]}\n", "custom_envs.SimpleSokoban"),
    "hung_reset": ("defaults:\n  - agentic_sokoban\n  - _self_\ntrain_env_manager:\n  env_step_timeout: 1\n"
                   "val_env_manager:\n  env_step_timeout: 1\ncustom_env:\n  SimpleSokoban:\n    env_type: hanging_reset\n"
                   "    entry_point: tests.configs.test_hostile_configs:HangingResetEnv\n",
                   "custom_envs.SimpleSokoban.env_config: env.reset did not return within env_step_timeout=1 s"),
    "bad_section": ("defaults:\n  - agentic_sokoban\n  - _self_\nactor_train: [1, 2]\n", "bad_section: In 'bad_section'"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_hostile_file_is_one_line_naming_it(tmp_path, capsys, name):
    import shutil

    from roll.configs.loading import DEFAULT_CONFIG_DIR

    text, expected = FILES[name]
    shutil.copy(DEFAULT_CONFIG_DIR / "agentic_sokoban.yaml", tmp_path)
    for piece in DEFAULT_CONFIG_DIR.glob("*.yaml"):  # the pieces agentic_sokoban composes
        if not (tmp_path / piece.name).exists():
            shutil.copy(piece, tmp_path)
    (tmp_path / f"{name}.yaml").write_text(text.replace("PWNED", str(tmp_path / "pwned")))
    start = time.perf_counter()
    assert main(["--config_path", str(tmp_path), "--config_name", name, "--dry_run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and expected in err and "\n" not in err, err[:500]
    assert time.perf_counter() - start < 5
    assert not (tmp_path / "pwned").exists()  # nothing a config names was run


def test_the_table_is_at_least_a_hundred_cases():
    assert len(OVERRIDES) + len(FILES) >= 100
