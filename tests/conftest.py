"""Shared fixtures: a tiny random-init model with a locally trained tokenizer, built once."""

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model")))
