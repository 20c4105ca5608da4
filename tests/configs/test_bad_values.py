"""Every value with a constrained domain fails --dry_run with exit 2 and a line naming its key
(issue 14, finding 5), in well under the time a worker takes to start."""

import time

import pytest

from roll.cli import main

BAD = [
    ("async_generation_ratio=0.5", "async_generation_ratio"),
    ("async_generation_ratio=-1", "async_generation_ratio"),
    ("actor_infer.generating_args.max_new_tokens=0", "actor_infer.generating_args.max_new_tokens"),
    ("max_tokens_per_step=-5", "max_tokens_per_step"),
    ("custom_env.SimpleSokoban.max_tokens_per_step=-5", "custom_envs.SimpleSokoban.max_tokens_per_step"),
    ("actor_train.infer_batch_size=0", "actor_train.infer_batch_size"),
    ("actor_train.training_args.learning_rate=-1", "actor_train.training_args.learning_rate"),
    ("actor_train.training_args.learning_rate=nan", "actor_train.training_args.learning_rate"),
    ("actor_infer.generating_args.temperature=-1", "actor_infer.generating_args.temperature"),
    ("actor_infer.generating_args.top_p=5", "actor_infer.generating_args.top_p"),
    ("max_grad_norm=inf", "max_grad_norm"),
    ("actor_train.model_update_frequency=0", "actor_train.model_update_frequency"),
    ("rpc_timeout=0", "rpc_timeout"),
    ("exp_name=''", "exp_name"),
    ("output_dir=''", "output_dir"),
    ("pretrain=''", "pretrain"),
    ("pretrain=/nonexistent/model", "model_name_or_path"),
    ("actor_train.worker_cls=nope.module.Cls", "actor_train.worker_cls"),
    ("actor_train.strategy_args.strategy_name=nope.Strategy", "actor_train.strategy_args.strategy_name"),
    ("resume_from_checkpoint=/nonexistent/ckpt", "resume_from_checkpoint"),
    ("resume_from_checkpoint='1'", "resume_from_checkpoint"),
    ("custom_env.SimpleSokoban.env_type=nope_env", "custom_envs.SimpleSokoban.env_type"),
    ("custom_env.SimpleSokoban.env_manager_cls=nope.Manager", "custom_envs.SimpleSokoban.env_manager_cls"),
    ("action_pattern='(['", "custom_envs.SimpleSokoban.env_config.action_pattern"),
    ("custom_env.SimpleSokoban.env_config.dim_room=[0,0]", "custom_envs.SimpleSokoban.env_config"),
    ("custom_env.SimpleSokoban.max_steps=-3", "custom_envs.SimpleSokoban.max_steps"),
    ("custom_env.SimpleSokoban.env_config.format_penalty=abc", "custom_envs.SimpleSokoban.env_config"),
    ("custom_env.SimpleSokoban.agent_template='{nope_placeholder}'", "custom_envs.SimpleSokoban.agent_template"),
    ("custom_env.SimpleSokoban.env_config.num_boxes=1000", "custom_envs.SimpleSokoban.env_config"),
    ("train_env_manager.env_step_timeout=-1", "train_env_manager.env_step_timeout"),
    ("train_env_manager.min_healthy_share=2", "train_env_manager.min_healthy_share"),
    ("actor_train.training_args.adam_beta2=1.5", "actor_train.training_args.adam_beta2"),
    ("actor_train.training_args.warmup_steps=-1", "actor_train.training_args.warmup_steps"),
    ("actor_infer.generating_args.top_k=-7", "actor_infer.generating_args.top_k"),
    ("num_demonstrations=-1", "custom_envs.SimpleSokoban.num_demonstrations"),
]


@pytest.mark.parametrize("override, key", BAD, ids=[b[0][:40] for b in BAD])
def test_a_bad_value_fails_dry_run_with_its_key(override, key, capsys):
    start = time.perf_counter()
    assert main(["--config_name", "agentic_sokoban", "--dry_run", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and key in err and "\n" not in err, err
    assert time.perf_counter() - start < 5


def test_an_output_dir_that_cannot_be_written_fails_dry_run(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["--config_name", "agentic_sokoban", "--dry_run", f"output_dir={blocker}/run"]) == 2
    assert "config error: output_dir" in capsys.readouterr().err


def test_the_default_config_passes_every_check(capsys):
    assert main(["--config_name", "agentic_sokoban", "--dry_run"]) == 0


def test_a_device_range_of_a_hundred_million_fails_at_once(capsys):
    start = time.perf_counter()
    assert main(["--config_name", "agentic_sokoban", "--dry_run", "actor_train.device_mapping='list(range(0,100000000))'"]) == 2
    assert "actor_train.device_mapping" in capsys.readouterr().err and time.perf_counter() - start < 5


def test_devices_beyond_this_machines_gpus_fail_dry_run(monkeypatch, capsys):
    """On a GPU machine, a mapping that names more GPUs than it has stops at load (Ray would wait 10 minutes
    for a placement group it cannot get)."""
    import torch

    import roll.preflight

    monkeypatch.setattr(roll.preflight, "gpu_driver", lambda: True)  # a GPU machine: the driver, then torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    status = main(["--config_name", "agentic_sokoban", "--dry_run", "num_gpus_per_node=8", "actor_infer.device_mapping=[2]"])
    err = capsys.readouterr().err
    assert status == 2 and "actor_infer.device_mapping" in err and "at most 2 GPU(s)" in err, err
    assert main(["--config_name", "agentic_sokoban", "--dry_run", "num_gpus_per_node=8", "actor_infer.device_mapping=[1]"]) == 0


@pytest.mark.parametrize("mappings, per_node, nodes, words", [
    ({"actor_train": [0, 1, 2, 3]}, 4, [4], None),
    ({"actor_train": [0, 1, 2, 3], "actor_infer": [4, 5]}, 4, [4, 2], None),  # node 1 uses 2 GPUs: fits a 2-GPU node
    ({"actor_train": [0, 1, 2, 3], "actor_infer": [4, 5]}, 4, [4], "uses 2 node(s)"),
    ({"actor_infer": [7]}, 8, [4], "device 7 is GPU 7"),
    ({"actor_train": [0], "actor_infer": [4, 5, 6]}, 4, [2, 4], None),  # the 3-GPU node on the 4-GPU machine
    ({"actor_train": [0, 1, 2], "actor_infer": [4, 5, 6]}, 4, [4, 2], "is GPU 2 of a node"),
    ({"actor_train": [0, 1]}, 8, [0], "at most 0 GPU(s)"),
])
def test_device_mappings_are_bounded_by_the_cluster(mappings, per_node, nodes, words):
    from roll.configs.errors import ConfigError
    from roll.distributed.resources import check_devices_fit

    if words is None:
        check_devices_fit(mappings, per_node, nodes)
        return
    with pytest.raises(ConfigError, match="device_mapping") as e:
        check_devices_fit(mappings, per_node, nodes)
    assert words in str(e.value)
