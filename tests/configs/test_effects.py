"""No key is silently ignored: a key without effect in the run, set to a non-default value, is named in
the one warning the loader prints; keys set to their defaults warn about nothing."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from roll.cli import main
from roll.configs import schema
from roll.configs.loading import load_config

from .conftest import MINIMAL, REPO, write


def load(tmp_path: Path, extra: str = "", overrides: tuple[str, ...] = ()):
    write(tmp_path / "cfg.yaml", MINIMAL + extra)
    return load_config("cfg", tmp_path, overrides)


def _other_value(f: dataclasses.Field, tp) -> object:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for arg in (tp, *typing.get_args(tp)):
        if arg is bool:
            return not default
        if arg is int:
            return (default or 0) + 1
        if arg is float:
            return (default or 0.0) + 1.0
        if arg is str:
            return "qwen2_5"
        if typing.get_origin(arg) is dict:
            return {"type": "file_system"}
    raise AssertionError(f"no test value for {f.name}: {tp}")


def _inert_fields(cls) -> list[tuple[dataclasses.Field, object]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if "inert" in f.metadata]


def test_defaults_warn_about_nothing(tmp_path):
    assert load(tmp_path).inert == {}


@pytest.mark.parametrize("prefix, cls", [("", schema.PipelineConfig), ("actor_train.data_args.", schema.DataArgs),
                                         ("actor_train.training_args.", schema.TrainingArgs),
                                         ("actor_infer.generating_args.", schema.GeneratingArgs)])
def test_every_key_marked_without_effect_warns_when_set(tmp_path, prefix, cls):
    fields = _inert_fields(cls)
    assert fields or cls is schema.TrainingArgs
    for f, tp in fields:
        value = _other_value(f, tp)
        override = f"{prefix}{f.name}={value!r}" if not isinstance(value, dict) else f"{prefix}{f.name}={{type:file_system}}"
        loaded = load(tmp_path, overrides=(override.replace("'", ""),))
        assert f"{prefix}{f.name}" in loaded.inert, f"{prefix}{f.name} was set and not reported"
        assert loaded.inert[f"{prefix}{f.name}"] == f.metadata["inert"]


@pytest.mark.parametrize("extra, key, why", [
    ("critic:\n  strategy_args:\n    strategy_name: deepspeed_train\n  device_mapping: '[0]'\n", "critic",
     "only adv_estimator gae"),
    ("reference:\n  device_mapping: '[0]'\n", "reference", "no KL term"),
    ("reward:\n  device_mapping: '[0]'\n", "reward", "rewards come from the envs"),
    ("prompt_length: 512\n", "prompt_length", "sequence_length is set"),
    ("response_length: 512\n", "response_length", "sequence_length is set"),
])
def test_sections_and_keys_this_run_does_not_use_warn(tmp_path, extra, key, why):
    loaded = load(tmp_path, extra)
    assert key in loaded.inert and why in loaded.inert[key]


def test_examples_per_episode_without_examples_warn(tmp_path):
    key = "custom_envs.SimpleSokoban.demonstrations_per_episode"
    assert "no examples to draw" in load(tmp_path, overrides=(f"+{key}=true",)).inert[key]
    assert key not in load(tmp_path, overrides=(f"+{key}=true", "+custom_envs.SimpleSokoban.num_demonstrations=2")).inert


@pytest.mark.parametrize("override, key", [
    ("actor_train.generating_args.temperature=0.5", "actor_train.generating_args.temperature"),
    ("actor_infer.training_args.learning_rate=0.1", "actor_infer.training_args.learning_rate"),
    ("actor_infer.model_update_frequency=2", "actor_infer.model_update_frequency"),
    ("actor_infer.model_args.disable_gradient_checkpointing=true", "actor_infer.model_args.disable_gradient_checkpointing"),
])
def test_role_keys_the_role_does_not_read_warn(tmp_path, override, key):
    loaded = load(tmp_path, overrides=(override,))
    assert key in loaded.inert and "does not read it" in loaded.inert[key]


def test_the_warning_is_one_line_naming_each_key(tmp_path, capsys):
    write(tmp_path / "cfg.yaml", MINIMAL + "generate_opt_level: 0\ncheckpoint_config:\n  type: file_system\n")
    assert main(["--config_path", str(tmp_path), "--config_name", "cfg", "--dry_run"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1
    assert "generate_opt_level (" in lines[0] and "checkpoint_config (" in lines[0]


# modules that only define, load, document or check keys: a key read only there does nothing
_NOT_READERS = {f"configs/{name}" for name in ("schema.py", "docs.py", "build.py", "loading.py", "effects.py",
                                               "roll_compat.py", "errors.py")}


def test_every_key_is_read_somewhere_or_marked_without_effect():
    """A static guard against a key that is documented as wired but read nowhere."""
    sources = "\n".join(p.read_text() for p in (REPO / "roll").rglob("*.py")
                        if p.relative_to(REPO / "roll").as_posix() not in _NOT_READERS)
    sources += "\n".join(p.read_text() for p in (REPO / "envs").rglob("*.py"))
    classes = [schema.PipelineConfig, schema.WorkerConfig, schema.ModelArgs, schema.TrainingArgs, schema.DataArgs,
               schema.GeneratingArgs, schema.StrategyArgs, schema.EnvManagerConfig, schema.CustomEnvConfig,
               schema.RewardNormalizationConfig, schema.TrainInferISWeight, schema.TrainInferFilter,
               schema.TrainInferCorrection, schema.RolloutMock]
    unread = [f"{cls.__name__}.{f.name}" for cls in classes for f in dataclasses.fields(cls)
              if "inert" not in f.metadata and not re.search(rf"(\.{f.name}\b|[\"']{f.name}[\"'])", sources)]
    assert unread == []
