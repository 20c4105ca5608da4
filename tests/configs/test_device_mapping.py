import pytest

from roll.configs.device_mapping import parse_device_mapping
from roll.configs.errors import ConfigError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("list(range(0,8))", list(range(8))),
        ("list(range(0,16,2))", [0, 2, 4, 6, 8, 10, 12, 14]),
        ("list(range(4, 8))", [4, 5, 6, 7]),
        ("range(3)", [0, 1, 2]),
        ("[0,1,2,3]", [0, 1, 2, 3]),
        ("[ 5 ]", [5]),
        ("0,1,2", [0, 1, 2]),
        ("7", [7]),
        ([2, 3], [2, 3]),
        (0, [0]),
    ],
)
def test_accepted_forms(text, expected):
    assert parse_device_mapping(text) == expected


def test_none_means_no_devices():
    assert parse_device_mapping(None) is None


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "list(range(0,8)",
        "list(range(0,8)))",
        "range(0,8,0)",
        "[0, 1, x]",
        "0;1",
        "gpu0",
        "[]",
        "[1, 1]",
        "-1",
        [0, "1"],
        True,
        1.5,
    ],
)
def test_rejected_forms_name_the_key(text):
    with pytest.raises(ConfigError) as err:
        parse_device_mapping(text, "actor_train.device_mapping")
    assert err.value.path == "actor_train.device_mapping"
    assert "actor_train.device_mapping" in str(err.value)
