"""When the pipeline may skip actor_train's old-log-prob forward (only when it is exact)."""

import pytest

from roll.agentic.pipeline import old_logprobs_need_recompute
from roll.configs.loading import load_config


@pytest.mark.parametrize("overrides, rows, reference, expected", [
    ([], 8, False, False),  # the default: 8 rows, one optimizer step of 2 x 4
    ([], 9, False, True),  # a second optimizer step would see updated weights
    (["ppo_epochs=2"], 8, False, True),
    ([], 8, True, True),  # the reference KL needs them before training
    (["enable_old_logprobs_recompute=true"], 8, False, True),
])
def test_the_shortcut_is_taken_only_when_exact(overrides, rows, reference, expected):
    cfg = load_config("agentic_sokoban", overrides=["rollout_batch_size=8", "actor_train.training_args.per_device_train_batch_size=2",
                                                     "actor_train.training_args.gradient_accumulation_steps=4", *overrides]).config
    assert old_logprobs_need_recompute(cfg, rows, reference) is expected


def test_validation_episodes_use_val_sequence_length_when_set():
    from roll.agentic.pipeline import episode_length
    from roll.configs.loading import load_config

    cfg = load_config("agentic_sokoban", overrides=["sequence_length=2048", "+val_sequence_length=512"]).config
    assert (episode_length(cfg, "train"), episode_length(cfg, "val")) == (2048, 512)
    plain = load_config("agentic_sokoban", overrides=["sequence_length=2048"]).config
    assert episode_length(plain, "val") == 2048
